"""Family-wise error rate control over a family of p-values.

Each procedure is a small strategy: `run(p_values, delta)` for one family, and `run_batch` for
R families at once (rows of a 2-D array, NaN marking positions outside a row's family). `run`
is `run_batch` on one row, so there is one implementation of each procedure. p-values arrive
in the order the caller fixed in advance; only fixed-sequence testing uses that order.

References
----------
Bauer (1991). Multiple testing in clinical trials. (fixed-sequence testing)
Holm (1979). A simple sequentially rejective multiple test procedure.
Wiens (2003). A fixed sequence Bonferroni procedure for testing multiple endpoints. (fallback)
Bretz, Maurer, Brannath, Posch (2009). A graphical approach to sequentially rejective multiple
test procedures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "FWER_METHODS",
    "Bonferroni",
    "FWERBatch",
    "FWERMethod",
    "FWERProcedure",
    "FWERResult",
    "Fallback",
    "FixedSequence",
    "Holm",
    "control_fwer",
    "fwer_procedure",
]

FWERMethod = Literal["fixed-sequence", "fallback", "bonferroni", "holm"]
FWER_METHODS: tuple[str, ...] = get_args(FWERMethod)


@dataclass(frozen=True)
class FWERResult:
    """Outcome of one FWER procedure on one family.

    Attributes
    ----------
    rejected : bool array of shape (m,)
        Which hypotheses were rejected, in the caller's index space.
    tested : int array
        Indices in the order they were tested (those never reached are absent).
    levels : float array, aligned with `tested`
        The local significance level each tested hypothesis faced.
    stopped_at : int or None
        Position in `tested` of the first non-rejection, None if nothing failed.
    """

    rejected: NDArray[np.bool_]
    tested: NDArray[np.int64]
    levels: NDArray[np.float64]
    stopped_at: int | None

    @property
    def n_rejected(self) -> int:
        return int(self.rejected.sum())


@dataclass(frozen=True)
class FWERBatch:
    """Outcome of one FWER procedure on R families (rows).

    rejected (R, m) bool; order (R, m) positions in testing order, of which the first
    n_tested[r] were tested; levels (R, m) aligned with `order` (NaN where not tested);
    stopped_at (R,) position in `order` of the first non-rejection, -1 if none.
    """

    rejected: NDArray[np.bool_]
    order: NDArray[np.int64]
    n_tested: NDArray[np.int64]
    levels: NDArray[np.float64]
    stopped_at: NDArray[np.int64]

    def row(self, r: int) -> FWERResult:
        n = int(self.n_tested[r])
        stop = int(self.stopped_at[r])
        return FWERResult(
            rejected=self.rejected[r],
            tested=self.order[r, :n],
            levels=self.levels[r, :n],
            stopped_at=None if stop < 0 else stop,
        )


class FWERProcedure(Protocol):
    name: str

    def run_batch(self, p_values: ArrayLike, delta: float) -> FWERBatch: ...

    def run(self, p_values: ArrayLike, delta: float) -> FWERResult: ...


def _prepare(p_values: ArrayLike, delta: float) -> NDArray[np.float64]:
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"p_values must be two-dimensional (families, hypotheses), got shape {p.shape}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    return p


def _first(mask: NDArray[np.bool_]) -> NDArray[np.int64]:
    """Index of the first True per row, -1 where there is none."""
    if mask.shape[1] == 0:
        return np.full(mask.shape[0], -1, dtype=np.int64)
    return np.where(mask.any(axis=1), mask.argmax(axis=1), -1).astype(np.int64)


class _Procedure:
    name: str

    def run_batch(self, p_values: ArrayLike, delta: float) -> FWERBatch:
        raise NotImplementedError

    def run(self, p_values: ArrayLike, delta: float) -> FWERResult:
        p = np.asarray(p_values, dtype=np.float64)
        if p.ndim != 1:
            raise ValueError(f"p_values must be one-dimensional, got shape {p.shape}")
        if np.isnan(p).any():
            raise ValueError("p_values must not contain NaN")
        return self.run_batch(p[None, :], delta).row(0)


class FixedSequence(_Procedure):
    """Fixed-sequence testing: test H_0, H_1, ... at level delta; stop at the first p > delta.

    Valid without any correction because a hypothesis is tested only when all earlier ones
    were rejected. Starting from one end only: a multi-start variant that tests each start
    at delta would double the error rate. In a batch, each row's family is its non-NaN prefix.
    """

    name = "fixed-sequence"

    def run_batch(self, p_values: ArrayLike, delta: float) -> FWERBatch:
        p = _prepare(p_values, delta)
        in_family = ~np.isnan(p)
        if (np.diff(in_family.astype(np.int8), axis=1) > 0).any():
            raise ValueError("fixed-sequence testing needs each row's family (non-NaN) to be a prefix")
        position = np.arange(p.shape[1])
        stop = _first(in_family & ~(p <= delta))
        n_tested = np.where(stop >= 0, stop + 1, in_family.sum(axis=1))
        rejected = in_family & ((stop < 0)[:, None] | (position[None, :] < stop[:, None]))
        return FWERBatch(
            rejected=rejected,
            order=np.broadcast_to(position, p.shape).astype(np.int64),
            n_tested=n_tested.astype(np.int64),
            levels=np.where(position[None, :] < n_tested[:, None], delta, np.nan),
            stopped_at=stop,
        )


class Fallback(_Procedure):
    """The fallback procedure, a chain graph: H_j gets the initial level delta w_j, w_j = 2^-(j+1)
    (the last hypothesis of the family also takes the remainder, so the weights sum to 1), plus
    the whole level of H_{j-1} when H_{j-1} was rejected; reject H_j iff p_j <= its level.

    Unlike fixed-sequence testing it goes on past a failure, at a lower level. Valid: it is the
    graphical procedure of Bretz et al. (2009) on the chain H_0 -> H_1 -> ... with weights w,
    a shortcut of closed testing with weighted Bonferroni tests, so the FWER is at most delta
    for any dependence between the p-values (Wiens 2003; Wiens and Dmitrienko 2005). Fixed
    sequence is the same chain with w = (1, 0, 0, ...): more power when the order is right.
    """

    name = "fallback"

    def run_batch(self, p_values: ArrayLike, delta: float) -> FWERBatch:
        p = _prepare(p_values, delta)
        in_family = ~np.isnan(p)
        if (np.diff(in_family.astype(np.int8), axis=1) > 0).any():
            raise ValueError("fallback testing needs each row's family (non-NaN) to be a prefix")
        rows, width = p.shape
        m = in_family.sum(axis=1)
        position = np.arange(width)
        weights = np.where(position[None, :] < m[:, None], 0.5 ** (position[None, :] + 1.0), 0.0)
        last = np.maximum(m - 1, 0)
        # The last member takes what the halving left, 2^-(m-1) in all: the weights sum to 1.
        if width:  # an empty family (no column) has no last member
            weights[np.arange(rows), last] = np.where(m > 0, 0.5**last, 0.0)
        levels = np.full(p.shape, np.nan)
        rejected = np.zeros(p.shape, bool)
        carried = np.zeros(rows)
        for j in range(width):
            level = delta * weights[:, j] + carried
            levels[:, j] = np.where(in_family[:, j], level, np.nan)
            rejected[:, j] = in_family[:, j] & (p[:, j] <= level)
            carried = np.where(rejected[:, j], level, 0.0)
        return FWERBatch(
            rejected=rejected,
            order=np.broadcast_to(position, p.shape).astype(np.int64),
            n_tested=m.astype(np.int64),
            levels=levels,
            stopped_at=_first(in_family & ~rejected),
        )


class Bonferroni(_Procedure):
    """Bonferroni: reject every H_j with p_j <= delta / m."""

    name = "bonferroni"

    def run_batch(self, p_values: ArrayLike, delta: float) -> FWERBatch:
        p = _prepare(p_values, delta)
        in_family = ~np.isnan(p)
        m = np.maximum(in_family.sum(axis=1), 1)
        level = (delta / m)[:, None]
        return FWERBatch(
            rejected=in_family & (p <= level),
            order=np.broadcast_to(np.arange(p.shape[1]), p.shape).astype(np.int64),
            n_tested=in_family.sum(axis=1).astype(np.int64),
            levels=np.where(in_family, level, np.nan),
            stopped_at=np.full(p.shape[0], -1, dtype=np.int64),
        )


class Holm(_Procedure):
    """Holm step-down: sort p ascending, reject p_(i) <= delta / (m - i) for i = 0, 1, ... until one fails."""

    name = "holm"

    def run_batch(self, p_values: ArrayLike, delta: float) -> FWERBatch:
        p = _prepare(p_values, delta)
        m = (~np.isnan(p)).sum(axis=1)
        order = np.argsort(p, axis=1, kind="stable")  # NaN (outside the family) sorts last
        p_sorted = np.take_along_axis(p, order, axis=1)
        step = np.arange(p.shape[1])[None, :]
        in_family = step < m[:, None]
        with np.errstate(divide="ignore"):
            levels = np.where(in_family, delta / (m[:, None] - step), np.nan)
        stop = _first(in_family & ~(p_sorted <= levels))
        n_tested = np.where(stop >= 0, stop + 1, m)
        rejected_sorted = in_family & ((stop < 0)[:, None] | (step < stop[:, None]))
        rejected = np.zeros_like(rejected_sorted)
        np.put_along_axis(rejected, order, rejected_sorted, axis=1)
        return FWERBatch(
            rejected=rejected,
            order=order.astype(np.int64),
            n_tested=n_tested.astype(np.int64),
            levels=np.where(step < n_tested[:, None], levels, np.nan),
            stopped_at=stop,
        )


_PROCEDURES: dict[str, type[_Procedure]] = {
    FixedSequence.name: FixedSequence,
    Fallback.name: Fallback,
    Bonferroni.name: Bonferroni,
    Holm.name: Holm,
}


def fwer_procedure(method: FWERMethod | FWERProcedure) -> FWERProcedure:
    """A procedure instance from its name (or the instance itself)."""
    if isinstance(method, str):
        if method not in _PROCEDURES:
            raise ValueError(f"unknown FWER method {method!r}; choose one of {FWER_METHODS}")
        return _PROCEDURES[method]()
    return method


def control_fwer(
    p_values: ArrayLike, delta: float, method: FWERMethod | FWERProcedure = "fixed-sequence"
) -> FWERResult:
    """Run an FWER procedure (by name or instance) at level delta over one family of ordered p-values."""
    return fwer_procedure(method).run(p_values, delta)
