"""How the expert's scores were obtained, per split, and the examples it left out, with their
labels and groups: read from the query stage's table (query/expert_scores.parquet, its `how`,
`source`, `label` and `group` columns; `experts._recovery` names the ways)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ..data import read_table
from ..run import RunLayout
from ._context import ReportContext, markdown_table

__all__ = ["expert_answer_lines", "expert_answers_section"]

_SPLITS = ("dev", "test")
_PLAIN = ("top-k", "likelihood")  # the item's own request answered (experts._recovery)


def expert_answers_section(ctx: ReportContext) -> None:
    """The section's lines and numbers into the report."""
    lines, numbers = expert_answer_lines(ctx.run_dir)
    ctx.lines += lines
    ctx.numbers |= numbers


def expert_answer_lines(run_dir: Path) -> tuple[list[str], dict[str, Any]]:
    """The Markdown lines and numbers.json entries for a run folder; none when the run asked no
    expert (no query table)."""
    layout = RunLayout(run_dir).query
    if layout.expert_scores.is_file():
        table = read_table(layout.expert_scores).columns
    elif layout.failed.is_file():  # the scores table gone: the failures list alone, no labels
        table = read_table(layout.failed).columns
        table["source"] = np.full(len(table.get("id", [])), "failed")
    else:
        return [], {}
    n = len(table.get("id", []))
    source = table["source"].astype(str) if "source" in table else np.full(n, "expert")
    failed = source == "failed"
    split = _column(table, "split", n)
    lines: list[str] = []
    numbers: dict[str, Any] = {}
    if "how" in table:  # runs from before the recovery ladder have no `how`
        how = np.where(failed, "left out", table["how"].astype(str))
        by_split = {s: Counter(how[split == s].tolist()) for s in _SPLITS if (split == s).any()}
        numbers["expert_how_by_split"] = {s: dict(sorted(c.items())) for s, c in by_split.items()}
        ways = sorted({w for c in by_split.values() for w in c}, key=_order)
        if any(w not in _PLAIN for w in ways):
            rows = [[s, *(_share(c[w], sum(c.values())) for w in ways)] for s, c in by_split.items()]
            lines += [
                "**How the expert's scores were obtained** (share of each split's examples; "
                "`experts._recovery`: `wider-top-k` read more top logprobs, `choice-spellings` "
                "constrained the answer to the label words, `choice` (an older cache's rows) to their "
                "lower-case spellings alone, `named-labels` named them in the prompt):",
                "",
                *markdown_table(["split", *ways], rows),
            ]
        else:
            lines += ["Every expert score came from the example's own request (no recovery was needed).", ""]
    lines += _left_out_lines(table, failed, split, layout.failed, run_dir, numbers)
    return lines, numbers


def _left_out_lines(
    table: dict[str, np.ndarray],
    failed: np.ndarray,
    split: np.ndarray,
    failed_file: Path,
    run_dir: Path,
    numbers: dict[str, Any],
) -> list[str]:
    """How many examples the expert failed on, by split, group, label and reason: they are not
    in the scores table, so calibration and every number below went without them."""
    n = int(failed.sum())
    numbers["left_out"] = n
    if n == 0:
        return ["The expert answered every dev and test example; none was left out.", ""]
    group = _column(table, "group", len(failed))[failed]
    label = _labels(table, failed)
    reason = _column(table, "reason", len(failed))[failed]
    split = split[failed]
    by_group = Counter(zip(split.tolist(), group.tolist(), strict=True))
    numbers["left_out_by_split_group"] = {f"{s}/{g}": c for (s, g), c in sorted(by_group.items())}
    rows = Counter(zip(split.tolist(), group.tolist(), label.tolist(), reason.tolist(), strict=True))
    numbers["left_out_rows"] = [
        {"split": s, "group": g, "label": lab, "reason": r, "count": c}
        for (s, g, lab, r), c in sorted(rows.items())
    ]
    high = int((label == "1").sum())
    where = failed_file.relative_to(run_dir) if failed_file.is_relative_to(run_dir) else failed_file
    return [
        f"**Left out**: the expert failed on {n} examples ({high} labelled high-stakes), which are "
        f"not in the scores table (their ids and reasons: `{where}`; `ctd eval --retry-failed` asks "
        "again). Leaving them out can bias calibration towards the examples the expert answers:",
        "",
        *markdown_table(
            ["split", "group", "label", "reason", "left out"],
            [[s, g, lab, r, str(c)] for (s, g, lab, r), c in sorted(rows.items())],
        ),
    ]


def _column(table: dict[str, np.ndarray], name: str, n: int) -> np.ndarray:
    return table[name].astype(str) if name in table else np.full(n, "—")


def _labels(table: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """The rows' labels as text: "1" high-stakes, "0" low, "—" unlabelled or not recorded."""
    if "label" not in table:
        return np.full(int(rows.sum()), "—")
    values = np.asarray(table["label"])[rows]
    return np.array(["—" if str(v) in ("-1", "", "nan") else str(int(float(v))) for v in values], dtype=str)


def _share(count: int, total: int) -> str:
    return f"{100 * count / total:.1f}% ({count})" if total else "—"


def _order(way: str) -> tuple[int, str]:
    known = ("top-k", "likelihood", "wider-top-k", "choice-spellings", "choice", "named-labels", "left out")
    return (known.index(way) if way in known else len(known) - 1, way)
