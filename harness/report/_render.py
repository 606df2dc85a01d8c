"""The report's figures, drawn in worker processes while its sections go on.

Drawing is most of a report's time (matplotlib's Python code, so threads would not overlap it:
5.4 of 7.5 s for the embedded run's 13 figures), and a figure depends on nothing but its
arguments. Each section hands its figure function and arguments to `FigurePool`, which pickles
them at once and has one of a few worker processes draw them (`python -m
harness.report._figure_worker`: a fresh interpreter, so no lock of another thread is inherited
as a fork would, and no user script is run again as multiprocessing's spawn does with a script's
main module). `wait` is the one place the report waits for the figures and raises the first
one's error; `close`, on an error or an interrupt, drops the figures not started and kills the
workers before it returns, so none lands in a staging folder after it is removed.
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

__all__ = ["MAX_WORKERS", "FigureError", "FigurePool", "read_message", "write_message"]

MAX_WORKERS = 8  # a report has about 13 figures per probe configuration
_LENGTH = struct.Struct("<Q")  # each message: its length, then its pickle


class FigureError(RuntimeError):
    """A figure failed in its worker (the worker's traceback is the message), or a worker died."""


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
    MAX_WORKERS: the thread building the sections mostly waits for them."""
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
    thread: threading.Thread | None = None  # hands it figures


class FigurePool:
    """Figure functions run in worker processes, started with the first figure."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[bytes | None] = queue.Queue()
        self._workers: list[_Worker] = []
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()

    def draw(self, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        """Draw `function(*args, **kwargs)` (a module-level function: it is pickled by name) in a
        worker. The call is pickled here, so the caller may change its arguments after."""
        call = pickle.dumps((function, args, kwargs))
        if not self._workers:
            self._start()
        self._jobs.put(call)

    def wait(self) -> None:
        """Wait for every figure drawn so far, then stop the workers; raises the first error."""
        try:
            for _ in self._workers:
                self._jobs.put(None)  # each worker's thread stops at one, after the figures queued
            for worker in self._workers:
                assert worker.thread is not None
                worker.thread.join()
        except BaseException:  # an interrupt while waiting: the figures left are not wanted
            self.close()
            raise
        errors = self._errors
        self._stop(kill=False)
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Stop at once, on an error or an interrupt: drop the figures not started and kill the
        workers (a figure half drawn writes nothing: `atomic_path`), waiting until they are gone."""
        while True:
            try:
                self._jobs.get_nowait()
            except queue.Empty:
                break
        self._stop(kill=True)

    def _stop(self, *, kill: bool) -> None:
        for _ in self._workers:
            self._jobs.put(None)  # wakes a thread waiting for a figure
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
        self._jobs = queue.Queue()  # no figure or stop left for the next workers

    def _start(self) -> None:
        # The parent's import path, so the worker finds this package however the parent found it
        # (installed, or a notebook's sys.path).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        for _ in range(_workers()):
            read_end, write_end = os.pipe()
            try:
                process = subprocess.Popen(
                    [sys.executable, "-m", "harness.report._figure_worker", str(write_end)],
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
                target=self._feed, args=(worker,), name="ctd-figures", daemon=True
            )
            worker.thread.start()
            self._workers.append(worker)

    def _feed(self, worker: _Worker) -> None:
        """Hand `worker` one queued figure at a time until a stop; keep the first error."""
        stdin = worker.process.stdin
        assert stdin is not None
        while (call := self._jobs.get()) is not None:
            try:
                write_message(stdin, call)
                reply = read_message(worker.answers)
                if reply is None:
                    error: BaseException | None = FigureError(
                        f"a figure worker ended (exit code {_exit_code(worker.process)})"
                    )
                else:
                    error = pickle.loads(reply)
            except BaseException as failure:  # gone, or an answer that does not read
                reply, error = None, FigureError(f"a figure worker failed: {failure!r}")
            if error is not None:
                with self._lock:
                    self._errors.append(error)
            if reply is None:
                return  # this worker is gone (or no longer trusted): the others draw what is left
