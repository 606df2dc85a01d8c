"""`ctd eval` end to end against the fault server's expert, whose item scores spread over
(0.02, 0.98): the report warns about no expert (on the terminal or in the report), keeps each
input's start in query/expert_scores.parquet, writes report/examples.parquet with it, and shows
the case-study section with the run's own texts or says none exist."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from ctd_cli import run_ctd
from eval_data import SIZES, eval_env, write_tagged_data
from fault_server import RunningServer

from harness.data import read_table
from harness.run import RunLayout

FAST = [
    "--seeds", "0",
    "--epochs", "8",
    "--budgets", "0.2,0.3,0.5",
    "--batch-sizes", "16",
    "--trials", "40",
    "--performance-alpha", "0.4",
    "--max-tokens", "96",
    "--no-merge-controls",
]  # fmt: skip


def test_eval_with_a_spread_expert_warns_about_no_expert(tmp_path: Path) -> None:
    env = eval_env(tmp_path)
    data = [arg for token in write_tagged_data(tmp_path / "data") for arg in ("--data", token)]
    with RunningServer() as server:
        args = ["eval", "--name", "t", "--expert", server.url, "--expert-model", "fault-model", *FAST, *data]
        result = run_ctd(*args, cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    layout = RunLayout(tmp_path / "runs" / "t")
    assert "warning: expert" not in result.stderr
    numbers = json.loads(layout.report.numbers.read_text())
    assert not [w for w in numbers["warnings"] if w.startswith("expert")]
    # Whatever the report warns about (a probe trained 8 epochs on 48 rows may be degenerate) is
    # what the terminal printed, one line each.
    lines = result.stderr.splitlines()
    printed = [line[len("warning: ") :] for line in lines if line.startswith("warning: ")]
    assert printed == numbers["warnings"]

    expert = read_table(layout.query.expert_scores).columns
    # The expert's next-token alternatives, read back from the cache, reproduce its score.
    for score, top in zip(expert["expert"], expert["top_tokens"].astype(str), strict=True):
        mass = {"high": 0.0, "low": 0.0}
        for token, logprob in json.loads(top):
            word = token.strip().lower()
            if word in mass:
                mass[word] += math.exp(logprob)
        assert score == pytest.approx(mass["high"] / (mass["high"] + mass["low"]), abs=1e-9)
    assert all(t.startswith("[User] ") or t.startswith("[Sys] ") for t in expert["text"].astype(str))
    assert all("item-" in t or t.endswith("…") for t in expert["text"].astype(str))
    by_id = dict(zip(expert["id"].astype(str), expert["top_tokens"].astype(str), strict=True))
    examples = read_table(layout.report.examples).columns
    test_rows = examples["split"] == "test"
    assert test_rows.sum() == SIZES["test"] and (examples["text"][test_rows] != "").all()
    expected = np.array([by_id[i] for i in examples["id"].astype(str)])
    assert (examples["expert_top_tokens"] == expected).all()
    decided = np.array([v is not None for v in examples["ctd@0.2"]])
    assert decided.sum() == SIZES["test"] // 2  # the evaluation half

    report = layout.report.markdown.read_text(encoding="utf-8")
    assert "## Case studies at budget 0.2" in report
    cases = numbers["archs"]["attention"]["case_studies"]
    for kind, title in (("misrouted", "Misrouted expert call"), ("missed", "Missed expert call")):
        assert f"**{title}**: {cases[kind]['count']} examples" in report
        if cases[kind]["count"] == 0:
            assert "None in this run" in report
    shown = [i for kind in ("misrouted", "missed") for i in cases[kind]["shown"]]
    texts = dict(zip(examples["id"].astype(str), examples["text"].astype(str), strict=True))
    for example in shown:
        assert f"> {texts[example][:200]}" in report  # the run's own text, truncated
