"""The decision log: one JSON line per decision, feedback and alarm of a running monitor.

The contract: **a request is answered only once its record is in the log, written and synced to
disk.** So that a log that cannot take records never costs an expert call for a request that is
then refused, the space for a record is reserved before the expert is asked (`reserve`): blocks
are allocated past the end of the file (Linux fallocate with FALLOC_FL_KEEP_SIZE, so the file
still reads as plain JSONL), and the process's file-size limit is checked. A full disk is then a
refusal (`LogUnavailable`, a 503) before anything is paid. A write that fails anyway (an I/O
error) is cut back to the end of the last whole record, so no torn line is left to swallow the
next record; a torn tail found when the log is opened (a crash mid-write) is cut off and kept in
PATH.torn. Records are written by one writer that syncs once per group of records (group commit).
`reopen` (SIGHUP) goes on in a new file at the same path after a rotation renamed the old one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import json
import logging
import os
import resource
import time
from pathlib import Path
from typing import Any

from .._errors import InputError
from ._errors import LogUnavailable

__all__ = ["RECORD_BYTES", "DecisionLog", "record_bound"]

log = logging.getLogger("ctd.monitor")
RECORD_BYTES = 2048  # a decision record without its text is about 400 bytes: room to spare
RESERVE_CHUNK = 1 << 20  # blocks are reserved a MiB at a time
FALLOC_FL_KEEP_SIZE = 1
_Queued = tuple[bytes, asyncio.Future[None]]  # a record's line, and its writer's answer to it


def record_bound(text: object | None) -> int:
    """Bytes a record may take at most: RECORD_BYTES, plus 6 bytes per character of the text when
    it is logged (a control character is written as a 6-byte escape, any other as at most 4)."""
    if text is None:
        return RECORD_BYTES
    return RECORD_BYTES + 6 * len(json.dumps(text, ensure_ascii=False))


def _line(record: dict[str, Any]) -> bytes:
    return (json.dumps({"time": round(time.time(), 3), **record}, ensure_ascii=False) + "\n").encode()


def _fallocate(fd: int, offset: int, length: int) -> None:
    """Reserve blocks for [offset, offset + length) without changing the file's size; OSError
    when there is no room (ENOSPC) or the system cannot (EOPNOTSUPP, ENOSYS)."""
    try:
        function = ctypes.CDLL(None, use_errno=True).fallocate
    except (AttributeError, OSError):
        raise OSError(errno.ENOSYS, "fallocate is not available") from None
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    if function(fd, FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


class DecisionLog:
    """Append-only JSONL (see the module docstring for the contract). `text=True` also logs each
    conversation's text. `healthy` is False from a failed reservation or write until one succeeds;
    `problem` says what failed, in one line."""

    def __init__(self, path: Path, *, text: bool = False) -> None:
        self.path = Path(path)
        self.text = text
        if self.path.is_dir():
            raise IsADirectoryError(errno.EISDIR, "is a folder, not a log file", str(self.path))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd, self._end = self._open()  # _end: the end of the last whole record
        self._reserved_to = self._end  # blocks are allocated up to here
        self._promised = 0  # bytes reserved for records not yet written
        self._can_reserve = True  # False where fallocate is not supported: statvfs is the check
        self._queue: list[_Queued] = []
        self._writer: asyncio.Task[None] | None = None
        self._reopen = False  # asked to go on in a new file at `path` (see `reopen`)
        self.healthy = True
        self.problem: str | None = None
        self._failed_writing = False
        self.records = 0  # written since the log was opened
        self.failures = 0  # records refused or lost to a failed write

    def _open(self) -> tuple[int, int]:
        """The file at `path` opened, locked and recovered: (its descriptor, the end of its last
        whole record). Nothing stays open, or locked, when any of it fails."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            try:  # one writer: another's records would be cut by this one's recovery and close
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise InputError(
                    f"{self.path}: another monitor is writing this decision log; "
                    "give each replica its own --log"
                ) from None
            return fd, self._recover(fd)
        except BaseException:
            os.close(fd)
            raise

    def last_decisions(self, count: int) -> list[dict[str, Any]]:
        """The last `count` decision records of the log as it was opened, oldest first, read back
        from the end a block at a time (a long log is not read whole). A line that is not a JSON
        object is skipped: the recovery cut any torn tail, and what was written is the log's own."""
        found: list[dict[str, Any]] = []
        block, end, tail = 1 << 16, self._end, b""
        while end > 0 and len(found) < count:
            start = max(0, end - block)
            chunk = os.pread(self._fd, end - start, start) + tail
            lines = chunk.split(b"\n")
            tail = lines.pop(0) if start > 0 else b""  # maybe cut: completed by the next block
            for line in reversed(lines):
                if len(found) == count:
                    break
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and record.get("event") == "decision":
                    found.append(record)
            end = start
        return found[::-1]

    def reopen(self) -> None:
        """Go on in a new file at `path` after the write in progress (if any): once the log was
        renamed away (logrotate's default; SIGHUP asks for it), the old file is closed whole and
        the next record starts the new one. Nothing happens while `path` is still this file."""
        self._reopen = True
        self._wake_writer()

    def _switch(self) -> None:
        """Between two groups of records (no write in flight, and on the event loop, so that no
        reservation runs meanwhile): open the new file, carry the space reserved for records not
        yet written over to it, and close the old one. A new file that cannot be opened leaves
        the log where it was, said in the process log."""
        if self._fd < 0:
            return  # closed meanwhile
        try:
            same = os.path.samestat(os.stat(self.path), os.fstat(self._fd))
        except OSError:  # gone (renamed away), or not to be looked at: try a new file
            same = False
        if same:
            log.warning("%s: asked to reopen it, but it was not renamed away; still writing to it", self.path)
            return
        try:
            fd, end = self._open()
        except (OSError, InputError) as error:
            log.error("%s: could not start a new log (%s); still writing to the old file", self.path, error)
            return
        old_fd, old_end = self._fd, self._end
        self._fd, self._end, self._reserved_to = fd, end, end
        self._reserve_again()
        self._close_fd(old_fd, old_end)
        log.warning("%s: reopened; the records before are in the file it was renamed to", self.path)

    def _reserve_again(self) -> None:
        """Reserve anew the bytes promised to records not yet written, whose blocks are gone (a new
        file, or a file cut short under the writer). A refusal marks the log unhealthy: the next
        request is refused before its expert is paid."""
        promised, failures, self._promised = self._promised, self.failures, 0
        try:
            self.reserve(promised)
        except LogUnavailable as error:
            log.error("%s: %s", self.path, error)
        finally:
            self._promised, self.failures = promised, failures  # no record was refused by this

    def _recover(self, fd: int) -> int:
        """Cut a torn last line (no newline: a crash mid-write) and keep its bytes in PATH.torn;
        returns the end of the last whole record."""
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        tail_start = max(0, size - RESERVE_CHUNK)
        while True:
            tail = os.pread(fd, size - tail_start, tail_start)
            newline = tail.rfind(b"\n")
            if newline >= 0 or tail_start == 0:
                break
            tail_start = max(0, tail_start - RESERVE_CHUNK)
        end = tail_start + newline + 1  # 0 when the file holds no newline at all
        if end < size:
            torn = self.path.with_name(self.path.name + ".torn")
            with torn.open("ab") as handle:
                handle.write(tail[newline + 1 :] + b"\n")
            os.ftruncate(fd, end)
            log.warning(
                "%s: cut a torn last record of %d bytes (kept in %s)", self.path, size - end, torn.name
            )
        return end

    def _fail(self, error: OSError, what: str) -> None:
        self.healthy = False
        self.problem = f"{self.path.name}: {what}: {error.strerror or error}"
        self._failed_writing = what == "cannot write"

    def _ok(self, *, wrote: bool) -> None:
        """A success clears a failure of its own kind (a reservation does not vouch for writes)."""
        if wrote or not self._failed_writing:
            self.healthy, self.problem, self._failed_writing = True, None, False

    def reserve(self, nbytes: int) -> None:
        """Make sure a record of up to `nbytes` can be written, or raise LogUnavailable; release
        it with `write` (or `release` when the request ends without a record)."""
        self._reserved_to = max(self._reserved_to, self._end)  # written blocks are allocated
        need = self._end + self._promised + nbytes
        limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        if limit != resource.RLIM_INFINITY and need > limit:
            self._fail(OSError(errno.EFBIG, "the file-size limit (ulimit -f) is reached"), "cannot grow")
            raise LogUnavailable(f"decision log full: {self.problem}", retry_after=30)
        if need > self._reserved_to:
            grow = need - self._reserved_to
            try:
                if not self._can_reserve:
                    self._check_free(grow)
                else:
                    try:  # a MiB ahead, so that most records reserve nothing
                        _fallocate(self._fd, self._reserved_to, max(grow, RESERVE_CHUNK))
                        grow = max(grow, RESERVE_CHUNK)
                    except OSError as error:
                        if error.errno != errno.ENOSPC:
                            raise
                        _fallocate(self._fd, self._reserved_to, grow)  # just what this record needs
            except OSError as error:
                if error.errno in (errno.EOPNOTSUPP, errno.ENOSYS) and self._can_reserve:
                    self._can_reserve = False  # this file system cannot: fall back to free space
                    return self.reserve(nbytes)
                self._fail(error, "cannot reserve space")
                self.failures += 1
                raise LogUnavailable(f"decision log unavailable: {self.problem}", retry_after=30) from None
            self._reserved_to += grow
        self._promised += nbytes
        self._ok(wrote=False)
        return None

    def recheck(self) -> bool:
        """Whether the log can take a record now, tried rather than remembered (a health check
        calls it: a replica taken out of service must come back once space does)."""
        if self.healthy:
            return True
        try:
            self.reserve(RECORD_BYTES)
        except LogUnavailable:
            return False
        self.release(RECORD_BYTES)
        if self._failed_writing:
            try:
                os.fdatasync(self._fd)
            except OSError:
                return False
            self._ok(wrote=True)
        return self.healthy

    def _check_free(self, nbytes: int) -> None:
        stat = os.statvfs(self.path.parent)
        if stat.f_bavail * stat.f_frsize < nbytes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def release(self, nbytes: int) -> None:
        self._promised = max(0, self._promised - nbytes)

    async def write(self, record: dict[str, Any], *, reserved: int = 0) -> None:
        """Append `record` and return once it is on disk; LogUnavailable when it could not be
        written (nothing of it is left in the file then)."""
        try:
            line = _line(record)
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._queue.append((line, future))
            self._wake_writer()
            await asyncio.shield(future)
        finally:
            self.release(reserved)

    def _wake_writer(self) -> None:
        """Start the writer task unless it is running (it drains the queue and any reopen asked)."""
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._drain(), name="decision-log")

    async def _drain(self) -> None:
        """Write what is queued, a group at a time, each group synced once (and switch files
        between two groups when `reopen` asked)."""
        group: list[_Queued] = []
        try:
            while self._queue or self._reopen:
                if self._reopen:
                    self._reopen = False
                    self._switch()
                    continue
                group, self._queue = self._queue, []
                data = b"".join(line for line, _ in group)
                try:
                    start, end = await self._appended(data, group)
                except OSError as error:
                    # Cutting the file back frees the blocks reserved past its end (ext4, XFS):
                    # what was reserved must be reserved again before another expert is paid.
                    self._reserved_to = self._end
                    self._fail(error, "cannot write")
                    self.failures += len(group)
                    refusal = LogUnavailable(f"decision log unavailable: {self.problem}", retry_after=30)
                    for _, future in group:
                        if not future.done():
                            future.set_exception(refusal)
                    continue
                self._written(group, start, end)
        except BaseException as error:  # nothing unforeseen may leave a request waiting for ever
            if not isinstance(error, asyncio.CancelledError):
                log.exception("%s: the decision log's writer failed", self.path)
            refusal = LogUnavailable(f"decision log unavailable: {error!r}", retry_after=30)
            for _, future in [*group, *self._queue]:
                if not future.done():
                    future.set_exception(refusal)
            self._queue = []
            raise

    async def _appended(self, data: bytes, group: list[_Queued]) -> tuple[int, int]:
        """`_append` in a thread. Cancelled meanwhile, it still waits for the thread (no second
        writer may start, and no close may come, while it writes) and answers the group by what
        the write did before the cancellation goes on."""
        append = asyncio.ensure_future(asyncio.to_thread(self._append, data))
        try:
            return await asyncio.shield(append)
        except asyncio.CancelledError:
            await asyncio.wait([append])
            if not append.cancelled() and append.exception() is None:
                self._written(group, *append.result())  # on disk: those requests are answered
            elif not append.cancelled() and isinstance(append.exception(), OSError):
                self._reserved_to = self._end  # cut back, as in `_drain`: reserve again
            raise

    def _written(self, group: list[_Queued], start: int, end: int) -> None:
        """Keep the new end and answer a group that is on disk."""
        cut = start < self._end  # another program cut the file short (copytruncate)
        self._end = end
        self._ok(wrote=True)
        if cut:  # the blocks reserved past its old end went with the cut (a refusal: unhealthy)
            self._reserved_to = end
            self._reserve_again()
        self.records += len(group)
        for _, future in group:
            if not future.done():
                future.set_result(None)

    def _append(self, data: bytes) -> tuple[int, int]:
        """All of `data` at the end of the file and synced, or none of it (cut back on error);
        returns where it starts and ends (the caller keeps them, on its own thread). Both are read
        from the file's offset, not from the end kept: another program may have cut the log short
        (logrotate's copytruncate), and a cut back to the kept end would pad it with zeros."""
        fd = self._fd
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]  # O_APPEND: at the file's end, wherever it is now
            os.fdatasync(fd)
        except OSError:
            try:  # no torn line: the next record starts clean
                os.ftruncate(fd, min(start, os.fstat(fd).st_size))
            except OSError as cut:
                log.error("%s: could not cut a failed write back (%s)", self.path, cut.strerror)
            raise
        end = os.lseek(fd, 0, os.SEEK_CUR)  # after an append: the end of what it wrote
        return end - len(data), end

    def write_sync(self, record: dict[str, Any]) -> None:
        """Append one record from synchronous code (tests, tools); the same all-or-nothing write."""
        try:
            self._end = self._append(_line(record))[1]
        except OSError:
            self._reserved_to = self._end
            raise

    async def aclose(self) -> None:
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            self._close_fd(self._fd, self._end)
            self._fd = -1

    @staticmethod
    def _close_fd(fd: int, end: int) -> None:
        with contextlib.suppress(OSError):  # give back the blocks reserved past the end
            # Never longer than it is: a log cut short by another program (logrotate's
            # copytruncate) must not grow back to `end` with zero bytes.
            os.ftruncate(fd, min(end, os.fstat(fd).st_size))
        with contextlib.suppress(OSError):
            os.close(fd)
