"""The run report: tables and figures built from the files a finished run wrote (the scores table,
the sweeps, the validation records). It reads; it never reruns a stage.

`build_report` is imported on first use. Its figures are drawn by worker processes
(`figure_workers`), the only ones that import matplotlib, which no other stage needs.
`summary_tables` (the summary as the terminal prints it) is imported on first use too (PEP 562),
and so are the sweep reader (`read_sweep`, `Sweep`) that `ctd export` shares with the report.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ..run import RunLayout

if TYPE_CHECKING:
    from .._workers import WorkerPool

__all__ = [
    "SUMMARY_COLUMNS",
    "SummaryRow",
    "Sweep",
    "build_report",
    "figure_workers",
    "read_decisions",
    "read_sweep",
    "read_warnings",
    "summary_tables",
]

# The names imported on first use and the module that defines each.
_EXPORTS: dict[str, str] = {
    "SUMMARY_COLUMNS": "._summary_table",
    "SummaryRow": "._summary_table",
    "Sweep": "._data",
    "figure_workers": "._context",
    "read_decisions": "._data",
    "read_sweep": "._data",
    "summary_tables": "._summary_table",
}


def build_report(
    run_dir: Path, *, progress: Callable[[str], None] | None = None, figures: WorkerPool | None = None
) -> Path:
    """Write run_dir/report/ for a finished run and return the path of report/report.md;
    `progress` hears each step (a figure, a table) as it starts; `figures`: the workers that
    draw the figures (`figure_workers()`, maybe started already; default: new ones)."""
    from ._build import build_report as build

    return build(Path(run_dir), progress=progress, figures=figures)


def read_warnings(run_dir: Path) -> list[str]:
    """The warnings (degenerate scorers) of a built report, for the terminal; none when the run
    has no report yet."""
    path = RunLayout(Path(run_dir)).report.numbers
    if not path.is_file():
        return []
    return [str(w) for w in json.loads(path.read_text(encoding="utf-8")).get("warnings", [])]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
