"""The report's figures, drawn in worker processes while its sections go on.

Drawing is most of a report's time (matplotlib's Python code, so threads would not overlap it:
5.4 of 7.5 s for the embedded run's 13 figures), and a figure depends on nothing but its
arguments. Each section hands its figure function and arguments to `FigurePool`, which pickles
them at once and has one of a few worker processes draw them (`python -m
harness.report._figure_worker`: a fresh interpreter, so no lock of another thread is inherited
as a fork would, and no user script is run again as multiprocessing's spawn does with a script's
main module). `wait` is the one place the report waits for the figures and raises the first
one's error; `close` drops the figures not started and waits for those being drawn, so none lands
in a staging folder after it is removed.
"""

from __future__ import annotations

import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
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
    """One process per CPU this process may run on (a container's share), 1 to MAX_WORKERS: the
    thread building the sections mostly waits for them."""
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


class FigurePool:
    """Figure functions run in worker processes, started with the first figure."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[bytes | None] = queue.Queue()
        self._workers: list[tuple[subprocess.Popen[bytes], threading.Thread]] = []
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
            for _, thread in self._workers:
                thread.join()
            if self._errors:
                raise self._errors[0]
        finally:
            self.close()

    def close(self) -> None:
        """Drop the figures not started, wait for those being drawn, stop the workers."""
        while True:
            try:
                self._jobs.get_nowait()
            except queue.Empty:
                break
        for _ in self._workers:
            self._jobs.put(None)
        for process, thread in self._workers:
            thread.join()
            if process.stdin is not None:
                process.stdin.close()  # the worker ends at the end of its input
            process.wait()
        self._workers = []

    def _start(self) -> None:
        # The parent's import path, so the worker finds this package however the parent found it
        # (installed, or a notebook's sys.path).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        for _ in range(_workers()):
            process = subprocess.Popen(
                [sys.executable, "-m", "harness.report._figure_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            thread = threading.Thread(target=self._feed, args=(process,), name="ctd-figures", daemon=True)
            thread.start()
            self._workers.append((process, thread))

    def _feed(self, process: subprocess.Popen[bytes]) -> None:
        """Hand `process` one queued figure at a time until a stop; keep the first error."""
        assert process.stdin is not None and process.stdout is not None
        while (call := self._jobs.get()) is not None:
            try:
                write_message(process.stdin, call)
                reply = read_message(process.stdout)
            except OSError:
                reply = None
            error = (
                pickle.loads(reply)
                if reply is not None
                else FigureError(f"a figure worker ended (exit code {_exit_code(process)})")
            )
            if error is not None:
                with self._lock:
                    self._errors.append(error)
                if reply is None:
                    return  # the worker is gone: the other workers draw what is left
