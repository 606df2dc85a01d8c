"""Ragged token activations: every example's real tokens, no padding, possibly spread over shards."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where a batch is made, so reading a store does not need it
    import torch

__all__ = ["Ragged"]


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

    def padded(self, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded float32 batch of the examples `index`: values (B, T, d) with zeros at
        padding, mask (B, T) bool, True at real tokens; T is the longest of the batch."""
        import torch  # a batch for training or scoring a probe: the one place this class needs torch

        index = np.asarray(index, dtype=np.int64)
        width = int(self.length[index].max())
        values = np.zeros((len(index), width, self.dim), dtype=np.float32)
        for row, i in enumerate(index):
            values[row, : self.length[i]] = self.example(int(i))
        mask = np.arange(width)[None, :] < self.length[index][:, None]  # (B, T)
        return torch.from_numpy(values), torch.from_numpy(mask)

    def mean_pooled(self) -> np.ndarray:
        """(n, d) float32 mean over each example's real tokens, accumulated in float64."""
        out = np.empty((len(self), self.dim), dtype=np.float32)
        for i in range(len(self)):
            out[i] = self.example(i).astype(np.float64).mean(axis=0)
        return out
