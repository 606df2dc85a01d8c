"""MLP probe: the mean of the real tokens through a one-hidden-layer perceptron (appendix "Probe
Architecture Ablation", MLP+MLP)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["MLPProbe"]


class MLPProbe(nn.Module):
    """output = Linear(h, 1)(dropout(GELU(Linear(d, h)(mean_t z_t)))).

    z_t is token t standardised with the `mean`/`std` buffers (saved with the module). Standardising
    commutes with the mean, so these are equally the statistics of the pooled vectors."""

    pooled = True  # reads only the token mean: a (B, 1, d) batch of pooled vectors gives the same output

    def __init__(
        self,
        dim: int,
        *,
        hidden: int = 256,
        dropout: float = 0.0,
        mean: Tensor | None = None,
        std: Tensor | None = None,
    ) -> None:
        super().__init__()
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.register_buffer("mean", torch.zeros(dim) if mean is None else mean.detach().float().clone())
        self.register_buffer("std", torch.ones(dim) if std is None else std.detach().float().clone())
        self.fc = nn.Linear(dim, hidden)
        self.gelu = nn.GELU()
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, T, d) token activations, mask (B, T) True at real tokens -> (B,) raw output."""
        z = torch.where(mask[..., None], (x - self.mean) / self.std, 0.0)  # (B, T, d), 0 at padding
        h = z.sum(dim=1) / mask.sum(dim=1, keepdim=True)  # (B, d) / (B, 1) -> (B, d)
        h = self.dropout(self.gelu(self.fc(h)))  # (B, hidden)
        return self.head(h).squeeze(-1)  # (B, 1) -> (B,)

    def penalty(self) -> Tensor:
        """No explicit regulariser: AdamW's weight decay (and dropout) do the job."""
        return self.head.weight.new_zeros(())
