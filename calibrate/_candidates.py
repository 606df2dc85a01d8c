"""Per-threshold statistics of calibration splits: the input of the Learn-then-Test controllers."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

import numpy as np
from numpy.typing import NDArray

__all__ = ["CandidateBatch", "Candidates"]


@dataclass(frozen=True)
class Candidates:
    """Per-threshold statistics of one calibration split (D_est for optimisation, D_cal for tests).

    Attributes
    ----------
    thresholds : float array of shape (T,)
        Most conservative first; thresholds[0] = +inf means "never delegate".
    est_budget : float array (T,)
        Fraction delegated on D_est.
    est_objective : float array (T,)
        Empirical objective risk on D_est (1 - AUROC, or 0-1 error).
    est_error : float array (T,)
        Empirical 0-1 error of the cascade on D_est.
    cal_delegated, cal_errors : int arrays (T,)
        Delegation and 0-1 error counts on D_cal.
    n_est, n_cal : int
    """

    thresholds: NDArray[np.float64]
    est_budget: NDArray[np.float64]
    est_objective: NDArray[np.float64]
    est_error: NDArray[np.float64]
    cal_delegated: NDArray[np.int64]
    cal_errors: NDArray[np.int64]
    n_est: int
    n_cal: int

    def __post_init__(self) -> None:
        _check_candidates(self)


def _check_candidates(c: Candidates | CandidateBatch) -> None:
    """Shapes agree, never-delegate (+inf) is a candidate, rates lie in [0, 1] and D_cal counts
    are integers in [0, n_cal]. est_objective may be NaN where no objective was computed."""
    shape = np.shape(c.thresholds)
    for name in _FIELDS:
        if np.shape(getattr(c, name)) != shape:
            raise ValueError(f"{name} has shape {np.shape(getattr(c, name))}, thresholds {shape}")
    if np.isnan(c.thresholds).any() or not np.isposinf(c.thresholds).any(axis=-1).all():
        raise ValueError("thresholds must be numbers and include +inf (never delegate)")
    for name in ("est_budget", "est_error"):
        values = np.asarray(getattr(c, name))
        if not ((values >= 0) & (values <= 1)).all():
            raise ValueError(f"{name} must lie in [0, 1]")
    for name in ("cal_delegated", "cal_errors"):
        counts = np.asarray(getattr(c, name))
        if (
            not np.issubdtype(counts.dtype, np.integer)
            or counts.min(initial=0) < 0
            or counts.max(initial=0) > c.n_cal
        ):
            raise ValueError(f"{name} must be integer counts in [0, n_cal]")


# The per-threshold arrays of Candidates (everything but the split sizes).
_FIELDS = tuple(f.name for f in fields(Candidates) if f.name not in ("n_est", "n_cal"))


@dataclass(frozen=True)
class CandidateBatch(Sequence[Candidates]):
    """The `Candidates` of R calibration splits, as (R, T) arrays; indexing gives one trial."""

    thresholds: NDArray[np.float64]
    est_budget: NDArray[np.float64]
    est_objective: NDArray[np.float64]
    est_error: NDArray[np.float64]
    cal_delegated: NDArray[np.int64]
    cal_errors: NDArray[np.int64]
    n_est: int
    n_cal: int

    def __post_init__(self) -> None:
        _check_candidates(self)

    @classmethod
    def stack(cls, items: Sequence[Candidates]) -> CandidateBatch:
        if len({(c.thresholds.size, c.n_est, c.n_cal) for c in items}) != 1:
            raise ValueError("candidates to stack need equal threshold counts and split sizes")
        arrays = {f: np.stack([getattr(c, f) for c in items]) for f in _FIELDS}
        return cls(**arrays, n_est=items[0].n_est, n_cal=items[0].n_cal)

    def __len__(self) -> int:
        return self.thresholds.shape[0]

    def __getitem__(self, r: int) -> Candidates:  # type: ignore[override]
        if not isinstance(r, int | np.integer):
            raise TypeError("index a CandidateBatch with an integer trial number")
        return Candidates(**{f: getattr(self, f)[r] for f in _FIELDS}, n_est=self.n_est, n_cal=self.n_cal)

    def __iter__(self) -> Iterator[Candidates]:
        return (self[r] for r in range(len(self)))
