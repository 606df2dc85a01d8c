"""The state the report's sections share: the run's inputs, and the Markdown lines, numbers
and files they produce; plus the small formatting helpers of the Markdown tables."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

import calibrate

from ..data._scores import ScoresTable
from ..data._tables import write_table
from ._data import Sweep, mean_std

__all__ = ["METRICS", "METRIC_NAMES", "ReportContext", "fmt", "markdown_table", "pct", "pm", "slug"]

METRICS: tuple[str, ...] = ("auroc", "accuracy")
METRIC_NAMES = {"auroc": "AUROC", "accuracy": "accuracy"}


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

    def arch_numbers(self, arch: str) -> dict[str, Any]:
        return self.numbers.setdefault("archs", {}).setdefault(arch, {})

    def figure_path(self, arch: str, name: str) -> tuple[Path, str]:
        relative = f"figures/{slug(arch)}/{name}.png"
        return self.out / relative, relative

    def table(self, relative: str, rows: list[dict[str, Any]]) -> str:
        """Write rows (dicts with the same keys) as a CSV under the report; return its path."""
        if not rows:
            return relative
        write_table(self.out / relative, {k: np.asarray([r[k] for r in rows]) for k in rows[0]})
        return relative

    def image(self, relative: str, caption: str) -> None:
        """A figure and its one-line caption."""
        self.lines += [f"![{Path(relative).stem}]({relative})", "", f"*{caption}* (`{relative}`)", ""]

    def note(self, text: str) -> None:
        """Say in the report (and in numbers.json) that an input is missing; paths relative to the run."""
        text = text.replace(f"{self.run_dir}/", "")
        self.lines += [f"> Missing: {text}", ""]
        self.missing.append(text)


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


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
