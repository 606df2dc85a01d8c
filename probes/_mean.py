"""Mean-pooling probe: the mean of the real tokens and a linear head. Trained with an explicit L2
penalty and no weight decay it is logistic regression (safety) or ridge regression (DV): the paper's
Mean+Ridge configuration."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["MeanProbe"]


class MeanProbe(nn.Module):
    """output = w·mean_t(z_t) + b, with `penalty()` = l2 · ||w||² (the bias is not penalised).

    z_t is token t standardised with the `mean`/`std` buffers (saved with the module). Standardising
    commutes with the mean, so these are equally the statistics of the pooled vectors."""

    pooled = True  # reads only the token mean: a (B, 1, d) batch of pooled vectors gives the same output

    def __init__(
        self, dim: int, *, l2: float = 0.0, mean: Tensor | None = None, std: Tensor | None = None
    ) -> None:
        super().__init__()
        if l2 < 0:
            raise ValueError(f"l2 must be non-negative, got {l2}")
        self.l2 = l2
        self.register_buffer("mean", torch.zeros(dim) if mean is None else mean.detach().float().clone())
        self.register_buffer("std", torch.ones(dim) if std is None else std.detach().float().clone())
        self.head = nn.Linear(dim, 1)  # w, b

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, T, d) token activations, mask (B, T) True at real tokens -> (B,) raw output."""
        z = torch.where(mask[..., None], (x - self.mean) / self.std, 0.0)  # (B, T, d), 0 at padding
        h = z.sum(dim=1) / mask.sum(dim=1, keepdim=True)  # (B, d) / (B, 1) -> (B, d)
        return self.head(h).squeeze(-1)  # (B, 1) -> (B,)

    def penalty(self) -> Tensor:
        """The explicit L2 term added to the training loss: l2 · ||w||²."""
        return self.l2 * self.head.weight.pow(2).sum()
