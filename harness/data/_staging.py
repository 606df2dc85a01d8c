"""Hidden staging folders that a killed writer does not leave behind for good.

A writer builds its output in `PARENT/PREFIXxxxxxxxx/` and renames it, or the files in it, into
place. A writer killed outright (SIGKILL, the OOM killer, a lost node) cannot remove that folder,
and at scale it holds gigabytes (a sweep's decisions). So each staging folder is held under an
exclusive flock(2) for as long as its writer lives; the kernel drops the lock when the process
dies, however it dies. The next writer with the same prefix removes every folder whose lock it
can take, and none that a live writer holds. Creating (folder, then lock) and clearing happen
under a lock on the parent, so a cleaner never sees a new folder before its lock is taken.

Where the file system takes no flock on a folder (NFS turns flock into a byte-range lock on a file
open for writing; Lustre without `-o flock` refuses it), staging goes on without locks, and
nothing is cleared there. Locks of an NFS mount with `local_lock=flock` are seen on their own
machine only, so writers on two machines must not share an output folder (they would overwrite
each other's results anyway).

On exit a writer removes its folder only if the path still holds that folder: one renamed into
place is not looked for, and one swapped for another (a monitor bundle exchanged with the one it
replaces, under `cleaning_lock`) leaves the other where it is.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path

from .._errors import named
from ._tables import _umask

__all__ = ["cleaning_lock", "exchange_folders", "folder_writer", "staging_folder"]

# What flock on a folder fails with where the file system cannot lock one.
_NO_LOCKS = frozenset({errno.EBADF, errno.ENOLCK, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP})


@contextmanager
def staging_folder(parent: Path, prefix: str, *, marker: str | None = None) -> Iterator[Path]:
    """Yield a new empty folder `parent/PREFIX*` (mode as a plain mkdir's), held for this process;
    remove folders of the same prefix left by dead writers first, and this one on exit if its path
    still holds it. With `marker`, the folder starts with an empty file of that name, and a dead
    writer's folder is removed only while it holds one: a writer that hands its folder's path to
    something else (the bundle an exchange swapped out) removes the marker first."""
    parent = Path(parent)
    held: int | None = None
    made: tuple[int, int] | None = None  # (st_dev, st_ino) of the folder this call made
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with _locked(parent) as can_lock:
            if can_lock:
                _remove_abandoned(parent, prefix, marker)
            folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            try:
                held = _lock(folder) if can_lock else None
                os.chmod(folder, 0o777 & ~_umask())  # mkdtemp makes it owner-only
                made = _identity(folder)
                if marker is not None:
                    (folder / marker).touch()
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                if held is not None:
                    os.close(held)
                raise
    except OSError as exc:  # name the folder the user knows, not a temporary's random name
        temporary = exc.filename if exc.filename and Path(exc.filename).name.startswith(prefix) else None
        raise named(exc, parent, unless_named=temporary) from None
    try:
        yield folder
    finally:
        with suppress(OSError):  # gone: renamed into place
            if _identity(folder) == made:
                shutil.rmtree(folder, ignore_errors=True)
        if held is not None:
            os.close(held)  # after the removal: no cleaner may take a folder still being removed


@contextmanager
def cleaning_lock(parent: Path) -> Iterator[None]:
    """Hold the lock under which `staging_folder` makes and clears folders in `parent`: no writer
    clears a folder there meanwhile. For a step that briefly leaves something a cleaner must not
    take at a staging folder's path (an exchange of two folders, then a rename)."""
    with _locked(Path(parent)):
        yield


def folder_writer(folder: Path) -> AbstractContextManager[bool]:
    """Hold `folder`'s lock for the block, as its one writer: BlockingIOError at once when another
    process holds it (it is not waited for). Yields False (and holds nothing) where the file
    system takes no lock on a folder."""
    return _locked(Path(folder), wait=False)


def _identity(folder: Path) -> tuple[int, int]:
    status = os.stat(folder, follow_symlinks=False)
    return status.st_dev, status.st_ino


@contextmanager
def _locked(folder: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold `folder`'s lock for the block (waiting for it, or BlockingIOError without `wait`);
    yields False (and holds nothing) where the file system takes no lock on a folder."""
    fd = _lock(folder, wait=wait)
    try:
        yield fd is not None
    finally:
        if fd is not None:
            os.close(fd)


def _lock(folder: Path, *, wait: bool = False) -> int | None:
    """An open descriptor of `folder` holding its exclusive flock, or None where the file system
    cannot lock a folder. Without `wait`, a lock held elsewhere raises BlockingIOError."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if isinstance(error, BlockingIOError) or error.errno not in _NO_LOCKS:
            raise
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove_abandoned(parent: Path, prefix: str, marker: str | None) -> None:
    for folder in parent.glob(f"{prefix}*"):
        if folder.is_symlink() or not folder.is_dir():
            continue
        if marker is not None and not (folder / marker).is_file():
            continue
        try:
            fd = _lock(folder)
        except OSError:  # a live writer's (BlockingIOError), gone meanwhile, or not ours to open
            continue
        if fd is None:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        os.close(fd)


def exchange_folders(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 with RENAME_EXCHANGE); False where the system or
    the file system cannot, so the caller falls back to two renames."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))
