"""The activation store: every real token's vector at one layer, float16, memory-mapped.

A store is a folder named by the hash of what determines its contents (model identity, layer,
chat template, token limit, dtype and the data's content hash):

    key.json                      the key's fields, for people
    plan.json                     token lengths and the batches, fixed before extraction starts
    shard-R-of-W.f16              rank R's token vectors, (tokens, d) float16, in its batch order
    progress-R-of-W.json          batches rank R has flushed to its shard (atomic rewrite)
    index.npz                     per example: shard, start row, length (written by the join)
    complete.json                 written last: its presence is what makes the store complete

Each of the W processes of `accelerate launch` writes its own shard; the join writes the index.
An interrupted extraction resumes from the batches its progress file lists.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ._errors import ProbeError
from ._ragged import Ragged

__all__ = ["ActivationStore", "Plan", "StoreKey"]

_FORMAT = 1


@dataclass(frozen=True, kw_only=True)
class StoreKey:
    model: str  # LoadedModel.identity: id and revision, or a file's content hash
    layer: int
    template: str  # hash of the chat template
    max_tokens: int
    dtype: str  # the forward pass's dtype: bfloat16 activations differ from float32 ones
    data: str  # the examples' content hash

    def digest(self) -> str:
        text = json.dumps({"format": _FORMAT, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Plan:
    """Token lengths of every example (after truncation) and the batches, as example indices."""

    lengths: np.ndarray  # (n,) int64
    batches: tuple[tuple[int, ...], ...]
    dim: int

    def to_json(self) -> dict:
        return {"lengths": self.lengths.tolist(), "batches": [list(b) for b in self.batches], "dim": self.dim}

    @classmethod
    def from_json(cls, data: dict) -> Plan:
        return cls(
            np.asarray(data["lengths"], dtype=np.int64), tuple(tuple(b) for b in data["batches"]), data["dim"]
        )

    def rank_batches(self, rank: int, world: int) -> list[int]:
        """Batch numbers this process extracts: every world-th batch, starting at its rank."""
        return list(range(rank, len(self.batches), world))

    def rank_layout(self, rank: int, world: int) -> tuple[dict[int, int], int]:
        """Start row in rank's shard of each of its batches, and the shard's total rows."""
        starts, row = {}, 0
        for b in self.rank_batches(rank, world):
            starts[b] = row
            row += int(self.lengths[list(self.batches[b])].sum())
        return starts, row


def _write_json_atomic(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class ActivationStore:
    """One store folder. Use `open(root, key)`; then `is_complete`, `read()`, or the writer steps
    `start(plan)`, `shard_writer(rank, world)`, `join(world)`."""

    def __init__(self, folder: Path, key: StoreKey) -> None:
        self.folder = folder
        self.key = key

    @classmethod
    def open(cls, root: Path, key: StoreKey) -> ActivationStore:
        return cls(Path(root) / key.digest(), key)

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive use of this store across processes of different runs (an advisory lock on a
        file beside the folder); a second run waits here, then finds the store complete."""
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        with (self.folder.parent / f"{self.folder.name}.lock").open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @property
    def is_complete(self) -> bool:
        """Joined, and every shard its planned size: a shard cut short (a disk that filled, a copy
        that stopped) leaves the store incomplete, so the next extraction redoes that shard."""
        joined = self._joined()
        return joined is not None and self._damaged_shard(*joined) is None

    def _joined(self) -> tuple[int, Plan] | None:
        """The number of processes `join` recorded and the plan, or None before a join (or if
        either is unreadable)."""
        try:
            return int(json.loads((self.folder / "complete.json").read_text())["world"]), self.plan()
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def shard_path(self, rank: int, world: int) -> Path:
        return self.folder / f"shard-{rank}-of-{world}.f16"

    def _damaged_shard(self, world: int, plan: Plan) -> tuple[Path, int, int] | None:
        """(shard, rows it holds, rows planned) of the first shard not of its planned size."""
        for rank in range(world):
            path = self.shard_path(rank, world)
            planned = plan.rank_layout(rank, world)[1]
            size = path.stat().st_size if path.is_file() else 0
            if size != planned * 2 * plan.dim:
                return path, size // (2 * plan.dim), planned
        return None

    # -- writing ---------------------------------------------------------------------------------

    def start(self, plan: Plan) -> Plan:
        """Fix the plan (or find the one an interrupted run fixed) and return it. A plan that
        differs from the saved one (e.g. another batch token budget) restarts the store."""
        self.folder.mkdir(parents=True, exist_ok=True)
        # A store redone (a damaged shard) is not complete until its next join.
        (self.folder / "complete.json").unlink(missing_ok=True)
        saved = self.folder / "plan.json"
        if saved.is_file():
            old = Plan.from_json(json.loads(saved.read_text()))
            if old.batches == plan.batches and np.array_equal(old.lengths, plan.lengths):
                return old
            self.clear()
            self.folder.mkdir(parents=True)
        _write_json_atomic(self.folder / "key.json", asdict(self.key))
        _write_json_atomic(saved, plan.to_json())
        return plan

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def plan(self) -> Plan:
        return Plan.from_json(json.loads((self.folder / "plan.json").read_text()))

    def shard_writer(self, rank: int, world: int) -> ShardWriter:
        return ShardWriter(self, self.plan(), rank, world)

    def join(self, world: int) -> None:
        """Check every rank finished its batches, write the index, then mark complete."""
        plan = self.plan()
        shard = np.empty(len(plan.lengths), dtype=np.int64)
        start = np.empty(len(plan.lengths), dtype=np.int64)
        for rank in range(world):
            writer = ShardWriter(self, plan, rank, world)
            missing = set(writer.batches) - writer.done
            if missing:
                raise ProbeError(f"{self.folder}: rank {rank} has {len(missing)} unfinished batches")
            for b, row in writer.starts.items():
                for i in plan.batches[b]:
                    shard[i], start[i] = rank, row
                    row += int(plan.lengths[i])
        np.savez(self.folder / "index.tmp.npz", shard=shard, start=start, length=plan.lengths, world=world)
        os.replace(self.folder / "index.tmp.npz", self.folder / "index.npz")
        _write_json_atomic(self.folder / "complete.json", {"format": _FORMAT, "world": world})
        # An interrupted run with another number of processes left shards this index never reads.
        for stale in [*self.folder.glob("shard-*-of-*.f16"), *self.folder.glob("progress-*-of-*.json")]:
            if not stale.stem.endswith(f"-of-{world}"):
                stale.unlink(missing_ok=True)

    # -- reading ---------------------------------------------------------------------------------

    def read(self) -> Ragged:
        """The store's activations as a Ragged view over read-only memory maps."""
        joined = self._joined()
        if joined is None:
            raise ProbeError(
                f"{self.folder}: the activation store is missing or incomplete; rerun the probe stage"
            )
        world, plan = joined
        damaged = self._damaged_shard(world, plan)
        if damaged is not None:
            path, rows, planned = damaged
            raise ProbeError(
                f"{self.folder}: the activation store is damaged ({path.name} holds {rows} of its "
                f"{planned} rows); rerun the probe stage to extract that shard again"
            )
        index = np.load(self.folder / "index.npz")
        dim = plan.dim
        shards = []
        for rank in range(world):
            path = self.shard_path(rank, world)
            rows = path.stat().st_size // (2 * dim)
            shards.append(
                np.memmap(path, dtype=np.float16, mode="r", shape=(rows, dim))
                if rows
                else np.zeros((0, dim), np.float16)
            )
        return Ragged(tuple(shards), index["shard"], index["start"], index["length"])


class ShardWriter:
    """Rank `rank`'s shard: a preallocated float16 file; `write(b, rows)` puts batch b's real token
    vectors at their fixed place; `commit()` flushes them and records the finished batches.
    One thread writes (the extraction's writer thread, see _stream.py); a commit of the batches
    `written()` handed over may run on another thread beside the writes (`commit(batches)`)."""

    def __init__(self, store: ActivationStore, plan: Plan, rank: int, world: int) -> None:
        self.store, self.plan, self.rank, self.world = store, plan, rank, world
        self.batches = plan.rank_batches(rank, world)
        self.starts, self.rows = plan.rank_layout(rank, world)
        self.path = store.shard_path(rank, world)
        self.progress_path = store.folder / f"progress-{rank}-of-{world}.json"
        self.done: set[int] = set()
        if self.progress_path.is_file() and self._shard_intact():
            self.done = set(json.loads(self.progress_path.read_text())["done"])
        self._pending: list[int] = []
        self._record_lock = threading.Lock()  # two commits never interleave their records
        self._fd: int | None = None

    @property
    def todo(self) -> list[int]:
        return [b for b in self.batches if b not in self.done]

    def _shard_intact(self) -> bool:
        return self.path.is_file() and self.path.stat().st_size == self.rows * 2 * self.plan.dim

    def _open(self) -> int:
        if self._fd is None:
            if not self._shard_intact():
                self.done = set()  # rows of a shard of another size mean nothing: redo them all
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            os.ftruncate(self._fd, self.rows * 2 * self.plan.dim)
        return self._fd

    def write(self, batch: int, rows: np.ndarray) -> None:
        """rows: (real tokens of the batch, d) float16, examples in batch order. A positioned
        write (no memory map: no page fault per 4 KiB, and the GIL is released while it runs)."""
        expected = int(self.plan.lengths[list(self.plan.batches[batch])].sum())
        if rows.shape != (expected, self.plan.dim) or rows.dtype != np.float16:
            wanted = f"({expected}, {self.plan.dim}) float16"
            raise ValueError(f"batch {batch}: got {rows.shape} {rows.dtype}, expected {wanted}")
        fd, data = self._open(), memoryview(np.ascontiguousarray(rows)).cast("B")
        offset = self.starts[batch] * 2 * self.plan.dim
        while data:  # pwrite may write less than asked
            written = os.pwrite(fd, data, offset)
            data, offset = data[written:], offset + written
        self._pending.append(batch)

    def _flush(self) -> None:
        os.fdatasync(self._open())

    def written(self) -> list[int]:
        """The batches written since the last call (or commit), handed over to be committed."""
        batches, self._pending = self._pending, []
        return batches

    def commit(self, batches: list[int] | None = None) -> None:
        """Flush written rows to disk first, then record `batches` (default: every batch written
        and not yet committed) as done, so a crash between the two redoes them instead of trusting
        rows that never reached the disk. Writes may go on meanwhile: the flush covers every row
        written before it started, `batches` among them."""
        batches = self.written() if batches is None else batches
        self._flush()
        with self._record_lock:
            self.done.update(batches)
            _write_json_atomic(self.progress_path, {"done": sorted(self.done)})

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
