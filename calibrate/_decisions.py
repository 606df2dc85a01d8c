"""A sweep's masks per example, kept compact.

The tidy table (DECISION_COLUMNS) has one row per policy x budget x seed x evaluation example, and
per objective (calibrated policies) or per batch size (top-k policies); the other axis does not
change the mask, so it is written once, as ANY_OBJECTIVE or ANY_BATCH_SIZE. Its rows repeat each
example's signal, rank and position once per budget: 37 million rows and about 4 GB of arrays for
a 100,000-row test split. A `DecisionMasks` holds one policy's masks for one seed as an (a, m)
boolean array beside the (m,) values they share (shared, not copied, between masks), and makes its
tidy rows only when asked (`columns`), so a writer can take them one mask group at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["ANY_BATCH_SIZE", "ANY_OBJECTIVE", "DECISION_COLUMNS", "DecisionMasks", "decision_columns"]

DECISION_COLUMNS: tuple[str, ...] = (
    "seed",
    "policy",
    "objective",
    "budget",
    "batch_size",
    "row",  # the example's index in the seed's test scores
    "position",  # its arrival order in the evaluation half (top-k batches are consecutive runs)
    "signal",  # the policy's delegation signal
    "batch_rank",  # top-k: 0-based rank by signal within its batch; -1 for other policies
    "delegated",
)
_DTYPES: dict[str, type] = {
    "seed": np.int64,
    "policy": str,
    "objective": str,
    "budget": np.float64,
    "batch_size": np.int64,
    "row": np.int64,
    "position": np.int64,
    "signal": np.float64,
    "batch_rank": np.int64,
    "delegated": np.bool_,
}
ANY_OBJECTIVE = "any"
ANY_BATCH_SIZE = 0


@dataclass(frozen=True, eq=False)
class DecisionMasks:
    """One policy's masks on one seed's evaluation half: `delegated[i, j]` whether it delegates
    example `evaluation[j]` (its index in the seed's test scores) at `budgets[i]`."""

    seed: int
    policy: str
    objective: str  # ANY_OBJECTIVE for top-k policies
    batch_size: int  # ANY_BATCH_SIZE for calibrated policies
    budgets: tuple[float, ...]  # (a,)
    evaluation: NDArray[np.int64]  # (m,)
    signal: NDArray[np.float64]  # (m,) the policy's delegation signal
    rank: NDArray[np.int64] | None  # (m,) top-k: rank within its batch; None for other policies
    delegated: NDArray[np.bool_]  # (a, m)

    def columns(self) -> dict[str, NDArray]:
        """The tidy rows (DECISION_COLUMNS) of these masks: budget-major, examples in arrival order."""
        a, m = self.delegated.shape
        return {
            "seed": np.full(a * m, self.seed, dtype=np.int64),
            "policy": np.full(a * m, self.policy),
            "objective": np.full(a * m, self.objective),
            "budget": np.repeat(np.asarray(self.budgets, dtype=np.float64), m),
            "batch_size": np.full(a * m, self.batch_size, dtype=np.int64),
            "row": np.tile(self.evaluation, a),
            "position": np.tile(np.arange(m), a),
            "signal": np.tile(self.signal, a),
            "batch_rank": np.tile(np.full(m, -1) if self.rank is None else self.rank, a),
            "delegated": self.delegated.reshape(-1),
        }


def decision_columns(masks: Sequence[DecisionMasks]) -> dict[str, NDArray]:
    """The tidy table of `masks`, in their order (empty columns when there are none)."""
    if not masks:
        return {c: np.array([], dtype=_DTYPES[c]) for c in DECISION_COLUMNS}
    parts = [m.columns() for m in masks]
    return {c: np.concatenate([p[c] for p in parts]) for c in DECISION_COLUMNS}
