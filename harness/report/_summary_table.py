"""The summary's tidy rows (report/tables/summary.csv) laid out as the tables the report and the
terminal show: one table per probe configuration and part, a row per metric, a column per budget
(or per selector). Plain text in and out, so that `ctd eval` and `ctd report` print the summary
without loading what builds it.

A summary row holds: arch, part ("budget" or "performance"), metric, column (its header), at (the
budget or error level), value, low and high (the range of a per-seed gain; NaN otherwise), kind
(how the value reads: "score", "gain" or "rate") and title (the part's heading, the same on every
row of the part).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["SUMMARY_COLUMNS", "SummaryKind", "SummaryTable", "format_cell", "summary_tables"]

SummaryKind = Literal["score", "gain", "rate"]
SUMMARY_COLUMNS: tuple[str, ...] = (
    "arch",
    "part",
    "metric",
    "column",
    "at",
    "value",
    "low",
    "high",
    "kind",
    "title",
)


@dataclass(frozen=True)
class SummaryTable:
    """One part of one probe configuration's summary, as shown: `rows` are (metric, cells)."""

    title: str
    columns: list[str]
    rows: list[tuple[str, list[str]]]


def _number(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def format_cell(kind: str, value: object, low: object = math.nan, high: object = math.nan) -> str:
    """A score with three decimals, a gain signed with its [low, high] range, a rate in percent;
    a missing number as —."""
    v, lo, hi = _number(value), _number(low), _number(high)
    if not math.isfinite(v):
        return "—"
    if kind == "rate":
        return f"{100 * v:.1f}%"
    if kind == "gain":
        shown = f"{v:+.3f}"
        return shown + (f" [{lo:+.3f}, {hi:+.3f}]" if math.isfinite(lo) and math.isfinite(hi) else "")
    return f"{v:.3f}"


def summary_tables(rows: Sequence[Mapping[str, object]]) -> list[SummaryTable]:
    """The tables of summary rows (as written, or read back as text), in the order of their
    first row; a cell no row fills is —."""
    parts: dict[tuple[str, str], list[Mapping[str, object]]] = {}
    for row in rows:
        parts.setdefault((str(row["arch"]), str(row["part"])), []).append(row)
    out = []
    for part_rows in parts.values():
        columns = list(dict.fromkeys(str(r["column"]) for r in part_rows))
        cells: dict[str, dict[str, str]] = {}
        for r in part_rows:
            cells.setdefault(str(r["metric"]), {})[str(r["column"])] = format_cell(
                str(r["kind"]), r["value"], r.get("low"), r.get("high")
            )
        body = [(metric, [by_column.get(c, "—") for c in columns]) for metric, by_column in cells.items()]
        out.append(SummaryTable(str(part_rows[0]["title"]), columns, body))
    return out
