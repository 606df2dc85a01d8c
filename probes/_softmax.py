"""Softmax-aggregation probe: a linear score per token, aggregated by a temperature softmax over the
real tokens' own scores (appendix "Probe Architecture Ablation", Softmax+Softmax)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["SoftmaxProbe"]


class SoftmaxProbe(nn.Module):
    """u_t = w·z_t + b, output = sum_t softmax(u / τ)_t · u_t over the real tokens.

    A small τ approaches the largest token score, a large τ the mean score. z_t is token t standardised
    with the `mean`/`std` buffers (per-feature statistics of the training tokens, saved with the module)."""

    pooled = False  # reads every token, so it needs the padded token batch

    def __init__(
        self, dim: int, *, temperature: float = 1.0, mean: Tensor | None = None, std: Tensor | None = None
    ) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = temperature  # τ
        self.register_buffer("mean", torch.zeros(dim) if mean is None else mean.detach().float().clone())
        self.register_buffer("std", torch.ones(dim) if std is None else std.detach().float().clone())
        self.score = nn.Linear(dim, 1)  # w, b

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, T, d) token activations, mask (B, T) True at real tokens -> (B,) raw output."""
        z = torch.where(mask[..., None], (x - self.mean) / self.std, 0.0)  # (B, T, d), 0 at padding
        u = self.score(z).squeeze(-1)  # (B, T, 1) -> (B, T) token scores (b at padding, finite)
        a = (u / self.temperature).masked_fill(~mask, float("-inf")).softmax(dim=-1)  # (B, T), 0 at padding
        return (a * u).sum(dim=-1)  # (B,)

    def penalty(self) -> Tensor:
        """No explicit regulariser: AdamW's weight decay does the job."""
        return self.score.weight.new_zeros(())
