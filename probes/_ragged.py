"""Ragged token activations: every example's real tokens, no padding, possibly spread over shards."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where a batch is made, so reading a store does not need it
    import torch

__all__ = ["Ragged", "token_rows"]

CHUNK_VALUES = 1 << 22  # token values converted to float64 at a time by the sums (32 MiB)


@dataclass(frozen=True)
class Ragged:
    """Token vectors of n examples. Example i is `shards[shard[i]][start[i] : start[i] + length[i]]`,
    an array of shape (length[i], d). Shards are float16 arrays (usually read-only memory maps of
    the activation store), so a Ragged view costs no memory until a batch is gathered."""

    shards: tuple[np.ndarray, ...]  # each (tokens_in_shard, d)
    shard: np.ndarray  # (n,) int64
    start: np.ndarray  # (n,) int64
    length: np.ndarray  # (n,) int64

    @classmethod
    def from_arrays(cls, examples: list[np.ndarray]) -> Ragged:
        """One shard holding `examples` (each (T_i, d)) back to back; for tests and small data."""
        if not examples:
            raise ValueError("no examples")
        length = np.array([len(e) for e in examples], dtype=np.int64)
        start = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)
        values = np.concatenate(examples).astype(np.float16)
        return cls((values,), np.zeros(len(examples), dtype=np.int64), start, length)

    def __len__(self) -> int:
        return len(self.length)

    @property
    def dim(self) -> int:
        return int(self.shards[0].shape[1])

    def example(self, i: int) -> np.ndarray:
        """(length[i], d) float16 view of example i."""
        s = int(self.start[i])
        return self.shards[int(self.shard[i])][s : s + int(self.length[i])]

    def subset(self, index: np.ndarray) -> Ragged:
        """The examples `index` (in that order), sharing the same shards."""
        index = np.asarray(index, dtype=np.int64)
        return Ragged(self.shards, self.shard[index], self.start[index], self.length[index])

    def padded(
        self, index: np.ndarray, *, out: np.ndarray | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded float32 batch of the examples `index`: values (B, T, d) with zeros at
        padding, mask (B, T) bool, True at real tokens; T is the longest of the batch. With `out`
        ((B, T, d), e.g. a view of pinned memory) the values are written there, in its dtype."""
        import torch  # a batch for training or scoring a probe: the one place this class needs torch

        index = np.asarray(index, dtype=np.int64)
        width = int(self.length[index].max())
        if out is None:
            out = np.zeros((len(index), width, self.dim), dtype=np.float32)
        elif out.shape != (len(index), width, self.dim):
            raise ValueError(f"out must have shape {(len(index), width, self.dim)}, got {out.shape}")
        else:
            out[...] = 0
        for row, i in enumerate(index):
            out[row, : self.length[i]] = self.example(int(i))
        mask = np.arange(width)[None, :] < self.length[index][:, None]  # (B, T)
        return torch.from_numpy(out), torch.from_numpy(mask)

    def mean_pooled(self) -> np.ndarray:
        """(n, d) float32 mean over each example's real tokens, accumulated in float64."""
        out = np.empty((len(self), self.dim), dtype=np.float32)
        for a, b, sums in self._example_sums():
            out[a:b] = sums / self.length[a:b, None]  # as ndarray.mean: the float64 sum, then one division
        return out

    def token_sums(self) -> tuple[np.ndarray, np.ndarray]:
        """(d,) float64 sums of every real token and of its square, taken example by example in
        order (each example's sum over its tokens, added to the running total): the same rounding
        as a Python loop over the examples, at numpy speed."""
        total, squares = np.zeros(self.dim), np.zeros(self.dim)
        for _, _, sums, square_sums in self._example_sums(squares=True):
            # cumsum adds strictly left to right: ((total + s_a) + s_a+1) + ..., the loop's order
            total = np.cumsum(np.vstack([total, sums]), axis=0)[-1]
            squares = np.cumsum(np.vstack([squares, square_sums]), axis=0)[-1]
        return total, squares

    def _example_sums(self, *, squares: bool = False) -> Iterator:
        """(a, b, sums[, square_sums]) for consecutive runs of examples a..b: each example's float64
        sum over its tokens ((b - a, d); of the squares too if asked). A run holds about
        CHUNK_VALUES token values (at least one example), so memory does not grow with n."""
        if len(self) and int(self.length.min()) < 1:
            raise ValueError("every example needs at least one token")
        ends = np.cumsum(self.length)
        per_chunk = max(1, CHUNK_VALUES // self.dim)  # tokens
        a = 0
        while a < len(self):
            b = max(a + 1, int(np.searchsorted(ends, ends[a] - self.length[a] + per_chunk, side="right")))
            tokens = self._tokens(a, b).astype(np.float64)  # (tokens of a..b, d)
            starts = np.concatenate([[0], np.cumsum(self.length[a : b - 1])])
            # reduceat adds each segment's rows in order, as ndarray.sum(axis=0) does per example
            sums = np.add.reduceat(tokens, starts, axis=0)  # (b - a, d)
            if squares:
                yield a, b, sums, np.add.reduceat(np.square(tokens), starts, axis=0)
            else:
                yield a, b, sums
            a = b

    def _tokens(self, a: int, b: int) -> np.ndarray:
        """(sum of length[a:b], d) float16: the real tokens of examples a..b, back to back."""
        length, start, shard = self.length[a:b], self.start[a:b], self.shard[a:b]
        rows = token_rows(start, length)
        if (shard == shard[0]).all():
            values = self.shards[int(shard[0])]
            contiguous = rows[-1] - rows[0] + 1 == len(rows) and (np.diff(rows) == 1).all()
            return values[rows[0] : rows[-1] + 1] if contiguous else values[rows]
        out = np.empty((len(rows), self.dim), dtype=np.float16)
        owner = np.repeat(shard, length)  # (tokens,) shard of each token
        for s in np.unique(shard):
            out[owner == s] = self.shards[int(s)][rows[owner == s]]
        return out


def token_rows(start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """(sum of length,) int64 rows start[i], ..., start[i] + length[i] - 1 of every example i, in order."""
    offsets = np.cumsum(length) - length  # where each example begins in the output
    return np.repeat(start - offsets, length) + np.arange(int(length.sum()), dtype=np.int64)
