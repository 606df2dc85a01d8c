"""Functions run in worker processes while the caller goes on: the report's figures, an export's
logs. Each is CPU-bound Python (matplotlib, inspect_ai's writer), so threads would not overlap it.

`WorkerPool.submit` pickles a call at once and one of a few worker processes runs it (`python -m
harness._worker`: a fresh interpreter, so no lock of another thread is inherited as a fork would,
and no user script is run again as multiprocessing's spawn does with a script's main module).
`wait` is the one place the caller waits for the calls and raises the first one's error; `close`,
on an error or an interrupt, drops the calls not started and kills the workers before it returns,
so none writes into a staging folder after it is removed. The workers run in their own session:
Ctrl-C is the caller's to handle.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

__all__ = ["MAX_WORKERS", "WorkerError", "WorkerPool", "read_message", "write_message"]

MAX_WORKERS = 8  # each holds one call's data: a figure, or a part of an export (0.3 GB)
_LENGTH = struct.Struct("<Q")  # each message: its length, then its pickle


class WorkerError(RuntimeError):
    """A call failed in its worker (the worker's traceback is the message), or a worker died.
    A call that fails with an OSError, MemoryError or InputError raises that error itself at
    `wait` (the worker's traceback as its note), so that the command line says it in one line."""


def write_message(stream: IO[bytes], payload: bytes) -> None:
    stream.write(_LENGTH.pack(len(payload)) + payload)
    stream.flush()


def read_message(stream: IO[bytes]) -> bytes | None:
    """The next message, or None at the end of the stream."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(head)
    payload = stream.read(length)
    return payload if len(payload) == length else None


def _workers() -> int:
    """One process per CPU this process may run on (its affinity, not a CPU quota), 1 to
    MAX_WORKERS: the caller mostly waits for them."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cpus))


def _exit_code(process: subprocess.Popen[bytes]) -> int | None:
    """The code of a worker whose answers ended (it is exiting), or None if it lingers."""
    try:
        return process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return None


@dataclass
class _Worker:
    process: subprocess.Popen[bytes]
    answers: IO[bytes]  # the reading end of the worker's answer pipe
    thread: threading.Thread | None = None  # hands it calls


class WorkerPool:
    """Module-level functions run in worker processes, started with the first call.

    `preload`: modules each worker imports before its first call (matplotlib for figures, so
    that the first figure does not pay for it alone). `workers`: at most this many processes
    (default one per CPU, up to MAX_WORKERS). `stop_on_error`: after a call fails, the calls
    not yet started are skipped (the report draws every figure it can; an export stops).
    `done`: called (in a feeding thread) after each call that succeeds, for progress."""

    def __init__(
        self,
        preload: tuple[str, ...] = (),
        *,
        workers: int | None = None,
        stop_on_error: bool = False,
        done: Callable[[], None] | None = None,
    ) -> None:
        if isinstance(preload, str):  # a str would be read as one module per character
            raise TypeError("preload is a tuple of module names")
        self.preload = preload
        self.workers = workers
        self.stop_on_error = stop_on_error
        self.done = done
        self._jobs: queue.Queue[bytes | None] = queue.Queue()
        self._workers: list[_Worker] = []
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the workers now, if they are not running, rather than with the first call: their
        `preload` import then overlaps the caller's work before it (the report's matplotlib, while
        `ctd eval` calibrates)."""
        if not self._workers:
            self._start()

    def submit(self, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        """Run `function(*args, **kwargs)` (a module-level function: it is pickled by name) in a
        worker; what it returns is dropped. The call is pickled here, so the caller may change
        its arguments after."""
        call = pickle.dumps((function, args, kwargs))
        self.start()
        self._jobs.put(call)

    def wait(self) -> None:
        """Wait for every call submitted so far, then stop the workers; raises the first error."""
        try:
            for _ in self._workers:
                self._jobs.put(None)  # each worker's thread stops at one, after the calls queued
            for worker in self._workers:
                assert worker.thread is not None
                worker.thread.join()
        except BaseException:  # an interrupt while waiting: the calls left are not wanted
            self.close()
            raise
        errors = self._errors
        self._stop(kill=False)
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Stop at once, on an error or an interrupt: drop the calls not started and kill the
        workers, waiting until they are gone (a call cut short must write under a temporary name,
        as `atomic_path` does, to leave nothing behind that looks whole)."""
        while True:
            try:
                self._jobs.get_nowait()
            except queue.Empty:
                break
        self._stop(kill=True)

    def _stop(self, *, kill: bool) -> None:
        for _ in self._workers:
            self._jobs.put(None)  # wakes a thread waiting for a call
        for worker in self._workers:
            if kill:
                worker.process.kill()
            if worker.process.stdin is not None:
                with contextlib.suppress(OSError):  # a killed worker's pipe is broken
                    worker.process.stdin.close()  # a worker ends at the end of its input
            worker.process.wait()
            if worker.thread is not None:
                worker.thread.join()  # a stop, or its worker gone: it returns
            worker.answers.close()
        self._workers, self._errors = [], []
        self._jobs = queue.Queue()  # no call or stop left for the next workers

    def _start(self) -> None:
        # The parent's import path, so the worker finds this package however the parent found it
        # (installed, or a notebook's sys.path).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        for _ in range(min(_workers(), self.workers or MAX_WORKERS)):
            read_end, write_end = os.pipe()
            try:
                process = subprocess.Popen(
                    [sys.executable, "-m", "harness._worker", str(write_end), *self.preload],
                    stdin=subprocess.PIPE,
                    stdout=sys.__stderr__.fileno() if sys.__stderr__ else subprocess.DEVNULL,
                    pass_fds=(write_end,),  # answers apart from anything a module prints
                    start_new_session=True,  # Ctrl-C is the parent's to handle, not each worker's
                    env=env,
                )
            except BaseException:
                os.close(read_end)
                raise
            finally:
                os.close(write_end)
            worker = _Worker(process, os.fdopen(read_end, "rb"))
            worker.thread = threading.Thread(
                target=self._feed, args=(worker,), name="ctd-workers", daemon=True
            )
            worker.thread.start()
            self._workers.append(worker)

    def _feed(self, worker: _Worker) -> None:
        """Hand `worker` one queued call at a time until a stop; keep the first error."""
        stdin = worker.process.stdin
        assert stdin is not None
        while (call := self._jobs.get()) is not None:
            if self.stop_on_error and self._errors:
                continue  # skipped: an earlier call failed
            try:
                write_message(stdin, call)
                reply = read_message(worker.answers)
                if reply is None:
                    error: BaseException | None = WorkerError(
                        f"a worker process ended (exit code {_exit_code(worker.process)})"
                    )
                else:
                    error = pickle.loads(reply)
            except BaseException as failure:  # gone, or an answer that does not read
                reply, error = None, WorkerError(f"a worker process failed: {failure!r}")
            if error is not None:
                with self._lock:
                    self._errors.append(error)
            elif self.done is not None:
                self.done()
            if reply is None:
                return  # this worker is gone (or no longer trusted): the others run what is left
