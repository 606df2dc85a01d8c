"""Family-wise error rate control over a family of p-values.

Each procedure is a small strategy with one method, `run(p_values, delta)`, that returns an
`FWERResult`. `p_values` arrive in the order that the caller fixed in advance; only
fixed-sequence testing uses that order (Bonferroni and Holm are order-free).

References
----------
Bauer (1991). Multiple testing in clinical trials. (fixed-sequence testing)
Holm (1979). A simple sequentially rejective multiple test procedure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "FWER_METHODS",
    "Bonferroni",
    "FWERMethod",
    "FWERProcedure",
    "FWERResult",
    "FixedSequence",
    "Holm",
    "control_fwer",
]

FWERMethod = Literal["fixed-sequence", "bonferroni", "holm"]
FWER_METHODS: tuple[str, ...] = get_args(FWERMethod)


@dataclass(frozen=True)
class FWERResult:
    """Outcome of one FWER procedure.

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


class FWERProcedure(Protocol):
    name: str

    def run(self, p_values: ArrayLike, delta: float) -> FWERResult: ...


def _prepare(p_values: ArrayLike, delta: float) -> NDArray[np.float64]:
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError(f"p_values must be one-dimensional, got shape {p.shape}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    return p


class FixedSequence:
    """Fixed-sequence testing: test H_0, H_1, ... at level delta; stop at the first p > delta.

    Valid without any correction because a hypothesis is tested only when all earlier ones
    were rejected. Starting from one end only: a multi-start variant that tests each start
    at delta would double the error rate.
    """

    name = "fixed-sequence"

    def run(self, p_values: ArrayLike, delta: float) -> FWERResult:
        p = _prepare(p_values, delta)
        passed = p <= delta
        failures = np.flatnonzero(~passed)
        stop = int(failures[0]) if failures.size else None
        n_tested = p.size if stop is None else stop + 1
        rejected = np.zeros(p.size, dtype=bool)
        rejected[: n_tested if stop is None else stop] = True
        return FWERResult(
            rejected=rejected,
            tested=np.arange(n_tested, dtype=np.int64),
            levels=np.full(n_tested, delta),
            stopped_at=stop,
        )


class Bonferroni:
    """Bonferroni: reject every H_j with p_j <= delta / m."""

    name = "bonferroni"

    def run(self, p_values: ArrayLike, delta: float) -> FWERResult:
        p = _prepare(p_values, delta)
        level = delta / max(p.size, 1)
        return FWERResult(
            rejected=p <= level,
            tested=np.arange(p.size, dtype=np.int64),
            levels=np.full(p.size, level),
            stopped_at=None,
        )


class Holm:
    """Holm step-down: sort p ascending, reject p_(i) <= delta / (m - i) for i = 0, 1, ... until one fails."""

    name = "holm"

    def run(self, p_values: ArrayLike, delta: float) -> FWERResult:
        p = _prepare(p_values, delta)
        m = p.size
        order = np.argsort(p, kind="stable")
        levels = delta / (m - np.arange(m))
        passed = p[order] <= levels
        failures = np.flatnonzero(~passed)
        stop = int(failures[0]) if failures.size else None
        n_tested = m if stop is None else stop + 1
        rejected = np.zeros(m, dtype=bool)
        rejected[order[: m if stop is None else stop]] = True
        return FWERResult(
            rejected=rejected,
            tested=order[:n_tested].astype(np.int64),
            levels=levels[:n_tested],
            stopped_at=stop,
        )


_PROCEDURES: dict[str, type[FixedSequence] | type[Bonferroni] | type[Holm]] = {
    FixedSequence.name: FixedSequence,
    Bonferroni.name: Bonferroni,
    Holm.name: Holm,
}


def control_fwer(
    p_values: ArrayLike, delta: float, method: FWERMethod | FWERProcedure = "fixed-sequence"
) -> FWERResult:
    """Run an FWER procedure (by name or instance) at level delta over ordered p-values."""
    if isinstance(method, str):
        if method not in _PROCEDURES:
            raise ValueError(f"unknown FWER method {method!r}; choose one of {FWER_METHODS}")
        procedure: FWERProcedure = _PROCEDURES[method]()
    else:
        procedure = method
    return procedure.run(p_values, delta)
