"""What a probe reads, on the device it trains or scores on. Three kinds of input, one interface
(`lengths`, `batch(index) -> (x, mask)`, `sums()`):

- `Resident`: the split's float16 tokens kept on the device as one tensor; a padded batch is one
  gather (a (B, T) row index built by arithmetic on per-example offsets). Used when it fits.
- `Streamed`: each padded batch built on the host from the memory-mapped store and copied over
  (through pinned memory on CUDA); memory scales with the batch, not the split.
- `Pooled`: the (n, d) mean-pooled vectors of the pooled probes (mean, mlp), uploaded once.

On the CPU all three give the same float32 batches and the same float64 sums, bit for bit, as the
pre-GPU code: the sums are then taken by `Ragged` in numpy in its order. On CUDA they are taken in
torch, chunked (the same to float64 rounding).
"""

from __future__ import annotations

import weakref

import numpy as np
import torch
from torch import Tensor

from ._device import resident_budget
from ._ragged import Ragged

__all__ = ["Inputs", "Pooled", "Resident", "Streamed", "inputs", "resident_fits"]

UPLOAD_ROWS = 1 << 16  # token rows copied to the device at a time (256 MiB at d = 2,048)
CHUNK_VALUES = 1 << 26  # float64 values a CUDA reduction holds at a time (512 MiB)

Sums = tuple[np.ndarray, np.ndarray, float]  # (d,) float64 sum and sum of squares, count of rows


class Resident:
    """Tokens of `acts` on `device`: its shards back to back in one float16 tensor (cached while the
    shard arrays live, see `_resident_tokens`) and each example's first row and length there."""

    def __init__(self, acts: Ragged, device: torch.device) -> None:
        self.acts, self.device = acts, device
        self.tokens, bases = _resident_tokens(acts.shards, device)  # (N + 1, d), row N all zeros
        self.first = bases[acts.shard] + acts.start  # (n,) int64 row of each example's first token
        self._first = torch.from_numpy(self.first).to(device)
        self._length = torch.from_numpy(acts.length).to(device)

    @property
    def lengths(self) -> np.ndarray:
        return self.acts.length

    def batch(self, index: np.ndarray) -> tuple[Tensor, Tensor]:
        """x (B, T, d) float32, zeros at padding, and mask (B, T) bool, on the device: one gather."""
        width = int(self.acts.length[index].max())  # on the host: no device sync
        i = _index(index, self.device)  # (B,)
        steps = torch.arange(width, device=self.device)  # (T,)
        mask = steps < self._length[i][:, None]  # (B, T)
        padding_row = len(self.tokens) - 1  # the zero row
        rows = torch.where(mask, self._first[i][:, None] + steps, padding_row)  # (B, T)
        return self.tokens[rows].float(), mask  # (B, T, d)

    def sums(self) -> Sums:
        if self.device.type == "cpu":  # numpy in the pre-GPU order: the CPU stays bit-identical
            return (*self._host_view().token_sums(), float(self.acts.length.sum()))
        total = torch.zeros(self.tokens.shape[1], dtype=torch.float64, device=self.device)
        squares = torch.zeros_like(total)
        for _, x in self._float64_chunks():  # (B, T, d), zeros at padding add nothing
            total += x.sum(dim=(0, 1))
            squares += x.square().sum(dim=(0, 1))
        return total.cpu().numpy(), squares.cpu().numpy(), float(self.acts.length.sum())

    def mean_pooled(self) -> Tensor:
        """(n, d) float32 on the device: each example's token mean, accumulated in float64."""
        if self.device.type == "cpu":
            return torch.from_numpy(self._host_view().mean_pooled())
        out = torch.empty((len(self.lengths), self.tokens.shape[1]), device=self.device)
        if not len(out):  # an empty subset (no test example with an expert score): nothing to pool
            return out
        for index, x in self._float64_chunks():
            length = torch.from_numpy(self.acts.length[index]).to(self.device)  # (B,)
            out[torch.from_numpy(index).to(self.device)] = (x.sum(dim=1) / length[:, None]).float()
        return out

    def _host_view(self) -> Ragged:
        """The same examples as a Ragged over the CPU tensor (no copy)."""
        return Ragged((self.tokens.numpy(),), np.zeros_like(self.first), self.first, self.acts.length)

    def _float64_chunks(self):  # -> Iterator[tuple[np.ndarray, Tensor]]
        """(index, x (B, T, d) float64) over all examples in length order, CHUNK_VALUES at most each."""
        order = np.argsort(self.acts.length, kind="stable")
        per_chunk = max(1, CHUNK_VALUES // (self.tokens.shape[1] * int(self.acts.length.max())))
        for start in range(0, len(order), per_chunk):
            index = order[start : start + per_chunk]
            yield index, self.batch(index)[0].double()


class Streamed:
    """Token batches padded on the host from `acts` (usually memory maps) and sent to `device` one
    at a time. On CUDA through pinned float16 memory with a non-blocking copy, widened to float32
    there; the caching host allocator keeps each pinned block until its copy is done."""

    def __init__(self, acts: Ragged, device: torch.device) -> None:
        self.acts, self.device = acts, device

    @property
    def lengths(self) -> np.ndarray:
        return self.acts.length

    def batch(self, index: np.ndarray) -> tuple[Tensor, Tensor]:
        if self.device.type == "cpu":
            return self.acts.padded(index)  # float32 on the host, as before
        width = int(self.acts.length[index].max())
        pinned = torch.empty((len(index), width, self.acts.dim), dtype=torch.float16, pin_memory=True)
        _, mask = self.acts.padded(index, out=pinned.numpy())  # (B, T, d) float16, (B, T)
        x = pinned.to(self.device, non_blocking=True).float()
        return x, mask.to(self.device, non_blocking=True)

    def sums(self) -> Sums:
        return (*self.acts.token_sums(), float(self.acts.length.sum()))

    def mean_pooled(self) -> Tensor:
        return torch.from_numpy(self.acts.mean_pooled()).to(self.device)


class Pooled:
    """(n, d) float32 pooled vectors on the device: a batch is (B, 1, d) and an all-True mask."""

    def __init__(self, rows: Tensor) -> None:
        self.rows, self.device = rows, rows.device
        self.lengths = np.ones(len(rows), dtype=np.int64)

    def batch(self, index: np.ndarray) -> tuple[Tensor, Tensor]:
        i = _index(index, self.device)
        x = self.rows[i][:, None, :]  # (B, d) -> (B, 1, d), one "token": the mean
        return x, torch.ones(x.shape[:2], dtype=torch.bool, device=self.device)  # (B, 1)

    def sums(self) -> Sums:
        if self.device.type == "cpu":  # numpy, as before
            rows = self.rows.double().numpy()  # (n, d)
            return rows.sum(axis=0), np.square(rows).sum(axis=0), float(len(rows))
        rows = self.rows.double()
        return rows.sum(dim=0).cpu().numpy(), rows.square().sum(dim=0).cpu().numpy(), float(len(rows))


Inputs = Resident | Streamed | Pooled


def _index(index: np.ndarray, device: torch.device) -> Tensor:
    """`index` as an int64 tensor on `device`. To CUDA through pinned memory, non-blocking: a copy
    from pageable memory would wait for the GPU to finish the previous step, once per batch."""
    index = torch.from_numpy(np.asarray(index, dtype=np.int64))
    return index.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else index


def inputs(acts: Ragged, *, pooled: bool, device: torch.device, resident: bool) -> Inputs:
    """What a probe reads of `acts` on `device`: its tokens (resident or streamed), or for pooled
    probes their mean-pooled vectors (computed where the tokens are, then kept on the device)."""
    tokens = Resident(acts, device) if resident else Streamed(acts, device)
    return Pooled(tokens.mean_pooled()) if pooled else tokens


def resident_fits(acts: Ragged, device: torch.device) -> bool:
    """Whether the shards `acts` reads are on `device` already or fit its `resident_budget`."""
    if _key(acts.shards, device) in _RESIDENT:
        return True
    return sum(s.shape[0] * s.shape[1] * 2 for s in acts.shards) <= resident_budget(device)  # float16


# (device, id of each shard) -> (tokens, first row of each shard). An entry is dropped when any of
# its shards is freed (weakref.finalize), so a split's tokens stay on the GPU exactly as long as the
# caller holds its Ragged: the seeds and architectures trained on a split, and the scoring after,
# upload it once. Shards are taken as immutable (the store's are read-only memory maps).
_RESIDENT: dict[tuple[str, tuple[int, ...]], tuple[Tensor, np.ndarray]] = {}


class _PinnedUpload:
    """Host rows to a CUDA tensor through two pinned buffers: filling one from the (memory-mapped)
    rows overlaps the non-blocking copy of the other, and no copy waits on pageable memory."""

    def __init__(self, dim: int) -> None:
        self.buffers = [
            torch.empty((UPLOAD_ROWS, dim), dtype=torch.float16, pin_memory=True) for _ in range(2)
        ]
        self.done: list[torch.cuda.Event | None] = [None, None]
        self.turn = 0

    def copy(self, rows: np.ndarray, target: Tensor) -> None:
        buffer, event = self.buffers[self.turn], self.done[self.turn]
        if event is not None:
            event.synchronize()  # this buffer's previous copy has left it
        np.copyto(buffer.numpy()[: len(rows)], rows, casting="same_kind")
        target.copy_(buffer[: len(rows)], non_blocking=True)
        self.done[self.turn] = torch.cuda.Event()
        # on the stream the copy ran on: the destination device's (which need not be the current one)
        self.done[self.turn].record(torch.cuda.current_stream(target.device))
        self.turn = 1 - self.turn

    def wait(self) -> None:
        for event in self.done:
            if event is not None:
                event.synchronize()


def _key(shards: tuple[np.ndarray, ...], device: torch.device) -> tuple[str, tuple[int, ...]]:
    return str(device), tuple(id(s) for s in shards)


def _resident_tokens(shards: tuple[np.ndarray, ...], device: torch.device) -> tuple[Tensor, np.ndarray]:
    """(N + 1, d) float16 on `device`: the shards back to back, then a row of zeros where padding
    points; and each shard's first row. Copied UPLOAD_ROWS at a time, so host memory stays small."""
    key = _key(shards, device)
    if key not in _RESIDENT:
        bases = np.concatenate([[0], np.cumsum([len(s) for s in shards])]).astype(np.int64)
        tokens = torch.zeros((int(bases[-1]) + 1, shards[0].shape[1]), dtype=torch.float16, device=device)
        upload = _PinnedUpload(shards[0].shape[1]) if device.type == "cuda" else None
        for shard, base in zip(shards, bases, strict=False):
            for a in range(0, len(shard), UPLOAD_ROWS):
                rows = shard[a : a + UPLOAD_ROWS]
                target = tokens[base + a : base + a + len(rows)]
                if upload is not None:
                    upload.copy(rows, target)
                else:
                    target.copy_(torch.from_numpy(np.array(rows, dtype=np.float16)))
        if upload is not None:
            upload.wait()
        _RESIDENT[key] = (tokens, bases[:-1])
        for shard in shards:
            weakref.finalize(shard, _RESIDENT.pop, key, None)
    return _RESIDENT[key]
