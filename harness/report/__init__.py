"""The run report: tables and figures built from the files a finished run wrote (the scores table,
the sweeps, the validation records). It reads; it never reruns a stage.

`build_report` is imported on first use: the report pulls in matplotlib, which no other stage needs.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["build_report"]


def build_report(run_dir: Path) -> Path:
    """Write run_dir/report/ for a finished run and return the path of report/report.md."""
    from ._build import build_report as build

    return build(Path(run_dir))
