"""Group-conditional delegation: per group of examples (the source data set), how often a policy
delegates and the mean delegation value of what it sends, at many budgets at once.

`calibrate.sweep` calls it with the masks it already has, so the group table of a sweep is
part of its result and nobody has to rebuild the masks to read it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["GROUP_COLUMNS", "GroupDelegation", "concat_groups", "group_delegation", "tidy_groups"]

# The sweep's group table: one row per seed x policy x objective x budget x batch size x group.
GROUP_COLUMNS: tuple[str, ...] = (
    "seed",
    "policy",
    "objective",
    "budget",
    "batch_size",
    "group",
    "n",
    "n_delegated",
    "delegation_rate",
    "mean_v_selected",
    "mean_v_all",
)
_STRING_COLUMNS = ("policy", "objective", "group")
_INTEGER_COLUMNS = ("seed", "batch_size", "n", "n_delegated")


@dataclass(frozen=True)
class GroupDelegation:
    """Per group g (G groups, sorted by name) and per mask row a (A rows, e.g. budgets):

    - `n[g]` = |g|, the group's size, shape (G,);
    - `n_delegated[a, g]` = |g and S_a|, rows of g the mask S_a delegates, shape (A, G);
    - `mean_v_all[g]` = mean of v over g, shape (G,);
    - `selected_v[a, g]` = sum of v over g and S_a, shape (A, G).

    The same numbers as `calibrate.group_table` gives per mask, as arrays."""

    groups: NDArray[np.str_]
    n: NDArray[np.int64]
    n_delegated: NDArray[np.int64]
    mean_v_all: NDArray[np.float64]
    selected_v: NDArray[np.float64]

    @property
    def delegation_rate(self) -> NDArray[np.float64]:
        """|g and S_a| / |g|, shape (A, G)."""
        return self.n_delegated / self.n[None, :]

    @property
    def mean_v_selected(self) -> NDArray[np.float64]:
        """Mean of v over g and S_a, NaN where S_a takes no row of g; shape (A, G)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.n_delegated > 0, self.selected_v / self.n_delegated, np.nan)


def group_delegation(value: ArrayLike, groups: ArrayLike, delegated: ArrayLike) -> GroupDelegation:
    """Group-conditional counts of the masks `delegated` (shape (A, m)) over m examples with
    delegation values `value` (shape (m,)) and group names `groups` (shape (m,)).

    With one-hot membership M[g, i] = 1[group_i = g] (shape (G, m)) and masks S (shape (A, m)):
    n = M 1, n_delegated = S M^T (integer counts), selected_v = (S * v) M^T, mean_v_all = M v / n.
    Only groups present among the m examples appear, so every n[g] >= 1. The sums of v are taken
    example by example in order (np.bincount), not by a matrix product, whose BLAS kernel (chosen
    for the CPU) orders them otherwise on another machine: the table's bytes do not depend on it.
    """
    v = np.asarray(value, dtype=np.float64)
    names, codes = np.unique(np.asarray(groups).astype(str), return_inverse=True)
    masks = np.asarray(delegated, dtype=bool)
    if masks.ndim != 2 or masks.shape[1] != v.size or codes.size != v.size:
        raise ValueError(
            f"delegated must have shape (A, {v.size}) and groups {v.size} entries, got "
            f"{masks.shape} and {codes.size}"
        )
    groups_n = names.size
    n = np.bincount(codes, minlength=groups_n)  # (G,)
    cell = (np.arange(masks.shape[0])[:, None] * groups_n + codes[None, :]).ravel()  # (A * m,) row, group
    per_cell = masks.shape[0] * groups_n
    return GroupDelegation(
        groups=names,
        n=n.astype(np.int64),
        n_delegated=np.bincount(cell[masks.ravel()], minlength=per_cell)
        .reshape(-1, groups_n)
        .astype(np.int64),
        mean_v_all=np.bincount(codes, weights=v, minlength=groups_n) / n,
        selected_v=np.bincount(cell, weights=(masks * v[None, :]).ravel(), minlength=per_cell).reshape(
            -1, groups_n
        ),  # (A, G)
    )


def tidy_groups(
    found: GroupDelegation,
    *,
    seed: int,
    policy: str,
    objectives: tuple[str, ...],
    batch_sizes: tuple[int, ...],
    budgets: tuple[float, ...],
) -> dict[str, NDArray]:
    """`found` (mask rows = `budgets`) as GROUP_COLUMNS, one row per objective x batch size x
    budget x group in that order; the numbers repeat across the objectives and batch sizes given
    (the axes the masks do not depend on)."""
    shape = (len(objectives), len(batch_sizes), len(budgets), found.groups.size)  # (O, B, A, G)

    def spread(values: NDArray, axis: int) -> NDArray:
        """Values along one axis of `shape`, repeated along the others, flattened."""
        index = [None] * len(shape)
        index[axis] = slice(None)
        return np.broadcast_to(np.asarray(values)[tuple(index)], shape).ravel()

    def per_budget(values: NDArray) -> NDArray:
        return np.broadcast_to(values[None, None], shape).ravel()  # (A, G) -> (O, B, A, G)

    return {
        "seed": np.full(int(np.prod(shape)), seed, dtype=np.int64),
        "policy": np.full(int(np.prod(shape)), policy),
        "objective": spread(np.array(objectives), 0),
        "budget": spread(np.asarray(budgets, dtype=np.float64), 2),
        "batch_size": spread(np.asarray(batch_sizes, dtype=np.int64), 1),
        "group": spread(found.groups, 3),
        "n": spread(found.n, 3),
        "n_delegated": per_budget(found.n_delegated),
        "delegation_rate": per_budget(found.delegation_rate),
        "mean_v_selected": per_budget(found.mean_v_selected),
        "mean_v_all": spread(found.mean_v_all, 3),
    }


def concat_groups(parts: list[dict[str, NDArray]]) -> dict[str, NDArray]:
    """Stack tidy group chunks; with none, the empty table (typed columns, zero rows)."""
    if not parts:
        return {
            c: np.array(
                [], dtype=str if c in _STRING_COLUMNS else np.int64 if c in _INTEGER_COLUMNS else float
            )
            for c in GROUP_COLUMNS
        }
    return {c: np.concatenate([p[c] for p in parts]) for c in GROUP_COLUMNS}
