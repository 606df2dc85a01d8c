"""The summary's tidy rows (report/tables/summary.csv) as typed records, and laid out as the
tables the report and the terminal show: one table per probe configuration and part, a row per
metric, a column per budget (or per selector). Numbers and text only, so that `ctd eval` and
`ctd report` print the summary without loading what builds it.

A `SummaryRow` is one line of the CSV, its fields the CSV's columns in order; NaN is an empty cell.
The CSV has no version field (its bytes are the report's contract): its version is its header,
checked on read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass, fields
from typing import Literal, get_args

__all__ = [
    "SUMMARY_COLUMNS",
    "SummaryKind",
    "SummaryPart",
    "SummaryRow",
    "SummaryTable",
    "format_cell",
    "summary_tables",
]

SummaryKind = Literal["score", "gain", "rate"]
"""How a value reads: a score (three decimals), a gain over a baseline, a rate (percent)."""
SummaryPart = Literal["budget", "performance"]
"""The part of a probe configuration's summary: columns are budgets, or selectors at one level."""


@dataclass(frozen=True)
class SummaryRow:
    """One row of report/tables/summary.csv."""

    arch: str
    part: SummaryPart
    metric: str
    column: str  # the column's header: a budget as written ("0.1") or a selector
    at: float  # the budget or error level
    value: float  # NaN: not measured
    low: float  # the smallest per-seed gain of a "gain" row; NaN otherwise
    high: float  # the largest per-seed gain of a "gain" row; NaN otherwise
    kind: SummaryKind
    title: str  # the part's heading, the same on every row of the part

    @classmethod
    def from_cells(cls, cells: Mapping[str, str], where: str) -> SummaryRow:
        """A row from its CSV cells (text as written; "" is NaN); a bad cell is one InputError
        line naming `where` (file and line)."""
        from .._errors import InputError  # only a reader refuses; the printers need nothing

        def number(name: str) -> float:
            text = cells[name]
            try:
                return math.nan if text == "" else float(text)
            except ValueError:
                raise InputError(f"{where}: {name} {text!r} is not a number") from None

        def choice(name: str, allowed: tuple[str, ...]) -> str:
            if cells[name] not in allowed:
                raise InputError(f"{where}: {name} {cells[name]!r}: expected one of {', '.join(allowed)}")
            return cells[name]

        return cls(
            arch=cells["arch"],
            part=choice("part", get_args(SummaryPart)),  # type: ignore[arg-type]
            metric=cells["metric"],
            column=cells["column"],
            at=number("at"),
            value=number("value"),
            low=number("low"),
            high=number("high"),
            kind=choice("kind", get_args(SummaryKind)),  # type: ignore[arg-type]
            title=cells["title"],
        )

    def cells(self) -> dict[str, str]:
        """The row as the CSV holds it (floats as Python writes them, NaN as "")."""
        return {
            name: ("" if math.isnan(v) else repr(v)) if isinstance(v, float) else str(v)
            for name, v in zip(SUMMARY_COLUMNS, astuple(self), strict=True)
        }


SUMMARY_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(SummaryRow))
"""The CSV's header, in order."""


@dataclass(frozen=True)
class SummaryTable:
    """One part of one probe configuration's summary, as shown: `rows` are (metric, cells)."""

    title: str
    columns: list[str]
    rows: list[tuple[str, list[str]]]


def format_cell(kind: str, value: float, low: float = math.nan, high: float = math.nan) -> str:
    """A score with three decimals, a gain signed with its [low, high] range, a rate in percent;
    a missing number as —."""
    if not math.isfinite(value):
        return "—"
    if kind == "rate":
        return f"{100 * value:.1f}%"
    if kind == "gain":
        shown = f"{value:+.3f}"
        return shown + (f" [{low:+.3f}, {high:+.3f}]" if math.isfinite(low) and math.isfinite(high) else "")
    return f"{value:.3f}"


def summary_tables(rows: Sequence[SummaryRow]) -> list[SummaryTable]:
    """The tables of summary rows, in the order of their first row; a cell no row fills is —."""
    parts: dict[tuple[str, str], list[SummaryRow]] = {}
    for row in rows:
        parts.setdefault((row.arch, row.part), []).append(row)
    out = []
    for part_rows in parts.values():
        columns = list(dict.fromkeys(r.column for r in part_rows))
        cells: dict[str, dict[str, str]] = {}
        for r in part_rows:
            cells.setdefault(r.metric, {})[r.column] = format_cell(r.kind, r.value, r.low, r.high)
        body = [(metric, [by_column.get(c, "—") for c in columns]) for metric, by_column in cells.items()]
        out.append(SummaryTable(part_rows[0].title, columns, body))
    return out
