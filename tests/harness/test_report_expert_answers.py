"""The report's account of the expert's answers: the share of each way a score was obtained per
split (experts._recovery's `how`), and the left-out examples' labels and groups beside their
count; a run from before the `how` column still reports its left-out rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.data import write_table

# Private: the section's lines and numbers, checked without building a whole report.
from harness.report._expert_answers import expert_answer_lines
from harness.run import RunLayout

ROWS = [  # split, group, label, source, how, reason
    *[("dev", "a", 0, "expert", "top-k", "")] * 6,
    ("dev", "b", 1, "expert", "wider-top-k", ""),
    ("dev", "b", 1, "failed", "", "no-label-mass"),
    *[("test", "a", 0, "cache", "top-k", "")] * 3,
    ("test", "b", 1, "expert", "named-labels", ""),
    ("test", "c", 1, "failed", "", "no-logprobs"),
    ("test", "c", 1, "failed", "", "no-logprobs"),
]


def _run(tmp_path: Path, *, with_how: bool = True) -> Path:
    run = tmp_path / "run"
    split, group, label, source, how, reason = (np.array(column) for column in zip(*ROWS, strict=True))
    failed = source == "failed"
    columns = {
        "id": np.array([f"r{i}" for i in range(len(ROWS))]),
        "split": split,
        "group": group,
        "label": label.astype(np.int64),
        "expert": np.where(failed, np.nan, 0.3),
        "source": source,
        **({"how": how} if with_how else {}),
        "reason": reason,
    }
    layout = RunLayout(run).query
    layout.expert_scores.parent.mkdir(parents=True)
    write_table(layout.expert_scores, columns)
    write_table(
        layout.failed, {k: columns[k][failed].astype(str) for k in ("split", "group", "id", "reason")}
    )
    return run


def test_shares_per_split_and_left_out_labels_and_groups(tmp_path: Path) -> None:
    lines, numbers = expert_answer_lines(_run(tmp_path))
    text = "\n".join(lines)
    assert numbers["expert_how_by_split"] == {
        "dev": {"left out": 1, "top-k": 6, "wider-top-k": 1},
        "test": {"left out": 2, "named-labels": 1, "top-k": 3},
    }
    assert "| split | top-k | wider-top-k | named-labels | left out |" in text
    assert "| dev | 75.0% (6) | 12.5% (1) | 0.0% (0) | 12.5% (1) |" in text
    assert "| test | 50.0% (3) | 0.0% (0) | 16.7% (1) | 33.3% (2) |" in text
    assert numbers["left_out"] == 3
    assert "the expert failed on 3 examples (3 labelled high-stakes)" in text
    assert "| dev | b | 1 | no-label-mass | 1 |" in text
    assert "| test | c | 1 | no-logprobs | 2 |" in text
    assert numbers["left_out_by_split_group"] == {"dev/b": 1, "test/c": 2}
    assert {"split": "test", "group": "c", "label": "1", "reason": "no-logprobs", "count": 2} in numbers[
        "left_out_rows"
    ]


def test_a_run_from_before_how_still_shows_its_left_out_rows(tmp_path: Path) -> None:
    lines, numbers = expert_answer_lines(_run(tmp_path, with_how=False))
    assert "expert_how_by_split" not in numbers
    assert numbers["left_out"] == 3
    assert "| test | c | 1 | no-logprobs | 2 |" in "\n".join(lines)


def test_a_run_without_an_expert_has_no_such_section(tmp_path: Path) -> None:
    assert expert_answer_lines(tmp_path) == ([], {})
