"""The state the report's sections share: the run's inputs, and the Markdown lines, numbers
and files they produce; plus the small formatting helpers of the Markdown tables."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

import calibrate

from .._workers import WorkerPool
from ..data import BINARY_SUFFIX, ScoresTable, write_table
from ..run import ReportLayout, slug
from ._data import Sweep, mean_std
from ._figures import MATPLOTLIB

__all__ = [
    "METRICS",
    "METRIC_NAMES",
    "ReportContext",
    "figure_workers",
    "fmt",
    "markdown_table",
    "pct",
    "pm",
    "slug",
]

METRICS: tuple[str, ...] = ("auroc", "accuracy")
METRIC_NAMES = {"auroc": "AUROC", "accuracy": "accuracy"}

# Every module that draws a figure, imported by the workers as they start.
_FIGURE_MODULES = (
    "harness.report._figures",
    "harness.report._validation_figures",
    "harness.report._joint_figures",
)


def figure_workers() -> WorkerPool:
    """The worker processes that draw a report's figures, each importing matplotlib and the
    figures' modules first; `start()` them ahead of `build_report(figures=...)` and that import
    overlaps the work before it."""
    return WorkerPool(preload=(*MATPLOTLIB, *_FIGURE_MODULES))


@dataclass
class ReportContext:
    """What every section reads (the run's inputs) and writes (Markdown lines, numbers, files
    under `out`, the staging folder that becomes report/)."""

    run_dir: Path
    out: Path
    scores_table: ScoresTable
    by_arch: dict[str, dict[int, calibrate.Scores]]
    sweeps: dict[str, Sweep]
    progress: Callable[[str], None]
    lines: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # shown first in the report and on the terminal
    curve_rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # drawn while the sections go on, by workers that import the figures' module (matplotlib) first
    figures: WorkerPool = field(default_factory=figure_workers)

    @property
    def configurations(self) -> list[str]:
        """The probe configurations the run validated (and the summary notes on): every arch
        but the binary-DV twins (`--dv-target both`), which are compared in the binary section."""
        return [arch for arch in self.sweeps if not arch.endswith(BINARY_SUFFIX)]

    def arch_numbers(self, arch: str) -> dict[str, Any]:
        return self.numbers.setdefault("archs", {}).setdefault(arch, {})

    @property
    def files(self) -> ReportLayout:
        """Where the report's files go: in `out`, the staging folder that becomes report/."""
        return ReportLayout(self.out)

    def figure_path(self, arch: str, name: str) -> tuple[Path, str]:
        path = self.files.figure(arch, name)
        return path, self.files.relative(path)

    def draw(self, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        """Draw a figure (`function(*args, **kwargs)` writes it) in a worker process; the report
        waits for it before report.md is written."""
        self.figures.submit(function, *args, **kwargs)

    def table(self, path: Path, rows: list[dict[str, Any]]) -> str:
        """Write rows (dicts with the same keys) as a CSV at `path`, one of `files`; return the
        path as the report links it."""
        if rows:
            write_table(path, {k: np.asarray([r[k] for r in rows]) for k in rows[0]})
        return self.files.relative(path)

    def image(self, relative: str, caption: str) -> None:
        """A figure and its one-line caption."""
        self.lines += [f"![{Path(relative).stem}]({relative})", "", f"*{caption}* (`{relative}`)", ""]

    def note(self, text: str) -> None:
        """Say in the report (and in numbers.json) that an input is missing; paths relative to the run."""
        text = text.replace(f"{self.run_dir}/", "")
        self.lines += [f"> Missing: {text}", ""]
        self.missing.append(text)


def fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None or not np.isfinite(value) else f"{value:.{digits}f}"


def pct(value: float | None) -> str:
    return "—" if value is None or not np.isfinite(value) else f"{100 * value:.1f}%"


def pm(values: NDArray, digits: int = 3) -> str:
    mean, std = mean_std(values)
    return f"{fmt(mean, digits)} ± {fmt(std, digits)}"


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows] + [""]
