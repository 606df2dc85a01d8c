"""`calibrate.sweep`'s per-example decisions are the masks behind its table: their delegation rate
is the table's realised rate in every cell, their per-group counts are the group table's, a
calibrated policy delegates exactly the rows whose signal exceeds its threshold, and top-k
delegates the rows of rank < k in their batch."""

from __future__ import annotations

import numpy as np
import pytest

import calibrate
from calibrate import ANY_BATCH_SIZE, ANY_OBJECTIVE, DECISION_COLUMNS, SweepConfig
from harness import simulate_scores
from harness.data import scores_from_columns

CONFIG = SweepConfig(budgets=(0.1, 0.25, 0.5), batch_sizes=(16, 40))


@pytest.fixture(scope="module")
def result() -> tuple[calibrate.SweepResult, dict[int, calibrate.Scores]]:
    by_seed = scores_from_columns(simulate_scores("weak", 300, 2)).test_scores()
    return calibrate.sweep(by_seed, CONFIG), by_seed


def _cell(decisions: dict[str, np.ndarray], **equal: object) -> np.ndarray:
    at = np.ones(decisions["seed"].size, bool)
    for name, value in equal.items():
        at &= decisions[name] == value
    return at


def test_every_cell_of_the_table_has_its_mask(result) -> None:
    found, _ = result
    table, decisions = found.table, found.decisions
    assert tuple(decisions) == DECISION_COLUMNS
    for i in range(table["seed"].size):
        policy = str(table["policy"][i])
        calibrated = calibrate.POLICIES[policy].calibrated
        at = _cell(
            decisions,
            seed=table["seed"][i],
            policy=policy,
            budget=table["budget"][i],
            objective=table["objective"][i] if calibrated else ANY_OBJECTIVE,
            batch_size=ANY_BATCH_SIZE if calibrated else table["batch_size"][i],
        )
        assert at.sum() == 150  # the evaluation half of 300 rows
        assert decisions["delegated"][at].mean() == pytest.approx(table["realised"][i], abs=1e-12)


def test_masks_follow_the_threshold_and_the_batch_rank(result) -> None:
    found, by_seed = result
    table, decisions = found.table, found.decisions
    for i in np.flatnonzero(table["policy"] == "ctd"):
        at = _cell(
            decisions,
            seed=table["seed"][i],
            policy="ctd",
            budget=table["budget"][i],
            objective=table["objective"][i],
        )
        rows = decisions["row"][at]
        dv = by_seed[int(table["seed"][i])].dv[rows]
        assert np.array_equal(decisions["signal"][at], dv)
        assert np.array_equal(decisions["delegated"][at], dv > table["threshold"][i])
    at = _cell(decisions, seed=0, policy="unc-topk", budget=0.25, batch_size=40)
    rank, position, delegated = (decisions[c][at] for c in ("batch_rank", "position", "delegated"))
    assert np.array_equal(np.sort(position), np.arange(150))
    for batch in range(4):  # batches of 40, 40, 40 and 30 rows: k = 10, 10, 10, 8 (round(0.25 b))
        mine = position // 40 == batch
        assert sorted(rank[mine]) == list(range(mine.sum()))
        assert np.array_equal(delegated[mine], rank[mine] < round(0.25 * mine.sum()))


def test_group_counts_agree_with_the_group_table(result) -> None:
    found, by_seed = result
    groups, decisions = found.groups, found.decisions
    at = _cell(decisions, seed=1, policy="dv-topk", budget=0.5, batch_size=16)
    names = by_seed[1].group[decisions["row"][at]]
    for name in np.unique(names):
        row = (
            (groups["seed"] == 1)
            & (groups["policy"] == "dv-topk")
            & (groups["budget"] == 0.5)
            & (groups["batch_size"] == 16)
            & (groups["group"] == name)
            & (groups["objective"] == CONFIG.objectives[0])
        )
        assert groups["n_delegated"][row][0] == decisions["delegated"][at][names == name].sum()
