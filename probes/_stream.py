"""Streaming a batch's activations into its shard while the next batch's forward pass runs.

The main thread runs the forward passes and hands each batch's real-token rows to `ShardStream.put`.
On CUDA the rows are gathered, cast to float16 and checked for finiteness on the device, then copied
into pinned host memory on a side stream with an event behind them, so the main thread never waits
for the copy. A writer thread waits on the event and writes the rows into the shard; at the cadence
below it hands the batches written so far to a commit thread, which flushes them to disk and
records them while the writes go on (a flush of 256 MiB can take longer than the forward passes
that fill it; at most one commit runs, and batches written meanwhile wait for the next). At most
`IN_FLIGHT` batches wait for the writer, so host memory stays bounded.

Errors: the writer's or a commit's first error (e.g. non-finite activations) is raised in the main
thread at its next `put` or at the end; the writer then drops the batches still queued and commits
nothing more, so the store resumes from its last commit. An error in the main thread (an
interrupt, a failing progress callback) lets the writer finish the batches already handed over,
then commits them. A second interrupt while that runs stops the writer after its current write
(the rest is dropped, nothing more committed) and only then closes the shard.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from ._errors import ProbeError
from ._store import ShardWriter

__all__ = ["IN_FLIGHT", "CommitCadence", "ShardStream"]

IN_FLIGHT = 2  # batches handed to the writer and not yet written: enough to hide one slow write


@dataclass(frozen=True, kw_only=True)
class CommitCadence:
    """When the writer flushes the shard and records its finished batches: once `bytes` of rows
    or `seconds` have passed since the last commit, whichever comes first (checked after each
    batch). A killed run redoes at most that much; the end of a run always commits."""

    bytes: int = 256 * 2**20  # a flush per 256 MiB: ~0.1 s of disk, not per batch
    seconds: float = 60.0

    def due(self, pending_bytes: int, since: float) -> bool:
        return pending_bytes >= self.bytes or since >= self.seconds


def not_finite_error(layer: int, examples: tuple[int, ...]) -> ProbeError:
    return ProbeError(
        f"layer {layer}: activations of examples {list(examples)[:5]} "
        "are not finite in float16 (beyond +-65504, or NaN from the model); choose another --layer"
    )


def _all_finite(rows: np.ndarray) -> bool:
    """No inf or NaN in float16 rows: their exponent bits are all ones. On the bits, since
    np.isfinite on float16 is ~2x and torch.isfinite on CPU float16 ~4x slower than this."""
    return not ((rows.view(np.uint16) & 0x7C00) == 0x7C00).any()


@dataclass(frozen=True)
class _Rows:
    batch: int
    rows: torch.Tensor  # (real tokens, d) float16 on the host (pinned on CUDA)
    finite: torch.Tensor | None  # () bool, computed on the device; None: check on the host
    ready: torch.cuda.Event | None  # recorded after the copies into `rows` and `finite`


class ShardStream:
    """A writer thread in front of `writer`. Use as a context manager around the batch loop:
    leaving it normally waits for the writes and commits; leaving on an error is described in
    the module docstring."""

    def __init__(self, writer: ShardWriter, layer: int, cadence: CommitCadence) -> None:
        self.writer, self.layer, self.cadence = writer, layer, cadence
        self._queue: queue.Queue[_Rows | None] = queue.Queue(maxsize=IN_FLIGHT)
        self._error: BaseException | None = None
        self._copy_streams: dict[torch.device, torch.cuda.Stream] = {}
        self._thread = threading.Thread(target=self._run, name="ctd-shard-writer", daemon=True)
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="ctd-shard-commit")
        self._commit: Future[None] | None = None  # the commit running, or the last one
        self._stopping = False  # set by a second interrupt: drop what is queued, commit nothing

    def __enter__(self) -> ShardStream:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        try:
            self._queue.put(None)  # the writer finishes what is queued, then stops
            self._thread.join()
            self._commit_done()
            if self._error is None:
                self.writer.commit()
        finally:
            if self._thread.is_alive():  # a second Ctrl-C above: stop the writer before closing
                self._stopping = True  # its shard, or its next write would find the descriptor
                self._queue.put(None)  # closed, or reused by another file (the put above may not
                self._thread.join()  # have happened; a second sentinel is never read)
            self._committer.shutdown(wait=True)  # nothing uncommitted is recorded done: the
            self.writer.close()  # flush-then-record rule is commit's
        if kind is None and self._error is not None:
            raise self._error

    def _commit_done(self) -> bool:
        """Whether no commit is running; a finished commit's error becomes the stream's."""
        if self._commit is None:
            return True
        if not self._commit.done() and threading.current_thread() is self._thread:
            return False
        error = self._commit.exception()  # waits for it (at the end)
        if error is not None and self._error is None:
            self._error = error
        self._commit = None
        return True

    def put(self, batch: int, hidden: torch.Tensor, index: np.ndarray) -> None:
        """Queue batch `batch`'s rows: `hidden` (B, T, d) the layer's output, `index` the flat
        positions (row * T + column) of its real tokens, in batch order. Blocks while `IN_FLIGHT`
        batches wait; raises the writer's error."""
        if self._error is not None:
            raise self._error
        positions = torch.from_numpy(index)
        if hidden.device.type == "cuda":
            positions = positions.pin_memory().to(hidden.device, non_blocking=True)
        rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)  # (real tokens, d)
        rows = rows.to(torch.float16)
        if hidden.device.type != "cuda":
            self._queue.put(_Rows(batch, rows, None, None))
            return
        finite = torch.isfinite(rows).all()  # on the device: no sync here
        stream = self._copy_streams.get(hidden.device)
        if stream is None:
            stream = self._copy_streams[hidden.device] = torch.cuda.Stream(hidden.device)
        stream.wait_stream(torch.cuda.current_stream(hidden.device))
        with torch.cuda.stream(stream):
            host = torch.empty(rows.shape, dtype=torch.float16, pin_memory=True)
            host.copy_(rows, non_blocking=True)
            host_finite = torch.empty((), dtype=torch.bool, pin_memory=True)
            host_finite.copy_(finite, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(stream)
        # The device tensors were made on the compute stream and are read on the side stream:
        # keep the caching allocator from reusing them before the copies are done.
        rows.record_stream(stream)
        finite.record_stream(stream)
        self._queue.put(_Rows(batch, host, host_finite, ready))

    def _run(self) -> None:
        pending_bytes, last_commit = 0, time.monotonic()
        while (item := self._queue.get()) is not None:
            self._commit_done()  # a commit that failed stops the writer now, not a cadence later
            if self._error is not None or self._stopping:
                continue  # drop it; keeps `put` from blocking on a full queue
            try:
                if item.ready is not None:
                    item.ready.synchronize()
                rows = item.rows.numpy()
                finite = bool(item.finite) if item.finite is not None else _all_finite(rows)
                if not finite:
                    raise not_finite_error(self.layer, self.writer.plan.batches[item.batch])
                self.writer.write(item.batch, rows)
                pending_bytes += item.rows.numel() * item.rows.element_size()
                due = self.cadence.due(pending_bytes, time.monotonic() - last_commit)
                if due and self._commit_done() and self._error is None and not self._stopping:
                    self._commit = self._committer.submit(self.writer.commit, self.writer.written())
                    pending_bytes, last_commit = 0, time.monotonic()
            except BaseException as error:  # handed to the main thread, which raises it
                self._error = error
