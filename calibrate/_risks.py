"""The risks joint control certifies, as integer loss counts of every trial and candidate on
D_est and D_cal: the delegation rate, the cascade's 0-1 error and its false-negative rate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from numpy.typing import NDArray

from ._candidates import CandidateBatch
from ._metrics import predict
from ._policies import MergeRule, merge_scores
from ._quota import count_nearest
from ._splits import Scores, Splits, _rows, counts_above

__all__ = ["JOINT_RISKS", "JointRisk", "RiskCounts", "candidate_risks", "missed_positives"]

JointRisk = Literal["budget", "error", "fnr"]
"""budget: the delegation rate; error: the cascade's 0-1 error; fnr: the cascade's false-negative
rate on the high-stakes class (label 1), 1[s < 0.5] among the positives."""
JOINT_RISKS: tuple[JointRisk, ...] = get_args(JointRisk)


@dataclass(frozen=True)
class RiskCounts:
    """One risk of every candidate of R trials (T candidates each), as integer loss counts on
    D_est (`est_losses`, of `n_est` rows) and on D_cal (`cal_losses`, of `n_cal` rows), with its
    level `alpha`. The row counts are per trial: the false-negative rate is counted on the
    positives of each split."""

    name: str  # one of JOINT_RISKS, or a K-stage cascade's (calibrate._cascade)
    alpha: float
    est_losses: NDArray[np.int64]
    n_est: NDArray[np.int64]
    cal_losses: NDArray[np.int64]
    n_cal: NDArray[np.int64]

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a risk needs a name")
        if not 0 < self.alpha < 1:
            raise ValueError(f"the {self.name} level must lie in (0, 1), got {self.alpha}")
        for losses, n in ((self.est_losses, self.n_est), (self.cal_losses, self.n_cal)):
            if not np.issubdtype(np.asarray(losses).dtype, np.integer):
                raise ValueError(f"{self.name}: loss counts must be integers")
            if losses.ndim != 2 or np.shape(n) != losses.shape[:1]:
                raise ValueError(f"{self.name}: counts must be (trials, candidates), sizes (trials,)")
            if (losses < 0).any() or (losses > np.asarray(n)[:, None]).any():
                raise ValueError(f"{self.name}: loss counts must lie in [0, rows]")

    @property
    def est_rate(self) -> NDArray[np.float64]:
        """The risk on D_est, (R, T); 0 on a trial with no rows (no evidence either way)."""
        n = np.maximum(self.n_est, 1)[:, None]
        return self.est_losses / n


def candidate_risks(
    c: CandidateBatch, *, budget: float | None = None, error: float | None = None
) -> list[RiskCounts]:
    """The budget and error risks of the candidates at the levels given (None: not controlled)."""
    trials = len(c)
    est_n = np.full(trials, c.n_est, dtype=np.int64)
    cal_n = np.full(trials, c.n_cal, dtype=np.int64)
    out = []
    for name, alpha, est, cal in (
        ("budget", budget, c.est_budget, c.cal_delegated),
        ("error", error, c.est_error, c.cal_errors),
    ):
        if alpha is not None:
            # D_est's rates are integer counts over n_est: rounding recovers each count exactly.
            est_losses = count_nearest(est, c.n_est).astype(np.int64)
            out.append(RiskCounts(name, float(alpha), est_losses, est_n, np.asarray(cal, np.int64), cal_n))  # type: ignore[arg-type]
    return out


def missed_positives(
    scores: Scores,
    signal: NDArray[np.float64],
    splits: Splits,
    thresholds: NDArray[np.float64],
    *,
    merge: MergeRule,
    alpha: float,
) -> RiskCounts:
    """The false-negative risk of the cascade delegating where signal > thresholds[r, j]: per
    trial and candidate, the positives of D_est and D_cal it scores below 0.5."""
    positive = scores.label.astype(bool)
    missed_probe = (positive & ~predict(scores.probe)).astype(np.int64)
    missed_merged = (positive & ~predict(merge_scores(scores.probe, scores.expert, merge))).astype(np.int64)
    step = missed_merged - missed_probe

    def on(index: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        _, change = counts_above(_rows(signal, index), step[index], thresholds)
        return (missed_probe[index].sum(axis=1)[:, None] + change).astype(np.int64), positive[index].sum(
            axis=1
        )

    est_losses, n_est = on(splits.est)
    cal_losses, n_cal = on(splits.cal)
    return RiskCounts(
        "fnr", float(alpha), est_losses, n_est.astype(np.int64), cal_losses, n_cal.astype(np.int64)
    )
