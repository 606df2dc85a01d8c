"""The run report: tables and figures built from the files a finished run wrote (the scores table,
the sweeps, the validation records). It reads; it never reruns a stage.

`build_report` is imported on first use: the report pulls in matplotlib, which no other stage needs.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..run._layout import RunLayout

__all__ = ["build_report", "read_warnings"]


def build_report(run_dir: Path) -> Path:
    """Write run_dir/report/ for a finished run and return the path of report/report.md."""
    from ._build import build_report as build

    return build(Path(run_dir))


def read_warnings(run_dir: Path) -> list[str]:
    """The warnings (degenerate scorers) of a built report, for the terminal; none when the run
    has no report yet."""
    path = RunLayout(Path(run_dir)).report.numbers
    if not path.is_file():
        return []
    return [str(w) for w in json.loads(path.read_text(encoding="utf-8")).get("warnings", [])]
