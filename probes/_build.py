"""The probe interface and its builder: one plain function from a `ProbeConfig` to a module."""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

from torch import Tensor, nn

from probes._attention import AttentionProbe
from probes._config import ProbeConfig
from probes._mean import MeanProbe
from probes._mlp import MLPProbe
from probes._softmax import SoftmaxProbe

__all__ = ["Probe", "build_probe"]


@runtime_checkable
class Probe(Protocol):
    """What the trainer needs of a probe beyond being an `nn.Module`. A structural type that documents a
    contract, not a base class: the four architectures share no implementation.

    - `probe(x, mask)`: x (B, T, d) float32 token activations, mask (B, T) bool, True at real tokens
      (every row has at least one) -> (B,) raw outputs: a logit for safety, a value for DV. Values at
      masked positions never change the output, whatever they are.
    - `pooled`: True when the output depends only on the mean of the real tokens, so the trainer may
      feed (B, 1, d) pre-pooled vectors with an all-True mask instead of padded token batches.
    - `penalty()`: an explicit regulariser added to the training loss (zero except for `mean`).
    - `mean`, `std`: (d,) buffers standardising each feature before anything else; saved with the module.
    """

    pooled: ClassVar[bool]
    mean: Tensor
    std: Tensor

    def __call__(self, x: Tensor, mask: Tensor) -> Tensor: ...

    def penalty(self) -> Tensor: ...


def build_probe(
    config: ProbeConfig, dim: int, *, mean: Tensor | None = None, std: Tensor | None = None
) -> nn.Module:
    """A freshly initialised probe of `config.arch` over `dim`-dimensional activations (it follows
    `Probe`). `mean`/`std` (shape (dim,)) standardise the inputs; left out, they are 0 and 1."""
    if dim < 1:
        raise ValueError(f"dim must be at least 1, got {dim}")
    for name, value in (("mean", mean), ("std", std)):
        if value is not None and tuple(value.shape) != (dim,):
            raise ValueError(f"{name} must have shape ({dim},), got {tuple(value.shape)}")
    if std is not None and not bool((std > 0).all()):
        raise ValueError("std must be positive in every feature")
    match config.arch:
        case "attention":
            return AttentionProbe(dim, mean=mean, std=std)
        case "softmax":
            return SoftmaxProbe(dim, temperature=config.temperature, mean=mean, std=std)
        case "mean":
            return MeanProbe(dim, l2=config.l2, mean=mean, std=std)
        case "mlp":
            return MLPProbe(dim, hidden=config.mlp_hidden, dropout=config.dropout, mean=mean, std=std)
    raise ValueError(f"unknown arch {config.arch!r}")  # unreachable: ProbeConfig validates arch
