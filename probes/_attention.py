"""Learned-attention pooling probe (the paper's primary architecture, appendix "Learned-Attention
Architecture"): a learned query scores every real token, a softmax over those tokens pools them, and a
linear head reads the pooled vector."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["AttentionProbe"]


class AttentionProbe(nn.Module):
    """s_t = q·z_t / sqrt(d), a = softmax(s) over real tokens, h = sum_t a_t z_t, output = head(h).

    z_t is token t standardised with the `mean`/`std` buffers (per-feature statistics of the training
    tokens, saved with the module). The query starts at zero, i.e. at mean pooling."""

    pooled = False  # reads every token, so it needs the padded token batch

    def __init__(self, dim: int, *, mean: Tensor | None = None, std: Tensor | None = None) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim) if mean is None else mean.detach().float().clone())
        self.register_buffer("std", torch.ones(dim) if std is None else std.detach().float().clone())
        self.query = nn.Parameter(torch.zeros(dim))  # q
        self.head = nn.Linear(dim, 1)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, T, d) token activations, mask (B, T) True at real tokens -> (B,) raw output."""
        d = x.shape[-1]
        z = torch.where(mask[..., None], (x - self.mean) / self.std, 0.0)  # (B, T, d), 0 at padding
        s = (z @ self.query) / math.sqrt(d)  # (B, T) token scores
        a = s.masked_fill(~mask, float("-inf")).softmax(dim=-1)  # (B, T), 0 at padding
        h = (a[:, None, :] @ z).squeeze(1)  # (B, 1, T) @ (B, T, d) -> (B, 1, d) -> (B, d)
        return self.head(h).squeeze(-1)  # (B, 1) -> (B,)

    def penalty(self) -> Tensor:
        """No explicit regulariser: AdamW's weight decay does the job."""
        return self.query.new_zeros(())
