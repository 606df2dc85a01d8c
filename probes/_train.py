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

from probes._batches import Inputs, inputs, resident_fits
from probes._build import build_probe
from probes._config import ProbeConfig, Task
from probes._device import default_device
from probes._ragged import Ragged

__all__ = ["EpochLog", "TrainResult", "predict", "train_probe"]

WARMUP_FRACTION = 0.02  # of all steps: linear warm-up before the cosine decay
MIN_STD = 1e-6  # features with a smaller standard deviation are left unscaled (std = 1)


@dataclass(frozen=True)
class EpochLog:
    epoch: int  # 0-based; history[e].epoch == e
    train_loss: float  # mean data loss over the epoch's batches (without the explicit penalty)
    val_loss: float  # data loss on the held-out examples after the epoch
    lr: float  # learning rate of the epoch's last step


@dataclass(frozen=True)
class TrainResult:
    probe: nn.Module  # eval mode, weights of `best_epoch`, on the device it was trained on
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
    device: torch.device | str | None = None,
    resident: bool | None = None,
) -> TrainResult:
    """Train a `config.arch` probe on `acts` (n examples) against `targets` (n,): labels in {0, 1} for
    safety (BCE with logits), delegation values in [-1, 1] for DV (squared loss).

    `config.val_fraction` of the examples (stratified by label for safety) are held out; training stops
    after `config.patience` epochs without a lower held-out loss, and the probe returned carries the
    weights of the epoch with the lowest one. `on_epoch` sees each `EpochLog`.

    Trains on `device` (default: `default_device()`, the GPU when there is one) and returns the probe
    there. `resident`: keep the split's tokens on the device (True), stream padded batches from the
    host (False), or (None) keep them when they fit `resident_budget` (never on the CPU). Both give
    the same batches. Deterministic given `seed` on one device; on the CPU bit-identical to the
    pre-GPU trainer. The global torch RNG (of the CPU and of `device`) and the deterministic-algorithms
    setting are restored on return.
    """
    y = _checked_targets(acts, targets, task)
    train_index, val_index = _split(y, task=task, val_fraction=config.val_fraction, seed=seed)
    loss_fn = F.binary_cross_entropy_with_logits if task == "safety" else F.mse_loss
    device = torch.device(device) if device is not None else default_device()
    if resident is None:
        resident = resident_fits(acts, device)
    cuda = (
        [device.index if device.index is not None else torch.cuda.current_device()]
        if device.type == "cuda"
        else []
    )
    with torch.random.fork_rng(devices=cuda), _deterministic_algorithms():
        # ---- setup: probe, inputs, standardisation, optimiser
        torch.random.default_generator.manual_seed(seed)  # parameter initialisation (on the CPU)
        if cuda:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)  # dropout on the GPU
        shuffle = torch.Generator().manual_seed(seed)  # batch order, drawn on the CPU on every device
        probe = build_probe(config, acts.dim).to(device)
        train_x = inputs(acts.subset(train_index), pooled=probe.pooled, device=device, resident=resident)
        val_x = inputs(acts.subset(val_index), pooled=probe.pooled, device=device, resident=resident)
        mean, std = _feature_stats(train_x)
        with torch.no_grad():
            probe.mean.copy_(mean)
            probe.std.copy_(std)
        train_y = torch.from_numpy(y[train_index]).float().to(device)  # (n_train,)
        val_y = torch.from_numpy(y[val_index]).float().to(device)  # (n_val,)
        n_train, batch_size = len(train_index), config.batch_size
        total_steps = config.epochs * math.ceil(n_train / batch_size)
        # `mean` is logistic / ridge regression: its explicit L2 penalty replaces weight decay.
        weight_decay = 0.0 if config.arch == "mean" else config.weight_decay
        # On CUDA the fused kernel: one launch per step instead of a dozen, which is most of a
        # small probe's step there (the CPU keeps the default, bit-identical to the pre-GPU trainer).
        optimizer = torch.optim.AdamW(
            probe.parameters(), lr=config.lr, weight_decay=weight_decay, fused=bool(cuda) or None
        )

        # ---- the loop: one pass over the training examples, then the held-out loss
        history: list[EpochLog] = []
        best_state, best_epoch, best_val_loss = copy.deepcopy(probe.state_dict()), -1, math.inf
        step = 0
        for epoch in range(config.epochs):
            probe.train()
            order = torch.randperm(n_train, generator=shuffle)
            shuffled_y = train_y[order.to(device)]  # (n_train,) targets in batch order: one gather
            order = order.numpy()
            losses: list[Tensor] = []  # read once per epoch: no device sync per step
            for start in range(0, n_train, batch_size):
                batch = order[start : start + batch_size]
                lr = _lr_at(step, total_steps, config.lr)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                x, mask = train_x.batch(batch)
                loss = loss_fn(probe(x, mask), shuffled_y[start : start + batch_size])
                optimizer.zero_grad(set_to_none=True)
                (loss + probe.penalty()).backward()
                optimizer.step()
                losses.append(loss.detach())
                step += 1
            # the float32 batch losses summed in float64 in batch order, as the loss.item() loop did
            sizes = [len(order[start : start + batch_size]) for start in range(0, n_train, batch_size)]
            loss_sum = sum(
                value * size for value, size in zip(torch.stack(losses).tolist(), sizes, strict=True)
            )
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


def predict(
    probe: nn.Module, acts: Ragged, *, task: Task, batch_size: int = 64, resident: bool | None = None
) -> np.ndarray:
    """(n,) float64 scores of `acts` in input order: P(y=1) for safety, the raw value for DV.
    Runs where the probe's parameters are (a probe from `train_probe` stays on its device; one from
    `load_probe` is on the CPU until moved); `resident` as in `train_probe`. Batches are formed in
    length order to keep padding small; the probe's train/eval mode is restored."""
    if task not in ("safety", "dv"):
        raise ValueError(f"task must be 'safety' or 'dv', got {task!r}")
    _check_lengths(acts)
    device = next(probe.parameters()).device
    if resident is None:
        resident = resident_fits(acts, device)
    was_training = probe.training
    probe.eval()
    try:
        x = inputs(acts, pooled=probe.pooled, device=device, resident=resident)
        raw = _raw_outputs(probe, x, batch_size).cpu().double()  # (n,)
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


@torch.no_grad()
def _raw_outputs(probe: nn.Module, inputs: Inputs, batch_size: int) -> Tensor:
    """(n,) float32 raw outputs in input order, on the inputs' device, in batches of similar length."""
    order = np.argsort(inputs.lengths, kind="stable")
    if len(order) == 0:
        return torch.empty(0, device=inputs.device)
    outputs = [probe(*inputs.batch(order[s : s + batch_size])) for s in range(0, len(order), batch_size)]
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))  # output row of each input
    return torch.cat(outputs)[torch.from_numpy(inverse).to(inputs.device)]  # a gather: deterministic


def _feature_stats(inputs: Inputs) -> tuple[Tensor, Tensor]:
    """Per-feature mean and std, accumulated in float64, of what the probe reads: every real token
    (token-level probes) or every pooled vector (pooled probes). Near-constant features get std 1."""
    total, squares, count = inputs.sums()
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
    """torch.use_deterministic_algorithms(True) inside, without filling new memory with NaN; the
    caller's settings restored after.

    The fill guards code that reads memory it never wrote; nothing here does (the probes' weights
    and scores are bit-identical either way). It costs one kernel per allocation: 9,150 fills among
    the 19,575 launches of a short attention fit on a GPU (about 90% of them go with the fill, by
    the operator counts on the CPU), where a step is bound by launches."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill
