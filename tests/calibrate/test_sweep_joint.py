"""`ctd calibrate --accuracy`: every calibrated row is `joint_control` of its budget and the error
level 1 - accuracy, recomputed here from the same candidates; a row without a certified threshold
has no policy (NaN metrics, n_certified 0, no masks) and the summary says how many rows its means
cover. Without --accuracy the files are byte for byte what they were before joint control existed
(hashes taken on the tree before the change)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import calibrate
from calibrate import ANY_BATCH_SIZE, SweepConfig
from harness import calibrate_scores, simulate_scores, write_scores
from harness.data import read_table, scores_from_columns
from harness.report import read_sweep

PINNED_CONFIG = SweepConfig(budgets=(0.1, 0.25, 0.5), batch_sizes=(16, 40))
# sha256 of calibrate_scores' files for simulate_scores("weak", 300, 2) and PINNED_CONFIG, computed
# on commit 8f8ff5b, before --accuracy existed.
PINNED_FILES = {
    "sweep.csv": "2dc64ba07adcebd7772a95ad7af1e598a4984ca7ed84056423cde6f4ae409327",
    "ltt.jsonl": "3fcf05f9bf21b44ae7f207f9ee80779aa16cd35164f987f7e6984bb875d03e3a",
    "baselines.csv": "de2c61b64f1fa33b73bff50b643d151c0b70a63164622dc8d6d16c2b748c526e",
}
# groups.csv's means of float values (mean_v_selected, mean_v_all) change in their last digit with
# numpy's summation kernels (numpy 2.4 gave other bytes than the release the pins were first taken
# with, on the same commit): it is pinned with every number at 12 significant digits.
PINNED_GROUPS = "c4386299f298096afb2f56400216051b869c956fe8756c3d580f127872e021e8"
# summary.json less its paths and timing (sorted keys), on the same commit.
PINNED_SUMMARY = "4530af4509579e73229f7d9907abb21de2af09c7977147c32978a1a56d715028"
# Strong expert, 1,600 test rows: some budgets certify error <= 0.2 jointly, the smallest do not.
JOINT = SweepConfig(budgets=(0.05, 0.2, 0.4, 0.6), batch_sizes=(32, 64), accuracy=0.8)


def _rounded_digest(path: Path) -> str:
    """sha256 of a CSV with each number written at 12 significant digits."""

    def field(text: str) -> str:
        try:
            return f"{float(text):.12g}"
        except ValueError:
            return text

    lines = [",".join(map(field, line.split(","))) for line in path.read_text().splitlines()]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def test_without_accuracy_the_files_are_unchanged(tmp_path: Path) -> None:
    write_scores(tmp_path / "s.parquet", simulate_scores("weak", 300, 2))
    calibrate_scores(tmp_path / "s.parquet", tmp_path / "out", PINNED_CONFIG)
    for name, digest in PINNED_FILES.items():
        assert hashlib.sha256((tmp_path / "out" / name).read_bytes()).hexdigest() == digest, name
    assert _rounded_digest(tmp_path / "out" / "groups.csv") == PINNED_GROUPS
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    for volatile in ("scores", "out", "table", "groups_table", "elapsed_s"):
        summary.pop(volatile)
    assert "accuracy" not in summary and "policies_found" not in summary
    assert hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest() == PINNED_SUMMARY


@pytest.fixture(scope="module")
def joint(tmp_path_factory) -> tuple[Path, dict[int, calibrate.Scores]]:
    folder = tmp_path_factory.mktemp("joint")
    write_scores(folder / "s.parquet", simulate_scores("strong", 1600, 2))
    calibrate_scores(folder / "s.parquet", folder / "out", JOINT)
    by_seed = scores_from_columns(simulate_scores("strong", 1600, 2)).test_scores()
    return folder / "out", by_seed


def _expected(by_seed: dict[int, calibrate.Scores], seed: int, policy: str, objective: str) -> list:
    """joint_control on the sweep's own split and candidates, one result per budget."""
    scores = by_seed[seed]
    splits = calibrate.random_splits(scores.n, 1, [JOINT.split_seed, seed])
    signal = calibrate.policy_signal(scores, calibrate.POLICIES[policy], splits)
    (candidates,) = calibrate.threshold_candidates(
        scores, signal, splits, merge=JOINT.merge_for(calibrate.POLICIES[policy]), objective=objective
    )
    return [
        calibrate.joint_control(candidates, budget=b, error=0.2, objective=objective, control=JOINT.control)
        for b in JOINT.budgets
    ]


def test_every_calibrated_row_is_joint_control(joint) -> None:
    out, by_seed = joint
    table = read_sweep(out).table
    records = [json.loads(line) for line in (out / "ltt.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 2 * 2 * len(JOINT.budgets)  # seeds x calibrated policies x objectives
    with_policy = without = 0
    for record in records:
        seed, policy, objective = record["seed"], record["policy"], record["objective"]
        budget = record["levels"]["budget"]
        assert record["mode"] == "joint" and record["levels"] == {"budget": budget, "error": 0.2}
        expected = _expected(by_seed, seed, policy, objective)[JOINT.budgets.index(budget)]
        assert record == {"seed": seed, "policy": policy, **expected.to_dict()}
        rows = (
            (table["seed"] == seed)
            & (table["policy"] == policy)
            & (table["objective"] == objective)
            & (table["budget"] == budget)
        )
        assert rows.sum() == len(JOINT.batch_sizes)
        assert (table["n_certified"][rows] == expected.certified.size).all()
        if expected.threshold is None:
            without += 1
            assert expected.certified.size == 0
            for column in ("threshold", "auroc", "accuracy", "realised"):
                assert np.isnan(table[column][rows]).all(), column
        else:
            with_policy += 1
            assert np.allclose(table["threshold"][rows], expected.threshold, rtol=0, atol=0)
            assert np.isfinite(table["realised"][rows]).all()
    assert with_policy > 0 and without > 0  # both kinds of row are exercised


def test_a_budget_without_a_policy_has_no_mask(joint) -> None:
    out, _ = joint
    result = read_sweep(out)
    table = result.table
    decisions = calibrate_decisions(out)
    for i in np.flatnonzero(table["policy"] == "ctd"):
        at = (
            (decisions["seed"] == table["seed"][i])
            & (decisions["policy"] == "ctd")
            & (decisions["objective"] == table["objective"][i])
            & (decisions["budget"] == table["budget"][i])
            & (decisions["batch_size"] == ANY_BATCH_SIZE)
        )
        if np.isnan(table["threshold"][i]):
            assert at.sum() == 0
        else:
            assert at.sum() == 800  # the evaluation half
            assert decisions["delegated"][at].mean() == pytest.approx(table["realised"][i], abs=1e-12)
    # The group table is made from the same masks: the same (seed, objective, budget) cells.
    groups = result.groups
    assert groups is not None
    calibrated = decisions["policy"] == "ctd"
    at_ctd = groups["policy"] == "ctd"
    assert _cells(groups, at_ctd) == _cells(decisions, calibrated)


def _cells(columns: dict[str, np.ndarray], rows: np.ndarray) -> set[tuple]:
    picked = (columns[name][rows].tolist() for name in ("seed", "objective", "budget"))
    return set(zip(*picked, strict=True))


def calibrate_decisions(out: Path) -> dict[str, np.ndarray]:
    raw = read_table(out / "decisions.parquet")
    return {k: np.asarray(v) for k, v in raw.columns.items()}


def test_the_summary_counts_what_its_means_cover(joint) -> None:
    out, _ = joint
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accuracy"] == 0.8 and summary["error_level"] == 0.2
    table = read_sweep(out).table
    largest = table["batch_size"] == max(JOINT.batch_sizes)
    for objective in JOINT.objectives:
        for policy in ("ctd", "unc-calibrated"):
            rows = largest & (table["objective"] == objective) & (table["policy"] == policy)
            has = rows & ~np.isnan(table["threshold"])
            found = summary["policies_found"][objective][policy]
            assert found == {"with_policy": int(has.sum()), "rows": int(rows.sum())}
            mean = summary["mean_over_budgets"][objective][policy]["accuracy"]
            assert mean == pytest.approx(table["accuracy"][has].mean(), abs=1e-12)
    # The report rebuilds the configuration, --accuracy included.
    assert read_sweep(out).config == JOINT


def test_error_level_reads_as_the_user_wrote_it() -> None:
    assert SweepConfig(accuracy=0.9).error_level == 0.1
    assert SweepConfig(accuracy=0.7).error_level == 0.3
    assert SweepConfig().error_level is None
    for bad in (0.0, 1.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="accuracy must lie in"):
            SweepConfig(accuracy=bad)
