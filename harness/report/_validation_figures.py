"""The validation section's figures: histograms of realised rates over random splits on the
lattice of achievable rates, and violation rates against the target level."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from ._figures import _figure, _legend, _save

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "RateLine",
    "budget_validation_figure",
    "performance_validation_figure",
    "validation_levels_figure",
]


def _histogram(ax: Axes, values: NDArray, bins: NDArray, colour: str) -> None:
    if values.size:
        ax.hist(values, bins=bins, color=colour, alpha=0.8, edgecolor="white", linewidth=0.5)
    else:
        ax.text(0.5, 0.5, "no policy returned", transform=ax.transAxes, ha="center", va="center")


_MAX_BINS = 60  # lattice points are grouped, k at a time, when a range holds more


def _lattice_bins(groups: Sequence[NDArray], n: int, edge: int) -> NDArray:
    """Bin edges for rates that are multiples of 1/n (k/n, k an integer count): each bin holds the
    same number of lattice points, so bars do not alternate in height, and one edge lies at
    (edge + 0.5)/n, between the last count that meets a target and the first that violates it."""
    values = np.concatenate([*groups, [edge / n, (edge + 1) / n]])
    counts = np.round(values * n)
    low, high = int(counts.min()), int(counts.max())
    step = max(1, int(np.ceil((high - low + 1) / _MAX_BINS)))
    first = edge - step * int(np.ceil((edge - low + 1) / step))  # last edge at or below low - 0.5
    last = edge + step * int(np.ceil((high - edge) / step))
    return (np.arange(first, last + 1, step) + 0.5) / n


def budget_validation_figure(
    panels: Mapping[str, NDArray], *, alpha: float, population: int, title: str, path: Path
) -> Path:
    """Histograms of the realised budget over random splits, one panel per procedure (panel
    title -> realised rates of the trials): rates are multiples of 1/population, binned on that
    lattice, with alpha drawn between the bins that meet it and those that violate it."""
    fig, axes = _figure(len(panels))
    edge = int(np.floor(alpha * population + 1e-9))  # the most delegations that meet alpha
    bins = _lattice_bins(list(panels.values()), population, edge)
    for ax, (label, realised) in zip(axes[0], panels.items(), strict=True):
        _histogram(ax, realised, bins, "#1f77b4")
        ax.axvline((edge + 0.5) / population, color="red", linewidth=1.4, label=f"alpha = {alpha:g}")
        ax.set_title(label, fontsize="small")
        ax.set_xlabel(f"realised delegation rate (k / {population})")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("trials")
    fig.suptitle(title, fontsize="medium")
    _legend(fig, axes[0, 0])
    return _save(fig, path)


def performance_validation_figure(
    panels: Mapping[str, NDArray], *, alpha: float, population: int, title: str, path: Path
) -> Path:
    """Histograms of accuracy among the trials that returned a policy, one panel per selector
    (panel title -> accuracies), on the lattice of multiples of 1/population, with 1 - alpha
    drawn between the accuracies that violate it and those that meet it."""
    fig, axes = _figure(len(panels))
    edge = int(np.ceil((1 - alpha) * population - 1e-9)) - 1  # the most correct answers that violate
    bins = _lattice_bins(list(panels.values()), population, edge)
    colours = iter(("#1f77b4", "#ff7f0e", "#2ca02c"))
    for ax, (label, accuracy) in zip(axes[0], panels.items(), strict=True):
        _histogram(ax, accuracy, bins, next(colours))
        ax.axvline(
            (edge + 0.5) / population,
            color="red",
            linestyle="--",
            linewidth=1.4,
            label=f"1 - alpha = {1 - alpha:g}",
        )
        ax.set_title(label, fontsize="small")
        ax.set_xlabel(f"accuracy (k / {population})")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("trials (policy returned)")
    fig.suptitle(title, fontsize="medium")
    _legend(fig, axes[0, 0])
    return _save(fig, path)


@dataclass(frozen=True)
class RateLine:
    """A rate against the target level: solid with its 95% band (low, high) when measured on
    the population, dashed and without a band for the paper protocol."""

    label: str
    colour: str
    x: NDArray
    y: NDArray
    low: NDArray | None = None
    high: NDArray | None = None
    dashed: bool = False


def _rate_panel(ax: Axes, lines: Sequence[RateLine], *, xlabel: str, ylabel: str, title: str) -> None:
    if not lines:
        ax.text(0.5, 0.5, "not validated", transform=ax.transAxes, ha="center", va="center")
    for line in lines:
        style = "--" if line.dashed else "-"
        ax.plot(
            line.x, line.y, linestyle=style, marker="o", markersize=2.5, color=line.colour, label=line.label
        )
        if line.low is not None and line.high is not None:
            ax.fill_between(line.x, line.low, line.high, color=line.colour, alpha=0.15, linewidth=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize="medium")
    ax.grid(alpha=0.3)


def _rate_top(lines: Sequence[RateLine], floor: float) -> float:
    """The shared upper y-limit of rate panels: every line and band, and `floor`, with a margin."""
    values = [np.array([floor])] + [line.y for line in lines]
    values += [line.high for line in lines if line.high is not None]
    finite = np.concatenate([np.asarray(v, dtype=np.float64) for v in values])
    return 1.08 * float(finite[np.isfinite(finite)].max())


def validation_levels_figure(
    panels: Mapping[str, tuple[Sequence[RateLine], Sequence[RateLine]]],
    *,
    delta: float,
    title: str,
    path: Path,
) -> Path:
    """One column per guarantee (title -> (violation-rate lines, second-row lines)): the
    violation rate against the target level with a line at delta above, and below it what
    the selector spent (budget control: realised delegation against the y = x line) or how
    often it returned a policy (performance control: selection rate)."""
    fig, axes = _figure(len(panels), nrows=2)
    for column, (name, (violations, below)) in enumerate(panels.items()):
        top, bottom = axes[0, column], axes[1, column]
        xlabel = "target budget alpha" if name.startswith("budget") else "target error level alpha"
        _rate_panel(top, violations, xlabel=xlabel, ylabel="violation rate", title=name)
        top.axhline(delta, color="red", linewidth=1.2, label=f"delta = {delta:g}")
        top.set_ylim(0, _rate_top([line for above, _ in panels.values() for line in above], delta))
        budget = name.startswith("budget")
        _rate_panel(
            bottom,
            below,
            xlabel=xlabel,
            ylabel="mean realised delegation" if budget else "selection rate",
            title="delegation spent (population)" if budget else "trials that returned a policy",
        )
        if budget:
            bottom.plot([0, 1], [0, 1], color="black", linestyle=":", linewidth=1, label="y = x")
            bottom.set_xlim(0, 1)
        bottom.set_ylim(0, 1.02)
        for ax in (top, bottom):
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize="x-small", loc="best")
    fig.suptitle(title, fontsize="medium")
    return _save(fig, path)
