"""What the report's figures must show: histogram bins on the lattice of achievable rates with the
target between two bins, CTD drawn last, axes that fit the curves rather than a far-off expert
line but do not zoom a small gap into a difference, shared y-limits across the panels of a figure,
distinct batch-size colours, top-k visible on the y = x line, and the paired-gain row."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from matplotlib.colors import to_rgb

# Private: the figures' layout and the curves they draw.
import harness.report._figures as fig
import harness.report._validation_figures as validation_fig
from harness.report._data import Curve, GainCurve


@pytest.mark.parametrize(("n", "alpha"), [(340, 0.3), (200, 0.3), (54, 0.2), (1000, 0.1)])
def test_histogram_bins_lie_on_the_lattice_with_alpha_between_bins(n: int, alpha: float) -> None:
    rng = np.random.default_rng(0)
    realised = rng.integers(int(0.5 * alpha * n), int(1.2 * alpha * n), size=200) / n
    edge = int(np.floor(alpha * n + 1e-9))
    bins = validation_fig._lattice_bins([realised], n, edge)
    counts = bins * n - 0.5
    assert np.allclose(counts, np.round(counts))  # every edge halfway between two multiples of 1/n
    widths = np.diff(np.round(counts))
    assert np.all(widths == widths[0])  # every bin holds as many achievable rates
    assert np.any(np.isclose(bins, (edge + 0.5) / n))  # alpha's edge is a bin edge
    assert bins[0] < realised.min() and bins[-1] > realised.max()
    assert bins.size <= validation_fig._MAX_BINS + 2
    # A rate meets alpha exactly when it is left of that edge (integer counts decide violations).
    assert all((r <= alpha + 1e-12) == (r < (edge + 0.5) / n) for r in realised)


def test_ctd_is_drawn_last_with_its_own_marker() -> None:
    x = np.array([0.1, 0.2])
    lines = [Curve(p, x, x, 0 * x, 1) for p in ("ctd", "unc-calibrated", "dv-topk")]
    assert [c.policy for c in fig._ctd_last(lines)] == ["unc-calibrated", "dv-topk", "ctd"]
    assert fig._style("ctd")["marker"] == "D" and "marker" not in fig._style("unc-calibrated")


def test_the_axis_fits_the_curves_not_a_far_expert_line() -> None:
    x = np.array([0.1, 0.5])
    curve = Curve("ctd", x, np.array([0.80, 0.85]), np.array([0.01, 0.02]), 2)
    low, high = fig._curve_limits([curve], 0.78)  # the probe line is held, the expert (0.55) not
    assert 0.76 < low < 0.78 and 0.87 < high < 0.89


def test_panels_share_their_y_limits_and_batch_sizes_read_apart() -> None:
    _, axes = fig._figure(3)
    axes[0, 0].plot([0, 1], [0, 1])
    axes[0, 2].plot([0, 1], [0.4, 0.5])
    assert axes[0, 0].get_ylim() == axes[0, 1].get_ylim() == axes[0, 2].get_ylim()
    colours = [np.array(to_rgb(c)) for c in fig._BATCH_COLOURS[:3]]
    gaps = [np.abs(a - b).max() for i, a in enumerate(colours) for b in colours[i + 1 :]]
    assert min(gaps) > 0.3  # not three shades of one hue


def test_topk_shows_on_top_of_the_y_equals_x_line() -> None:
    """Top-k spends exactly its budget, so its line is y = x: it is drawn above the y = x line,
    darker, dashed, with markers, and y = x is wide enough to show around it."""
    _, axes = fig._figure(1)
    x = np.linspace(0.05, 0.95, 19)
    fig._realised_panel(axes[0, 0], [], Curve("unc-topk", x, x, 0 * x, 1))
    diagonal, topk = axes[0, 0].lines
    assert topk.get_zorder() > diagonal.get_zorder()
    assert np.abs(np.array(to_rgb(topk.get_color())) - to_rgb(diagonal.get_color())).max() > 0.3
    assert diagonal.get_linewidth() >= 3 * topk.get_linewidth()
    assert topk.get_linestyle() == "--" and topk.get_marker() not in (None, "None", "")


@pytest.mark.parametrize("metric", ["auroc", "accuracy"])
def test_a_small_gap_is_not_zoomed_into_a_difference(metric: str) -> None:
    """Curves 0.003 apart (the default run's CTD and probe accuracy): the panel spans at least
    the metric's minimum range, so the gap takes a few percent of its height, not all of it."""
    x = np.array([0.1, 0.5])
    lines = [
        Curve("ctd", x, np.array([0.661, 0.661]), 0 * x, 3),
        Curve("unc-topk", x, np.array([0.658, 0.658]), 0 * x, 3),
    ]
    low, high = fig._curve_limits(lines, 0.658, min_span=fig._MIN_SPAN[metric])
    assert high - low >= fig._MIN_SPAN[metric] >= 0.05
    assert low < 0.658 and high > 0.661
    assert 0.003 / (high - low) <= 0.06
    wide = [Curve("ctd", x, np.array([0.6, 0.8]), 0 * x, 3)]  # a range wider than the minimum is kept
    low, high = fig._curve_limits(wide, min_span=fig._MIN_SPAN[metric])
    assert 0.58 < low < 0.6 and 0.8 < high < 0.82


def test_the_cascade_figure_adds_a_row_of_paired_gains(tmp_path: Path) -> None:
    x = np.array([0.1, 0.2, 0.3])
    curves = {32: [Curve("ctd", x, np.array([0.8, 0.82, 0.84]), 0.01 + 0 * x, 3)]}
    gains = {
        32: [
            GainCurve("probe", x, np.array([0.01, 0.03, 0.05]), np.array([0.0, 0.02, 0.03]), x / 4, 3),
            GainCurve("unc-topk", x, np.array([0.02, 0.05, 0.1]), np.array([-0.01, 0.03, 0.08]), x / 2, 3),
        ]
    }
    baselines = {"probe": 0.79, "expert": 0.6}
    plain = fig.cascade_figure(curves, baselines, metric="auroc", title="t", path=tmp_path / "plain.png")
    paired = fig.cascade_figure(
        curves, baselines, metric="auroc", title="t", path=tmp_path / "paired.png", gains=gains
    )
    plain_image, paired_image = matplotlib.image.imread(plain), matplotlib.image.imread(paired)
    assert paired_image.shape[0] > 1.6 * plain_image.shape[0]  # a second row of panels
