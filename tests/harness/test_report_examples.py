"""report/examples.parquet and the case studies, checked against the sweep's table and against
definitions recomputed here from the per-example table; and "none" said when none exist."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import calibrate
from calibrate import SweepConfig
from harness import calibrate_scores, simulate_scores, write_scores
from harness.data import read_table, write_table
from harness.report import build_report

# Private: how much of an example's text the report shows.
from harness.report._examples import TEXT_SHOWN
from harness.run import RunLayout

ARCH = "simulated"
CONFIG = SweepConfig(budgets=(0.1, 0.2, 0.3, 0.5), batch_sizes=(32, 64))


def _run(folder: Path, columns: dict[str, np.ndarray]) -> Path:
    folder.mkdir(parents=True)
    write_scores(folder / "scores.parquet", columns)
    _write_expert_table(RunLayout(folder), columns)
    calibrate_scores(folder / "scores.parquet", RunLayout(folder).sweep(ARCH).root, CONFIG, arch=ARCH)
    build_report(folder)
    return folder


TOP = json.dumps([[" high", -0.1], ["low", -2.4]])


def _text(example: str) -> str:
    return f"[User] the input of {example}, " + "and more words " * 40


def _write_expert_table(layout: RunLayout, columns: dict[str, np.ndarray]) -> None:
    """query/expert_scores.parquet as the query stage writes it (one row per example)."""
    first = columns["seed"] == columns["seed"].min()
    ids, splits = columns["id"][first], columns["split"][first]
    layout.query.root.mkdir(parents=True)
    write_table(
        layout.query.expert_scores,
        {
            "id": ids,
            "split": splits,
            "expert": columns["expert"][first],
            "label_mass": np.full(ids.size, 0.9),
            "text": np.array([_text(i) for i in ids]),
            "top_tokens": np.full(ids.size, TOP),
        },
    )


def _columns(seeds: int = 2) -> dict[str, np.ndarray]:
    columns = simulate_scores("strong", 400, seeds)
    return columns | {"arch": np.full(columns["label"].size, ARCH)}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("runs") / "examples", _columns())


def _decided(values: np.ndarray) -> np.ndarray:
    return np.array([v is not None and not (isinstance(v, float) and np.isnan(v)) for v in values])


def test_every_example_with_its_decisions(run: Path) -> None:
    examples = read_table(RunLayout(run).report.examples).columns
    scores = read_table(run / "scores.parquet").columns
    assert examples["id"].size == scores["id"].size
    v = (2 * examples["label"] - 1) * (examples["expert"] - examples["probe"])
    assert np.allclose(examples["v"], v)
    sweep = read_table(run / "calibrate" / ARCH / "sweep.csv").columns
    for seed in (0, 1):
        for policy, column in (("ctd", "ctd@0.2"), ("unc-topk", "unc-topk@0.2")):
            mine = examples["seed"] == seed
            decided = mine & _decided(examples[column])
            assert decided.sum() == 200  # the evaluation half of 400 test rows
            assert set(examples["split"][decided]) == {"test"}  # never a dev row
            cell = (
                (sweep["seed"].astype(int) == seed)
                & (sweep["policy"] == policy)
                & (sweep["objective"] == "auroc")
                & (np.abs(sweep["budget"].astype(float) - 0.2) < 1e-9)
                & (sweep["batch_size"].astype(int) == 64)
            )
            realised = float(sweep["realised"][cell][0])
            assert np.mean(examples[column][decided].astype(bool)) == pytest.approx(realised, abs=1e-12)
    ranks = examples["unc-topk_rank@B64"]
    decided = _decided(ranks)
    assert ranks[decided].astype(int).min() == 1 and ranks[decided].astype(int).max() == 64


def _case_rows(examples: dict[str, np.ndarray]) -> dict[str, set[tuple[str, int]]]:
    """The two case kinds, recomputed from the per-example table."""
    decided = _decided(examples["ctd@0.2"]) & _decided(examples["unc-topk@0.2"])
    unc = np.zeros(decided.size, bool)
    ctd = np.zeros(decided.size, bool)
    unc[decided] = examples["unc-topk@0.2"][decided].astype(bool)
    ctd[decided] = examples["ctd@0.2"][decided].astype(bool)
    right = (examples["probe"] >= 0.5) == (examples["label"] == 1)
    misrouted = decided & unc & ~ctd & right & (examples["v"] < 0)
    missed = decided & ~unc & ctd & ~right & (examples["v"] > 0)
    key = list(zip(examples["id"].astype(str), examples["seed"].astype(int), strict=True))
    return {
        "misrouted": {key[i] for i in np.flatnonzero(misrouted)},
        "missed": {key[i] for i in np.flatnonzero(missed)},
    }


def test_case_studies_are_the_examples_that_fit_their_definition(run: Path) -> None:
    examples = read_table(RunLayout(run).report.examples).columns
    expected = _case_rows(examples)
    assert expected["misrouted"] and expected["missed"]  # the strong scenario has both
    cases = read_table(run / "report" / "tables" / ARCH / "case-studies.csv").columns  # CSV: strings
    for kind in ("misrouted", "missed"):
        mine = cases["kind"] == kind
        found = set(zip(cases["id"][mine].astype(str), cases["seed"][mine].astype(int), strict=True))
        assert found == expected[kind], kind
    numbers = json.loads((run / "report" / "numbers.json").read_text())["archs"][ARCH]["case_studies"]
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    for kind, title in (("misrouted", "Misrouted expert call"), ("missed", "Missed expert call")):
        assert numbers[kind]["count"] == len(expected[kind])
        assert f"**{title}**: {len(expected[kind])} examples" in report
        for shown in numbers[kind]["shown"]:
            assert f"`{shown}`" in report
    # The most harmful misrouted call is shown first, with its rank in a batch of 64.
    mine = cases["kind"] == "misrouted"
    first = np.argmin(cases["v"][mine].astype(float))
    assert numbers["misrouted"]["shown"][0] == cases["id"][mine][first]
    assert f"rank {int(cases['rank'][mine][first])}/64" in report
    # Its text, cut to TEXT_SHOWN characters with an ellipsis; the whole preview is in examples.parquet.
    text = _text(numbers["misrouted"]["shown"][0])
    assert f"> {text[: TEXT_SHOWN - 1]}…\n" in report
    assert set(examples["expert_label_mass"]) == {0.9} and set(examples["expert_top_tokens"]) == {TOP}
    assert "Expert's top next tokens (logprob): `' high'` -0.10, `'low'` -2.40." in report


def test_no_case_studies_is_said(tmp_path: Path) -> None:
    """A probe and an expert that are always right, the expert more sure: v > 0 everywhere and
    the probe never wrong, so neither failure can happen."""
    columns = _columns(seeds=1)
    label = columns["label"]
    columns["probe"] = np.where(label == 1, 0.8, 0.2)
    columns["expert"] = np.where(label == 1, 0.95, 0.05)
    run = _run(tmp_path / "none", columns)
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    assert "**Misrouted expert call**: 0 examples" in report
    assert "**Missed expert call**: 0 examples" in report
    assert report.count("None in this run: at budget 0.2 no example") == 2
    assert calibrate.delegation_value(label, columns["probe"], columns["expert"]).min() > 0
