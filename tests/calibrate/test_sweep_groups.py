"""`calibrate.sweep`'s group table (`SweepResult.groups`) against the recomputation the report
used to run: the same delegation masks rebuilt from the sweep's internals, fed to
`calibrate.group_table`. The comparison is shown to catch a deliberately wrong mask."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

import calibrate

# The reference rebuilds the sweep's masks from its inner steps (the split,
# the signals, the threshold candidates, budget control, top-k), exactly as
# harness/report/_data.py's `_group_masks` did before the group table moved into the sweep.
from calibrate import (
    GROUP_COLUMNS,
    POLICIES,
    Scores,
    SweepConfig,
    budget_control,
    group_table,
    policy_signal,
    random_splits,
    sweep,
    threshold_candidates,
    topk_mask,
)

GROUPS = ("anthropic", "mt", "mts", "toolace")
CONFIG = SweepConfig(budgets=(0.05, 0.2, 0.3, 0.75), batch_sizes=(32, 64), n_grid=30, split_seed=3)
SEEDS = (0, 2)

Masks = Callable[[Scores, SweepConfig, int, float, str, int], tuple[NDArray[np.int64], dict[str, NDArray]]]


def grouped_scores(rng: np.random.Generator, n: int) -> Scores:
    """A simulated test split with four groups of unequal size (the smallest often has no
    delegated row at small budgets, so mean v of the selected rows is NaN there)."""
    label = rng.integers(0, 2, n)
    sign = 2 * label - 1
    probe = np.clip(np.round(0.5 + 0.15 * sign + rng.normal(0, 0.25, n), 2), 0, 1)
    expert = np.clip(np.round(0.5 + 0.3 * sign + rng.normal(0, 0.2, n), 2), 0, 1)
    dv = np.round(sign * (expert - probe) + rng.normal(0, 0.2, n), 1)
    group = rng.choice(np.array(GROUPS), n, p=[0.45, 0.3, 0.2, 0.05])
    return Scores(label=label.astype(np.int64), probe=probe, expert=expert, dv=dv, group=group)


def old_report_masks(
    scores: Scores, config: SweepConfig, seed: int, budget: float, objective: str, batch_size: int
) -> tuple[NDArray[np.int64], dict[str, NDArray]]:
    """The report's former `_group_masks`, verbatim: the evaluation half of one seed and the CTD
    and unc-topk masks on it at `budget`."""
    splits = random_splits(
        scores.n,
        1,
        [config.split_seed, seed],
        cal_fraction=config.cal_fraction,
        est_fraction=config.est_fraction,
    )
    evaluation = splits.evaluation[0]
    ctd = POLICIES["ctd"]
    signal = policy_signal(scores, ctd, splits)
    (candidates,) = threshold_candidates(
        scores,
        signal,
        splits,
        merge=config.merge_for(ctd),
        objective=objective if config.pareto else None,
        n_grid=config.n_grid,
    )
    result = budget_control(candidates, alpha=budget, control=config.control)
    unc = policy_signal(scores, POLICIES["unc-topk"], splits)[0][evaluation]
    return evaluation, {
        "ctd": signal[0][evaluation] > result.threshold,
        "unc-topk": topk_mask(unc, [budget], batch_size)[0],
    }


def mismatches(by_seed: dict[int, Scores], result: calibrate.SweepResult, masks: Masks) -> list[str]:
    """Every cell where the sweep's group table differs from `group_table` on `masks`."""
    table = result.groups
    found = []
    for seed, scores in by_seed.items():
        for budget in CONFIG.budgets:
            for objective in CONFIG.objectives:
                for batch_size in CONFIG.batch_sizes:
                    evaluation, selections = masks(scores, CONFIG, seed, budget, objective, batch_size)
                    expected = group_table(scores.value[evaluation], scores.group[evaluation], selections)
                    for policy in selections:
                        for row in expected:
                            at = (
                                (table["seed"] == seed)
                                & (table["policy"] == policy)
                                & (table["objective"] == objective)
                                & (table["budget"] == budget)
                                & (table["batch_size"] == batch_size)
                                & (table["group"] == row.group)
                            )
                            where = (
                                f"seed {seed} {policy} {objective} budget {budget} B {batch_size} {row.group}"
                            )
                            if at.sum() != 1:
                                found.append(f"{where}: {at.sum()} rows")
                                continue
                            (i,) = np.flatnonzero(at)
                            got = (table["n"][i], table["delegation_rate"][i])
                            if got != (row.n, row.delegation_rate[policy]):
                                found.append(
                                    f"{where}: n, rate {got} != {(row.n, row.delegation_rate[policy])}"
                                )
                            for column, want in (
                                ("mean_v_selected", row.mean_v_selected[policy]),
                                ("mean_v_all", row.mean_v_all),
                            ):
                                if not np.isclose(table[column][i], want, rtol=0, atol=1e-12, equal_nan=True):
                                    found.append(f"{where}: {column} {table[column][i]} != {want}")
    return found


@pytest.fixture(scope="module")
def swept() -> tuple[dict[int, Scores], calibrate.SweepResult]:
    rng = np.random.default_rng(13)
    by_seed = {seed: grouped_scores(rng, 301) for seed in SEEDS}
    return by_seed, sweep(by_seed, CONFIG)


def test_group_table_equals_the_old_report_recomputation(
    swept: tuple[dict[int, Scores], calibrate.SweepResult],
) -> None:
    by_seed, result = swept
    assert mismatches(by_seed, result, old_report_masks) == []
    # The check is not vacuous: some selections are empty (NaN mean) and some are not.
    ctd = result.groups["policy"] == "ctd"
    assert np.isnan(result.groups["mean_v_selected"][ctd]).any()
    assert np.isfinite(result.groups["mean_v_selected"][ctd]).any()


def test_the_comparison_catches_a_wrong_mask(swept: tuple[dict[int, Scores], calibrate.SweepResult]) -> None:
    by_seed, result = swept

    def one_row_flipped(*args: object) -> tuple[NDArray[np.int64], dict[str, NDArray]]:
        evaluation, masks = old_report_masks(*args)  # type: ignore[arg-type]
        wrong = masks["ctd"].copy()
        wrong[0] = ~wrong[0]
        return evaluation, {**masks, "ctd": wrong}

    found = mismatches(by_seed, result, one_row_flipped)
    assert found and all(" ctd " in line for line in found)
    assert len(found) >= len(SEEDS) * len(CONFIG.budgets) * len(CONFIG.objectives) * len(CONFIG.batch_sizes)


def test_group_table_shape_and_totals(swept: tuple[dict[int, Scores], calibrate.SweepResult]) -> None:
    """One row per policy x budget x batch size x seed x objective x group, and per mask the
    groups add up to sweep.csv's realised rate, for every policy (not only ctd and unc-topk)."""
    by_seed, result = swept
    groups, table = result.groups, result.table
    assert set(groups) == set(GROUP_COLUMNS)
    n_groups = sum(
        np.unique(s.group[random_splits(s.n, 1, [3, seed]).evaluation[0]]).size for seed, s in by_seed.items()
    )
    per_seed = len(CONFIG.policies) * len(CONFIG.budgets) * len(CONFIG.batch_sizes) * len(CONFIG.objectives)
    assert groups["seed"].size == per_seed * n_groups
    keys = list(
        zip(
            *(groups[c].tolist() for c in ("seed", "policy", "objective", "budget", "batch_size", "group")),
            strict=True,
        )
    )
    assert len(set(keys)) == len(keys)
    for i in range(table["seed"].size):
        at = np.ones(groups["seed"].size, bool)
        for column in ("seed", "policy", "objective", "budget", "batch_size"):
            at &= groups[column] == table[column][i]
        delegated, n = groups["n_delegated"][at].sum(), groups["n"][at].sum()
        assert (
            n == by_seed[int(table["seed"][i])].n - by_seed[int(table["seed"][i])].n // 2
        )  # the evaluation half
        assert delegated / n == pytest.approx(table["realised"][i], abs=1e-12)


def test_scores_without_groups_give_an_empty_typed_table() -> None:
    rng = np.random.default_rng(5)
    scores = grouped_scores(rng, 200)
    bare = Scores(label=scores.label, probe=scores.probe, expert=scores.expert, dv=scores.dv)
    result = sweep({0: bare}, SweepConfig(budgets=(0.3,), batch_sizes=(32,), n_grid=10))
    assert set(result.groups) == set(GROUP_COLUMNS)
    assert all(column.size == 0 for column in result.groups.values())
    assert result.groups["n"].dtype == np.int64 and result.groups["mean_v_all"].dtype == np.float64


_GROUP_SUMS = """
import hashlib
import numpy as np
# Private: the group sums behind the group table.
from calibrate._groups import group_delegation
rng = np.random.default_rng(5)
v = rng.normal(size=2000)
groups = rng.choice(np.array(["a", "b", "c", "d"]), size=2000)
masks = rng.random((19, 2000)) < 0.3
found = group_delegation(v, groups, masks)
print(hashlib.sha256(found.mean_v_all.tobytes() + found.selected_v.tobytes()).hexdigest())
"""


def test_the_group_sums_do_not_depend_on_the_cpus_blas_kernel() -> None:
    """The same bytes under OpenBLAS's kernels for different CPUs (a matrix product ordered its
    sums per kernel: groups.csv differed between an Intel and an AMD machine)."""
    digests = set()
    for core in ("Haswell", "SkylakeX", "Sandybridge"):
        done = subprocess.run(
            [sys.executable, "-c", _GROUP_SUMS],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "OPENBLAS_CORETYPE": core},
            cwd=Path(__file__).resolve().parents[2],  # this checkout's calibrate, first on sys.path
        )
        assert done.returncode == 0, done.stderr[-2000:]
        digests.add(done.stdout.strip())
    assert len(digests) == 1, digests
