"""The joint-control validation figure: the budget-accuracy plane of one joint level, its certified
region shaded and every trial's returned policy a point in it. Built like `_figures` (a Figure on
the Agg canvas, one function, plain data in, a PNG out, written atomically)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from ._figures import _figure, _legend, _save

__all__ = ["JointPoints", "joint_plane_figure"]

_MET, _VIOLATED = "#1f77b4", "#d62728"


@dataclass(frozen=True)
class JointPoints:
    """One selector's returned policies over the trials: realised delegation rate and error rate
    (each trial that returned a policy), and whether the trial violated the joint level."""

    budget: NDArray[np.float64]
    error: NDArray[np.float64]
    violated: NDArray[np.bool_]


def joint_plane_figure(
    panels: Mapping[str, JointPoints], *, budget: float, error: float, title: str, path: Path
) -> Path:
    """One panel per selector (panel title -> its points): x the realised delegation rate, y the
    error rate, the certified region {budget <= `budget`, error <= `error`} shaded with its corner
    marked, points that meet both levels in blue and violating ones as red crosses. The panels
    share both axes, so the selectors compare."""
    fig, axes = _figure(len(panels))
    xs = [budget] + [float(p.budget.max()) for p in panels.values() if p.budget.size]
    ys = [error] + [float(p.error.max()) for p in panels.values() if p.error.size]
    right, top = 1.15 * max(xs) + 0.01, 1.15 * max(ys) + 0.01
    for ax, (label, points) in zip(axes[0], panels.items(), strict=True):
        ax.fill_between(
            [0, budget], 0, error, color="#2ca02c", alpha=0.15, linewidth=0, label="certified region"
        )
        ax.plot([budget, budget], [0, error], color="#2ca02c", linewidth=1.2)
        ax.plot([0, budget], [error, error], color="#2ca02c", linewidth=1.2)
        ax.plot(
            [budget],
            [error],
            marker="s",
            color="#2ca02c",
            linestyle="none",
            label=f"levels: budget {budget:g}, error {error:g}",
        )
        met = ~points.violated
        ax.scatter(
            points.budget[met],
            points.error[met],
            s=12,
            color=_MET,
            alpha=0.45,
            linewidths=0,
            label="trial: meets both",
        )
        ax.scatter(
            points.budget[points.violated],
            points.error[points.violated],
            s=22,
            color=_VIOLATED,
            marker="x",
            linewidths=1.0,
            label="trial: violates",
        )
        if not points.budget.size:
            ax.text(0.5, 0.5, "no policy returned", transform=ax.transAxes, ha="center", va="center")
        ax.set_xlim(0, right)
        ax.set_ylim(0, top)
        ax.set_title(label, fontsize="small")
        ax.set_xlabel("realised delegation rate")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("error rate (1 - accuracy)")
    fig.suptitle(title, fontsize="medium")
    _legend(fig, axes[0, 0])
    return _save(fig, path)
