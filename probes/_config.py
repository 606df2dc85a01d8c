"""Probe hyperparameters: one frozen value object shared by the four architectures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["ARCHS", "BATCH_TOKENS", "MAX_BATCH_TOKENS", "TASKS", "Arch", "ProbeConfig", "Task"]

Arch = Literal["attention", "softmax", "mean", "mlp"]
Task = Literal["safety", "dv"]  # safety: BCE on labels; dv: squared loss on delegation values
ARCHS: tuple[Arch, ...] = get_args(Arch)
TASKS: tuple[Task, ...] = get_args(Task)

# Padded tokens in one forward pass at most, by default: it bounds a pass's activation memory.
BATCH_TOKENS = 8192
MAX_BATCH_TOKENS = 1 << 20  # the most a user may ask for (`--batch-tokens`)


@dataclass(frozen=True, kw_only=True)
class ProbeConfig:
    arch: Arch = "attention"
    lr: float = 1e-3  # AdamW peak learning rate, cosine-decayed to 0 over `epochs`
    weight_decay: float = 1e-2  # AdamW decoupled decay (all architectures except `mean`)
    l2: float = 1e-3  # `mean` only: explicit L2 penalty, making it logistic / ridge regression
    epochs: int = 60
    batch_size: int = 32
    patience: int = 10  # early stopping: epochs without a better validation loss
    val_fraction: float = 0.2  # held out of the training examples for early stopping
    temperature: float = 1.0  # `softmax` only: temperature of the softmax over token scores
    mlp_hidden: int = 256  # `mlp` only: hidden width
    dropout: float = 0.0  # `mlp` only

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        for name in ("lr", "temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("epochs", "batch_size", "patience", "mlp_hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
