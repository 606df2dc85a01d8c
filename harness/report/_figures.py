"""The report's figures: one function per figure, plain data in, a PNG out.

Figures are built on `matplotlib.figure.Figure` with the Agg canvas, never through pyplot: no
GUI backend, no global figure state, nothing to close. Each PNG is written atomically.

matplotlib is imported where a figure is made (`_figure`), not with this module: the report's own
process only hands the figures to its workers (`figure_workers`, which import `MATPLOTLIB` as
they start), and the import took most of a second of the report's wall time (issue 25).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from ..data import atomic_path
from ._data import Curve, GainCurve

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "MATPLOTLIB",
    "POLICY_LABELS",
    "cascade_figure",
    "dv_delta_figure",
    "dv_topk_figure",
    "mean_value_figure",
    "realised_figure",
]

# What drawing a figure imports: the figure workers import it as they start.
MATPLOTLIB = ("matplotlib.figure", "matplotlib.backends.backend_agg")

POLICY_LABELS: dict[str, str] = {
    "ctd": "CTD",
    "unc-calibrated": "Unc. calibrated",
    "dv-topk": "DV top-k",
    "unc-topk": "Unc. top-k",
    "oracle-topk": "Oracle top-k",
    "unc-central": "Unc. central-k",
}
_COLOURS = {
    "ctd": "#1f77b4",
    "unc-calibrated": "#ff7f0e",
    "dv-topk": "#2ca02c",
    "unc-topk": "#d62728",
    "oracle-topk": "#9467bd",
    "unc-central": "#8c564b",
}
# Batch sizes in one figure: hues far apart, not shades of one (they must read apart in print).
_BATCH_COLOURS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e")
_METRIC_LABELS = {"auroc": "cascade AUROC", "accuracy": "cascade accuracy", "realised": "realised delegation"}
_METRIC_NAMES = {"auroc": "AUROC", "accuracy": "accuracy"}
_PANEL = (4.2, 3.4)  # inches per panel
_DPI = 110


def _figure(ncols: int, nrows: int = 1) -> tuple[Figure, NDArray]:
    """Panels side by side; the panels of a row share their y-limits, so heights compare."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width = max(_PANEL[0] * ncols, 5.6)  # room for a legend under a single panel
    fig = Figure(figsize=(width, _PANEL[1] * nrows + 0.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey="row")
    for ax in axes.flat:
        ax.tick_params(labelleft=True)  # sharing limits, each panel still labels its axis
    return fig, axes


def _save(fig: Figure, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=_DPI)
    return path


def _style(policy: str) -> dict[str, object]:
    calibrated = policy in ("ctd", "unc-calibrated")
    style: dict[str, object] = {
        "color": _COLOURS.get(policy, "black"),
        "linestyle": "-" if calibrated else "--",
        "label": POLICY_LABELS.get(policy, policy),
    }
    if policy == "ctd":  # its own marker, on top: it must show where other curves coincide with it
        style |= {"marker": "D", "markersize": 4.0, "linewidth": 1.8, "zorder": 5}
    return style


def _ctd_last(lines: Sequence[Curve]) -> list[Curve]:
    """Draw order: CTD last, so no other curve hides it."""
    return sorted(lines, key=lambda c: c.policy == "ctd")


def _band(ax: Axes, x: NDArray, mean: NDArray, std: NDArray, **style: object) -> None:
    """Mean line with a +-1 std band."""
    line = {"marker": "o", "markersize": 2.5, "linewidth": 1.4} | style
    ax.plot(x, mean, **line)
    ax.fill_between(x, mean - std, mean + std, color=line.get("color"), alpha=0.15, linewidth=0)


def _legend(fig: Figure, *axes: Axes) -> None:
    """One legend below the panels (the entries of the given axes), at most two entries per panel
    width in a row."""
    handles, labels = [], []
    for ax in axes:
        found = ax.get_legend_handles_labels()
        handles += found[0]
        labels += found[1]
    if not labels:
        return
    columns = len({ax.get_subplotspec().colspan.start for ax in fig.axes if ax.get_subplotspec()})
    per_row = max(2, 2 * columns)
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), per_row), fontsize="small")


def cascade_figure(
    panels: Mapping[int, Sequence[Curve]],
    baselines: Mapping[str, float],
    *,
    metric: str,
    title: str,
    path: Path,
    gains: Mapping[int, Sequence[GainCurve]] | None = None,
) -> Path:
    """One panel per batch size: every policy's `metric` against target budget (mean +-1 std
    over seeds), with probe-only (dotted) and expert-only (dashed) grey lines; below, when
    `gains` are given, CTD's paired per-seed gains (mean, and the band from the smallest to the
    largest seed's difference) against a zero line."""
    fig, axes = _figure(len(panels), nrows=2 if gains else 1)
    low, high = _curve_limits(
        [c for lines in panels.values() for c in lines], baselines["probe"], min_span=_MIN_SPAN[metric]
    )
    for ax, (batch_size, lines) in zip(axes[0], sorted(panels.items()), strict=True):
        for curve in _ctd_last(lines):
            _band(ax, curve.budgets, curve.mean, curve.std, **_style(curve.policy))
        ax.axhline(baselines["probe"], color="grey", linestyle=":", linewidth=1.2, label="probe only")
        ax.axhline(baselines["expert"], color="grey", linestyle="--", linewidth=1.2, label="expert only")
        ax.set_ylim(low, high)
        if not low <= baselines["expert"] <= high:  # off the axis: say where, do not squeeze the curves
            where = "below" if baselines["expert"] < low else "above"
            ax.text(
                0.98,
                0.02 if where == "below" else 0.98,
                f"expert only: {baselines['expert']:.3f} ({where} the axis)",
                transform=ax.transAxes,
                ha="right",
                va="bottom" if where == "below" else "top",
                fontsize="x-small",
                color="dimgrey",
                bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none", "pad": 1.5},
                zorder=6,
            )
        ax.set_title(f"B = {batch_size}", fontsize="medium")
        ax.set_xlabel("target budget")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel(_METRIC_LABELS[metric])
    if gains:
        _gain_row(axes[1], gains, metric)
    fig.suptitle(title, fontsize="medium")
    _legend(fig, axes[0, 0], *(axes[1, :1] if gains else ()))
    return _save(fig, path)


def _gain_row(axes: Sequence[Axes], gains: Mapping[int, Sequence[GainCurve]], metric: str) -> None:
    """CTD's paired gains per batch size: a line per baseline, its min-max band over seeds."""
    for ax, (batch_size, lines) in zip(axes, sorted(gains.items()), strict=True):
        for gain in lines:
            colour = "grey" if gain.versus == "probe" else _COLOURS.get(gain.versus, "black")
            label = f"CTD - {'probe only' if gain.versus == 'probe' else POLICY_LABELS[gain.versus]}"
            ax.plot(
                gain.budgets, gain.mean, color=colour, marker="o", markersize=2.5, linewidth=1.4, label=label
            )
            ax.fill_between(gain.budgets, gain.low, gain.high, color=colour, alpha=0.18, linewidth=0)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_title(f"paired gain, B = {batch_size}", fontsize="medium")
        ax.set_xlabel("target budget")
        ax.grid(alpha=0.3)
    _at_least(axes[0], _MIN_SPAN[metric])  # the row shares its y-limits
    axes[0].set_ylabel(f"{_METRIC_NAMES[metric]} gain (band: seeds' min-max)")


# The smallest y-range of a metric's panel: differences below it are noise, not a trend to zoom on
# (a 0.003 accuracy gap drawn across the full panel height reads as a large effect).
_MIN_SPAN = {"auroc": 0.05, "accuracy": 0.05, "realised": 0.1}


def _curve_limits(lines: Sequence[Curve], *also: float, min_span: float = 0.0) -> tuple[float, float]:
    """y-limits that hold every curve's band and the given levels, with a 5% margin, widened
    about their middle to at least `min_span`."""
    values = [np.asarray(also, dtype=np.float64)]
    values += [c.mean - c.std for c in lines] + [c.mean + c.std for c in lines]
    finite = np.concatenate(values)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return 0.0, 1.0
    low, high = float(finite.min()), float(finite.max())
    pad = max(0.05 * (high - low), 0.005)
    low, high = low - pad, high + pad
    if high - low < min_span:
        middle = (low + high) / 2
        low, high = middle - min_span / 2, middle + min_span / 2
    return low, high


def realised_figure(
    panels: Mapping[str, Sequence[Curve]], topk: Curve | None, *, title: str, path: Path
) -> Path:
    """One panel per Pareto objective: realised delegation of the calibrated policies against
    target budget, the top-k policies' realised rate and the y = x line."""
    fig, axes = _figure(len(panels))
    for ax, (objective, lines) in zip(axes[0], panels.items(), strict=True):
        _realised_panel(ax, lines, topk)
        ax.set_title(f"selected for {_METRIC_NAMES.get(objective, objective)}", fontsize="medium")
    axes[0, 0].set_ylabel("realised delegation rate")
    fig.suptitle(title, fontsize="medium")
    _legend(fig, axes[0, 0])
    return _save(fig, path)


def _realised_panel(ax: Axes, lines: Sequence[Curve], topk: Curve | None) -> None:
    # Top-k spends exactly its budget, so it lies on y = x: y = x is a wide pale line under it,
    # top-k a dark dashed line with crosses on top, and both stay visible.
    ax.plot([0, 1], [0, 1], color="#bbbbbb", linewidth=4, alpha=0.6, zorder=1, label="y = x")
    if topk is not None:
        ax.plot(
            topk.budgets,
            topk.mean,
            color="#444444",
            linestyle="--",
            linewidth=1.2,
            marker="x",
            markersize=4,
            zorder=3,
            label="top-k",
        )
    for curve in _ctd_last(lines):
        _band(ax, curve.budgets, curve.mean, curve.std, **_style(curve.policy))
    ax.set_xlabel("target budget")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)


_SIGNAL_STYLE = {
    "dv": ("DV probe", _COLOURS["ctd"]),
    "uncertainty": ("uncertainty", _COLOURS["unc-topk"]),
    "oracle": ("oracle (true v)", _COLOURS["oracle-topk"]),
}


def mean_value_figure(
    fractions: NDArray, by_signal: Mapping[str, NDArray], overall: float, *, title: str, path: Path
) -> Path:
    """Mean v of the top-k set against k/N per signal (arrays (seeds, fractions)): mean +-1 std."""
    fig, axes = _figure(1)
    ax = axes[0, 0]
    for name, values in by_signal.items():
        label, colour = _SIGNAL_STYLE[name]
        _band(ax, fractions, values.mean(axis=0), values.std(axis=0), color=colour, label=label)
    ax.axhline(overall, color="grey", linestyle=":", linewidth=1.2, label="all examples")
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xlabel("selection fraction k/N")
    ax.set_ylabel("mean v of the top-k set")
    ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize="medium")
    _legend(fig, ax)
    return _save(fig, path)


def dv_topk_figure(panels: Mapping[str, Mapping[int, Curve]], *, title: str, path: Path) -> Path:
    """DV top-k (continuous DV) AUROC and accuracy against budget, one line per batch size."""
    fig, axes = _figure(len(panels))
    for ax, (metric, by_batch) in zip(axes[0], panels.items(), strict=True):
        for shade, (batch_size, curve) in zip(_BATCH_COLOURS * 4, sorted(by_batch.items()), strict=False):
            _band(ax, curve.budgets, curve.mean, curve.std, color=shade, label=f"B = {batch_size}")
        ax.set_xlabel("target budget")
        ax.set_ylabel(_METRIC_LABELS[metric])
        ax.grid(alpha=0.3)
        _at_least(ax, _MIN_SPAN[metric])
    fig.suptitle(title, fontsize="medium")
    _legend(fig, axes[0, 0])
    return _save(fig, path)


def _at_least(ax: Axes, span: float) -> None:
    """Widen the panel's y-range about its middle to at least `span`."""
    low, high = ax.get_ylim()
    if high - low < span:
        middle = (low + high) / 2
        ax.set_ylim(middle - span / 2, middle + span / 2)


def dv_delta_figure(
    panels: Mapping[str, Mapping[int, tuple[NDArray, NDArray]]], *, title: str, path: Path
) -> Path:
    """Continuous minus binary DV top-k metric against budget (metric -> batch size ->
    (budgets, differences)), one line per batch size, a zero line for reference."""
    fig, axes = _figure(len(panels))
    for ax, (metric, by_batch) in zip(axes[0], panels.items(), strict=True):
        for shade, (batch_size, (budgets, delta)) in zip(
            _BATCH_COLOURS * 4, sorted(by_batch.items()), strict=False
        ):
            ax.plot(budgets, delta, marker="o", markersize=2.5, color=shade, label=f"B = {batch_size}")
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xlabel("target budget")
        ax.set_ylabel(f"{_METRIC_LABELS[metric]}: continuous - binary")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize="medium")
    _legend(fig, axes[0, 0])
    return _save(fig, path)
