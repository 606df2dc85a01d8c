"""Training a probe: split, standardise, AdamW with a cosine schedule, early stopping on the held-out
loss; and `predict` for scoring with a trained probe.

`train_probe` reads top to bottom: setup (split, inputs, statistics, probe, optimiser), the epoch loop,
then the best epoch's weights restored. Saving is the caller's business (`TrainResult.probe` is a plain
`nn.Module` whose `state_dict` includes the standardisation buffers).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from probes._build import build_probe
from probes._config import ProbeConfig, Task
from probes._ragged import Ragged

__all__ = ["EpochLog", "TrainResult", "predict", "train_probe"]

WARMUP_FRACTION = 0.02  # of all steps: linear warm-up before the cosine decay
MIN_STD = 1e-6  # features with a smaller standard deviation are left unscaled (std = 1)

# What a probe reads: Ragged token activations, or (n, d) mean-pooled vectors for `pooled` probes
# (mean, mlp), gathered once so an epoch costs one index per batch instead of padding every example.
Inputs = Ragged | Tensor


@dataclass(frozen=True)
class EpochLog:
    epoch: int  # 0-based; history[e].epoch == e
    train_loss: float  # mean data loss over the epoch's batches (without the explicit penalty)
    val_loss: float  # data loss on the held-out examples after the epoch
    lr: float  # learning rate of the epoch's last step


@dataclass(frozen=True)
class TrainResult:
    probe: nn.Module  # eval mode, weights of `best_epoch`
    best_epoch: int
    best_val_loss: float  # == history[best_epoch].val_loss == min over history
    history: tuple[EpochLog, ...]  # one entry per epoch run (fewer than config.epochs if stopped early)
    n_train: int
    n_val: int
    train_index: np.ndarray = field(compare=False, repr=False)  # (n_train,) rows of `acts` trained on
    val_index: np.ndarray = field(compare=False, repr=False)  # (n_val,) rows held out for early stopping


def train_probe(
    acts: Ragged,
    targets: np.ndarray,
    *,
    task: Task,
    config: ProbeConfig,
    seed: int,
    on_epoch: Callable[[EpochLog], None] | None = None,
) -> TrainResult:
    """Train a `config.arch` probe on `acts` (n examples) against `targets` (n,): labels in {0, 1} for
    safety (BCE with logits), delegation values in [-1, 1] for DV (squared loss).

    `config.val_fraction` of the examples (stratified by label for safety) are held out; training stops
    after `config.patience` epochs without a lower held-out loss, and the probe returned carries the
    weights of the epoch with the lowest one. Deterministic given `seed` on CPU; the global torch RNG
    and the deterministic-algorithms setting are restored on return. `on_epoch` sees each `EpochLog`.
    """
    y = _checked_targets(acts, targets, task)
    train_index, val_index = _split(y, task=task, val_fraction=config.val_fraction, seed=seed)
    loss_fn = F.binary_cross_entropy_with_logits if task == "safety" else F.mse_loss
    with torch.random.fork_rng(devices=[]), _deterministic_algorithms():
        # ---- setup: probe, inputs, standardisation, optimiser
        torch.manual_seed(seed)  # parameter initialisation and dropout
        shuffle = torch.Generator().manual_seed(seed)  # batch order
        probe = build_probe(config, acts.dim)
        train_x = _inputs(acts.subset(train_index), pooled=probe.pooled)
        val_x = _inputs(acts.subset(val_index), pooled=probe.pooled)
        mean, std = _feature_stats(train_x)
        with torch.no_grad():
            probe.mean.copy_(mean)
            probe.std.copy_(std)
        train_y = torch.from_numpy(y[train_index]).float()  # (n_train,)
        val_y = torch.from_numpy(y[val_index]).float()  # (n_val,)
        n_train, batch_size = len(train_index), config.batch_size
        total_steps = config.epochs * math.ceil(n_train / batch_size)
        # `mean` is logistic / ridge regression: its explicit L2 penalty replaces weight decay.
        weight_decay = 0.0 if config.arch == "mean" else config.weight_decay
        optimizer = torch.optim.AdamW(probe.parameters(), lr=config.lr, weight_decay=weight_decay)

        # ---- the loop: one pass over the training examples, then the held-out loss
        history: list[EpochLog] = []
        best_state, best_epoch, best_val_loss = copy.deepcopy(probe.state_dict()), -1, math.inf
        step = 0
        for epoch in range(config.epochs):
            probe.train()
            order = torch.randperm(n_train, generator=shuffle).numpy()
            loss_sum = 0.0
            for start in range(0, n_train, batch_size):
                batch = order[start : start + batch_size]
                lr = _lr_at(step, total_steps, config.lr)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                x, mask = _batch(train_x, batch)
                loss = loss_fn(probe(x, mask), train_y[batch])
                optimizer.zero_grad(set_to_none=True)
                (loss + probe.penalty()).backward()
                optimizer.step()
                loss_sum += loss.item() * len(batch)
                step += 1
            probe.eval()
            val_loss = loss_fn(_raw_outputs(probe, val_x, batch_size), val_y).item()
            log = EpochLog(epoch=epoch, train_loss=loss_sum / n_train, val_loss=val_loss, lr=lr)
            history.append(log)
            if on_epoch is not None:
                on_epoch(log)
            if not (math.isfinite(log.train_loss) and math.isfinite(val_loss)):
                raise FloatingPointError(f"non-finite loss at epoch {epoch}: {log}; lower config.lr?")
            if val_loss < best_val_loss:
                best_state, best_epoch, best_val_loss = copy.deepcopy(probe.state_dict()), epoch, val_loss
            elif epoch - best_epoch >= config.patience:
                break

        # ---- the result: the best epoch's weights (a deep copy, so later steps never touched them)
        probe.load_state_dict(best_state)
        probe.eval()
    return TrainResult(
        probe=probe,
        best_epoch=best_epoch,
        best_val_loss=best_val_loss,
        history=tuple(history),
        n_train=n_train,
        n_val=len(val_index),
        train_index=train_index,
        val_index=val_index,
    )


def predict(probe: nn.Module, acts: Ragged, *, task: Task, batch_size: int = 64) -> np.ndarray:
    """(n,) float64 scores of `acts` in input order: P(y=1) for safety, the raw value for DV.
    Batches are formed in length order to keep padding small; the probe's train/eval mode is restored."""
    if task not in ("safety", "dv"):
        raise ValueError(f"task must be 'safety' or 'dv', got {task!r}")
    _check_lengths(acts)
    was_training = probe.training
    probe.eval()
    try:
        raw = _raw_outputs(probe, _inputs(acts, pooled=probe.pooled), batch_size).double()  # (n,)
    finally:
        probe.train(was_training)
    return (torch.sigmoid(raw) if task == "safety" else raw).numpy()


# ---- helpers


def _lr_at(step: int, total_steps: int, peak: float) -> float:
    """Linear warm-up over the first WARMUP_FRACTION of the steps, then cosine decay towards 0."""
    warmup = max(1, round(WARMUP_FRACTION * total_steps))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)  # in [0, 1)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


def _inputs(acts: Ragged, *, pooled: bool) -> Inputs:
    """What the probe reads: `acts` itself, or its (n, d) mean-pooled vectors for pooled probes."""
    return torch.from_numpy(acts.mean_pooled()) if pooled else acts


def _batch(inputs: Inputs, index: np.ndarray) -> tuple[Tensor, Tensor]:
    """x (B, T, d) float32 and mask (B, T) bool for the examples `index`."""
    if isinstance(inputs, Ragged):
        return inputs.padded(index)
    x = inputs[torch.from_numpy(index)][:, None, :]  # (B, d) -> (B, 1, d), one "token": the mean
    return x, torch.ones(x.shape[:2], dtype=torch.bool)  # (B, 1)


@torch.no_grad()
def _raw_outputs(probe: nn.Module, inputs: Inputs, batch_size: int) -> Tensor:
    """(n,) float32 raw outputs in input order, computed in batches of similar length."""
    n = len(inputs)
    lengths = inputs.length if isinstance(inputs, Ragged) else np.ones(n, dtype=np.int64)
    order = np.argsort(lengths, kind="stable")
    out = torch.empty(n)
    for start in range(0, n, batch_size):
        batch = order[start : start + batch_size]
        out[torch.from_numpy(batch)] = probe(*_batch(inputs, batch))
    return out


def _feature_stats(inputs: Inputs) -> tuple[Tensor, Tensor]:
    """Per-feature mean and std, accumulated in float64, of what the probe reads: every real token
    (token-level probes) or every pooled vector (pooled probes). Near-constant features get std 1."""
    if isinstance(inputs, Ragged):
        total, squares = np.zeros(inputs.dim), np.zeros(inputs.dim)
        for i in range(len(inputs)):
            tokens = inputs.example(i).astype(np.float64)  # (T_i, d)
            total += tokens.sum(axis=0)
            squares += np.square(tokens).sum(axis=0)
        count = float(inputs.length.sum())
    else:
        rows = inputs.double().numpy()  # (n, d)
        total, squares, count = rows.sum(axis=0), np.square(rows).sum(axis=0), float(len(rows))
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - np.square(mean), 0.0))
    std = np.where(std < MIN_STD, 1.0, std)
    return torch.from_numpy(mean).float(), torch.from_numpy(std).float()


def _split(y: np.ndarray, *, task: Task, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) sorted int64 indices; val takes `val_fraction` of each label (safety) or of all (DV)."""
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(y == label) for label in (0, 1)] if task == "safety" else [np.arange(len(y))]
    val = np.sort(np.concatenate([rng.permutation(g)[: round(val_fraction * len(g))] for g in groups]))
    train = np.setdiff1d(np.arange(len(y)), val)
    if len(val) == 0 or len(train) == 0:
        raise ValueError(
            f"{len(y)} examples with val_fraction={val_fraction} leave {len(train)} to train "
            f"and {len(val)} to validate; both need at least one"
        )
    return train.astype(np.int64), val.astype(np.int64)


def _checked_targets(acts: Ragged, targets: np.ndarray, task: Task) -> np.ndarray:
    """`targets` as float64 (n,), after checking it against `acts` and `task`."""
    _check_lengths(acts)
    y = np.asarray(targets, dtype=np.float64)
    if y.shape != (len(acts),):
        raise ValueError(f"targets must have shape ({len(acts)},), got {y.shape}")
    if task == "safety":
        if not np.isin(y, (0.0, 1.0)).all():
            raise ValueError("safety targets must be labels in {0, 1}")
    elif task == "dv":
        if not np.isfinite(y).all():
            raise ValueError("DV targets must be finite")
    else:
        raise ValueError(f"task must be 'safety' or 'dv', got {task!r}")
    return y


def _check_lengths(acts: Ragged) -> None:
    if len(acts) and int(acts.length.min()) < 1:
        raise ValueError("every example needs at least one token")


@contextmanager
def _deterministic_algorithms() -> Iterator[None]:
    """torch.use_deterministic_algorithms(True) inside, the caller's setting restored after."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
