"""K-stage cascades: the probe, then experts 1..K in order, each asked only about what the stage
before it escalated, and optionally a human for what is still uncertain at the end.

A configuration is a threshold per stage and an abstention margin, (lambda_1..lambda_K, tau).
An input reaches stage k when dv_j > lambda_j for every j <= k (dv_k: the stage's DV score, the
predicted value of replacing the score it reached stage k with by expert k's); its score is that
of the last stage it reached (the probe's when none), and it is abstained on (left to a human)
when that score is within tau of 0.5. Its risks, each a Bernoulli loss per input: the share of
inputs that reach stage k (expert k's budget), the share scored wrong and not abstained on
(the cascade's error), and the share abstained on (the human's budget).

Every configuration of a product grid (per stage: +inf and quantiles of dv_k on D_est; margins
fixed in advance) is certified by joint control (`run_joint_tests`): p = the max of the exact
binomial p-values of the risks given a level, tested in fixed sequence in the order of the same
max-p-value on D_est. So with probability >= 1 - delta every risk with a level holds at every
certified configuration at once, the guarantee of joint control for each stage's budget, the
error and the abstention rate together. Among the certified ones the smallest D_est error is
chosen (then the fewest calls to the last expert, the one before, ..., then the fewest
abstentions). The counts of every configuration come from one weighted histogram per stage
and suffix sums over it: integers, no per-configuration pass over the data.

References
----------
Jung, Brahman, Choi (2025). Trust or Escalate: LLM judges with provable guarantees (cascaded
selective evaluation). Angelopoulos et al. (2021). Learn then Test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ._joint import JointTests, run_joint_tests
from ._ltt import first_by
from ._metrics import predict
from ._policies import threshold_grid
from ._risks import RiskCounts
from ._settings import ControlConfig

__all__ = [
    "ABSTAIN_MARGINS",
    "CASCADE_GRID",
    "CascadeBatch",
    "CascadeGrid",
    "CascadeLevels",
    "CascadeOutcome",
    "CascadeScores",
    "cascade_control_batch",
    "cascade_grid",
    "cascade_outcome",
    "cascade_risks",
]

# Per-stage thresholds of the product grid: quantiles of dv_k on D_est (the grid has G^K cells).
CASCADE_GRID = 10
# Abstention margins: tau = 0 (never abstain) and up to 0.25 (abstain on scores in (0.25, 0.75)).
ABSTAIN_MARGINS: tuple[float, ...] = tuple(round(0.025 * m, 3) for m in range(11))
# Trials counted together: bounds the (trials, configurations) work arrays.
_CHUNK = 64


@dataclass(frozen=True)
class CascadeScores:
    """Scores of the examples of a K-stage cascade: the probe's, each expert's (K, n) in stage
    order, and each stage's DV score (K, n)."""

    label: NDArray[np.int64]
    probe: NDArray[np.float64]
    experts: NDArray[np.float64]
    dv: NDArray[np.float64]

    def __post_init__(self) -> None:
        n = len(self.label)
        if self.experts.ndim != 2 or self.experts.shape != self.dv.shape or self.experts.shape[1] != n:
            raise ValueError(
                f"experts and dv must both be (stages, {n}), got {self.experts.shape}, {self.dv.shape}"
            )
        if self.experts.shape[0] < 1:
            raise ValueError("a cascade needs at least one expert")
        if len(self.probe) != n or not np.isin(self.label, (0, 1)).all():
            raise ValueError("labels must be 0 or 1, one per probe score")
        for name, values in (("probe", self.probe), ("experts", self.experts)):
            if not ((values >= 0) & (values <= 1)).all():
                raise ValueError(f"{name} scores must lie in [0, 1]")
        if not np.isfinite(self.dv).all():
            raise ValueError("dv scores must be finite")

    @property
    def n(self) -> int:
        return len(self.label)

    @property
    def stages(self) -> int:
        return self.experts.shape[0]

    @property
    def stage_scores(self) -> NDArray[np.float64]:
        """(K + 1, n): the probe's scores, then each expert's."""
        return np.concatenate([self.probe[None, :], self.experts], axis=0)


@dataclass(frozen=True)
class CascadeLevels:
    """The levels certified: expert k's budget (None: not controlled), the error, the abstention rate."""

    budgets: tuple[float | None, ...]
    error: float | None = None
    abstain: float | None = None

    def __post_init__(self) -> None:
        named = [*self.budgets, self.error, self.abstain]
        if all(level is None for level in named):
            raise ValueError("give at least one level")
        if not all(level is None or 0 < level < 1 for level in named):
            raise ValueError(f"levels must lie in (0, 1), got {named}")

    def named(self) -> list[tuple[str, float]]:
        """(risk name, level) of every controlled risk, in a fixed order."""
        out = [(f"budget-{k + 1}", b) for k, b in enumerate(self.budgets) if b is not None]
        out += [
            (name, level)
            for name, level in (("error", self.error), ("abstain", self.abstain))
            if level is not None
        ]
        return out


@dataclass(frozen=True)
class CascadeGrid:
    """The configurations of R trials: per trial and stage the thresholds, ascending with +inf
    last, (R, K, G + 1); the abstention margins (M,), 0 first. Configuration t is the flat
    (C-order) index of (g_1, ..., g_K, m) in the shape (G + 1, ..., G + 1, M)."""

    thresholds: NDArray[np.float64]
    margins: NDArray[np.float64]

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.thresholds.shape[2],) * self.thresholds.shape[1] + (self.margins.size,)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def config(self, index: NDArray[np.int64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """The thresholds (R, K) and margins (R,) of configuration index[r] of every trial r."""
        cells = np.unravel_index(index, self.shape)
        rows = np.arange(index.size)
        thresholds = np.stack(
            [self.thresholds[rows, k, cells[k]] for k in range(self.thresholds.shape[1])], axis=1
        )
        return thresholds, self.margins[cells[-1]]


def cascade_grid(
    scores: CascadeScores,
    est: NDArray[np.int64],
    *,
    n_grid: int = CASCADE_GRID,
    margins: Sequence[float] = (0.0,),
) -> CascadeGrid:
    """Per trial (rows of the D_est index `est`) and stage: +inf and `n_grid` quantiles of dv_k
    on D_est, ascending; the margins as given (0 alone: never abstain)."""
    tau = np.asarray(margins, dtype=np.float64)
    if tau.ndim != 1 or tau.size < 1 or tau[0] != 0 or (np.diff(tau) <= 0).any() or tau[-1] >= 0.5:
        raise ValueError(f"margins must start at 0, increase and stay below 0.5, got {list(margins)}")
    per_stage = [threshold_grid(scores.dv[k][est], n_grid)[:, ::-1] for k in range(scores.stages)]
    return CascadeGrid(np.stack(per_stage, axis=1), tau)


def _suffix(hist: NDArray[np.float64], axis: int) -> NDArray[np.float64]:
    """S[g] = sum of hist[a] over a > g along `axis` (0 at the last position)."""
    inclusive = np.flip(np.cumsum(np.flip(hist, axis=axis), axis=axis), axis=axis)
    shifted = np.roll(inclusive, -1, axis=axis)
    index = [slice(None)] * hist.ndim
    index[axis] = -1
    shifted[tuple(index)] = 0
    return shifted


def _reached_sums(
    passes: NDArray[np.int64],
    kept: NDArray[np.int64] | None,
    weights: NDArray[np.int64],
    depth: int,
    size: int,
    m: int,
) -> NDArray[np.int64]:
    """Sum over inputs of weights * 1[g_j < passes_j for j < depth] * 1[tau_m not within kept],
    for every (g_1..g_depth, margin): shape (R, size^depth, M) (M = 1 when `kept` is None)."""
    trials = weights.shape[0]
    dims = [size] * depth + ([m + 1] if kept is not None else [1])
    cells = [passes[j] for j in range(depth)] + ([kept] if kept is not None else [np.zeros_like(weights)])
    flat = np.ravel_multi_index(cells, dims) if cells else np.zeros_like(weights)
    flat = flat + np.arange(trials)[:, None] * int(np.prod(dims))
    hist = np.bincount(flat.ravel(), weights.ravel(), minlength=trials * int(np.prod(dims)))
    hist = hist.reshape(trials, *dims)
    for axis in range(1, depth + 1):
        hist = _suffix(hist, axis)
    if kept is not None:
        hist = _suffix(hist, depth + 1)[..., :m]
    return np.rint(hist).astype(np.int64)


def _broadcast(term: NDArray[np.int64], depth: int, stages: int) -> NDArray[np.int64]:
    """A (R, G^depth, M) term as (R, G^K, M): the later stages' thresholds do not matter to it."""
    shape = term.shape[: depth + 1] + (1,) * (stages - depth) + term.shape[-1:]
    return term.reshape(shape)


def _counts(
    scores: CascadeScores, grid: CascadeGrid, index: NDArray[np.int64]
) -> dict[str, NDArray[np.int64]]:
    """Per trial (rows of `index`) and configuration (flat): how many of the inputs reach each
    stage (`calls-k`), are scored wrong and kept, and are kept (not abstained on)."""
    stages, size, m = scores.stages, grid.thresholds.shape[2], grid.margins.size
    trials = index.shape[0]
    # passes[k][r, i]: how many of stage k's thresholds input i clears (dv > threshold): g_k < passes.
    passes = np.stack(
        [
            (grid.thresholds[:, k, None, :] < scores.dv[k][index][:, :, None]).sum(axis=2)
            for k in range(stages)
        ]
    )
    stage_scores = scores.stage_scores[:, index]  # (K + 1, R, n)
    wrong = (predict(stage_scores) != scores.label[index].astype(bool)[None]).astype(np.int64)
    # kept[j][r, i]: the margins m with m < kept are those at which the stage-j score is kept.
    kept = np.searchsorted(grid.margins, np.abs(stage_scores - 0.5), side="right")
    ones = np.ones((trials, index.shape[1]), np.int64)
    out: dict[str, NDArray[np.int64]] = {}
    full = (trials, *grid.shape)
    for k in range(1, stages + 1):
        calls = _broadcast(_reached_sums(passes, None, ones, k, size, m), k, stages)
        out[f"calls-{k}"] = np.broadcast_to(calls, full).reshape(trials, -1)
    # An input ends at stage j when it reaches j and not j + 1: sum the stage-j terms reached at
    # depth j minus those reached at depth j + 1.
    for name, weight in (("wrong", wrong), ("kept", None)):
        total = np.zeros(full, np.int64)
        for j in range(stages + 1):
            w = ones if weight is None else weight[j]
            total = total + _broadcast(_reached_sums(passes, kept[j], w, j, size, m), j, stages)
            if j < stages:
                total = total - _broadcast(_reached_sums(passes, kept[j], w, j + 1, size, m), j + 1, stages)
        out[name] = total.reshape(trials, -1)
    return out


def cascade_risks(
    scores: CascadeScores,
    grid: CascadeGrid,
    est: NDArray[np.int64],
    cal: NDArray[np.int64],
    levels: CascadeLevels,
) -> list[RiskCounts]:
    """The controlled risks of every configuration, as integer counts on D_est and D_cal."""
    return configuration_risks(scores, grid, est, cal, levels)[0]


def configuration_risks(
    scores: CascadeScores,
    grid: CascadeGrid,
    est: NDArray[np.int64],
    cal: NDArray[np.int64],
    levels: CascadeLevels,
) -> tuple[list[RiskCounts], dict[str, NDArray[np.int64]]]:
    """`cascade_risks`, and the D_est counts of every configuration (selection reads them)."""
    if len(levels.budgets) != scores.stages:
        raise ValueError(f"{len(levels.budgets)} budgets for a cascade of {scores.stages} experts")
    if levels.abstain is not None and grid.margins.size < 2:
        raise ValueError("an abstention level needs abstention margins beyond 0")
    counts = {"est": _counts(scores, grid, est), "cal": _counts(scores, grid, cal)}
    rows = {"est": est.shape, "cal": cal.shape}

    def losses(name: str, part: str) -> NDArray[np.int64]:
        if name.startswith("budget-"):
            return counts[part][f"calls-{name.removeprefix('budget-')}"]
        return counts[part]["wrong"] if name == "error" else rows[part][1] - counts[part]["kept"]

    def n(part: str) -> NDArray[np.int64]:
        return np.full(rows[part][0], rows[part][1], np.int64)

    risks = [
        RiskCounts(name, float(level), losses(name, "est"), n("est"), losses(name, "cal"), n("cal"))
        for name, level in levels.named()
    ]
    return risks, counts["est"]


def selection_keys(
    est_counts: dict[str, NDArray[np.int64]], stages: int, n_est: int
) -> list[NDArray[np.float64]]:
    """What the choice among certified configurations minimises, in order: the D_est error,
    the calls to the last expert, ..., to the first, the abstentions."""
    calls = [est_counts[f"calls-{k}"] for k in range(stages, 0, -1)]
    return [a.astype(np.float64) for a in (est_counts["wrong"], *calls, n_est - est_counts["kept"])]


def choose(accepted: NDArray[np.bool_], keys: list[NDArray[np.float64]]) -> NDArray[np.int64]:
    """Per trial, the accepted configuration minimising `keys` lexicographically, then the
    index; -1 where none is accepted."""
    return first_by(accepted, *keys)


@dataclass(frozen=True)
class CascadeBatch:
    """Joint control of the configurations of R trials: the tests (`JointTests`, in the flat
    configuration index of the grid), and per trial the chosen configuration (`selected`, -1 when
    nothing was certified), its thresholds (R, K) and margin (R,) (NaN when none)."""

    levels: CascadeLevels
    delta: float
    tests: JointTests
    selected: NDArray[np.int64]
    thresholds: NDArray[np.float64]
    margin: NDArray[np.float64]


def cascade_control_batch(
    scores: CascadeScores,
    grid: CascadeGrid,
    est: NDArray[np.int64],
    cal: NDArray[np.int64],
    levels: CascadeLevels,
    *,
    control: ControlConfig | None = None,
) -> CascadeBatch:
    """Certify every configuration whose controlled risks all hold (max-p-value, fixed sequence
    in D_est order by default) and choose the certified one with the smallest D_est error, then
    the fewest calls to the last expert, ..., the first, then the fewest abstentions."""
    control = control or ControlConfig()
    risks, est_counts = configuration_risks(scores, grid, est, cal, levels)
    keys = selection_keys(est_counts, scores.stages, est.shape[1])
    members = np.ones(keys[0].shape, bool)  # no Pareto filter: G^K M points, ordered by D_est
    tested = run_joint_tests(risks, members, tuple(keys[:-1]), control)
    selected = choose(tested.certified, keys)
    thresholds, margin = grid.config(np.maximum(selected, 0))
    none = selected < 0
    return CascadeBatch(
        levels=levels,
        delta=float(control.delta),
        tests=tested,
        selected=selected,
        thresholds=np.where(none[:, None], np.nan, thresholds),
        margin=np.where(none, np.nan, margin),
    )


@dataclass(frozen=True)
class CascadeOutcome:
    """What one configuration per trial did on m inputs: calls to each expert (R, K), inputs
    scored wrong and kept (R,), inputs abstained on (R,)."""

    calls: NDArray[np.int64]
    wrong: NDArray[np.int64]
    abstained: NDArray[np.int64]
    n: int


def cascade_outcome(
    scores: CascadeScores,
    index: NDArray[np.int64],
    thresholds: NDArray[np.float64],
    margin: NDArray[np.float64],
) -> CascadeOutcome:
    """Run the cascade with trial r's thresholds (R, K) and margin (R,) on the inputs index[r],
    directly (input by input: the reference the configuration counts are checked against)."""
    stages = scores.stages
    reach = np.ones(index.shape, bool)
    depth = np.zeros(index.shape, np.int64)
    calls = np.zeros((index.shape[0], stages), np.int64)
    for k in range(stages):
        reach = reach & (scores.dv[k][index] > thresholds[:, k : k + 1])
        calls[:, k] = reach.sum(axis=1)
        depth = np.where(reach, k + 1, depth)
    final = np.take_along_axis(scores.stage_scores[:, index], depth[None], axis=0)[0]
    abstain = np.abs(final - 0.5) < margin[:, None]
    wrong = (predict(final) != scores.label[index].astype(bool)) & ~abstain
    return CascadeOutcome(calls, wrong.sum(axis=1), abstain.sum(axis=1), index.shape[1])
