"""The sections of the run report built on the sweeps and the scores table: cascade curves,
realised delegation, the group table, DV-probe diagnostics, binary vs continuous DV and the
score-merging controls. Each appends Markdown lines, numbers, CSV tables and figures to a
`ReportContext`; `harness.report._build` lists them in order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._errors import InputError
from ..run import RunLayout
from . import _figures as fig
from ._context import METRIC_NAMES, METRICS, ReportContext, fmt, markdown_table, pct, pm
from ._data import (
    BINARY_SUFFIX,
    GROUP_POLICIES,
    Curve,
    Sweep,
    curves,
    gain_curves,
    group_result,
    mean_std,
    read_sweep,
    value_at,
)
from ._dv_data import MEAN_V_FRACTIONS, dv_quality_rows, mean_value_curves

__all__ = [
    "binary_section",
    "cascade_section",
    "dv_quality_section",
    "group_section",
    "mean_value_section",
    "merge_section",
    "realised_section",
]

GROUP_BUDGET = 0.2
BINARY_BUDGETS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5)
MEAN_V_TABLE_FRACTIONS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5)
MERGE_CONTROLS: tuple[str, ...] = ("overwrite", "average")


# ---------------------------------------------------------------- cascade curves


def _curve_rows(lines: list[Curve], **keys: object) -> list[dict[str, Any]]:
    return [
        {**keys, "policy": c.policy, "budget": float(b), "mean": float(m), "std": float(s), "seeds": c.seeds}
        for c in lines
        for b, m, s in zip(c.budgets, c.mean, c.std, strict=True)
    ]


def _cascade_figures(
    ctx: ReportContext, arch: str, sweep: Sweep, *, merge: str, name: str, what: str
) -> None:
    """The AUROC and the accuracy figure of one sweep folder, calibrated policies selected for
    the metric shown (as the paper does)."""
    for metric in METRICS:
        objective = sweep.objective_for(metric)
        panels = {b: curves(sweep, metric, objective=objective, batch_size=b) for b in sweep.batch_sizes}
        for b, lines in panels.items():
            ctx.curve_rows.setdefault(arch, []).extend(
                _curve_rows(lines, merge=merge, metric=metric, objective=objective, batch_size=b)
            )
        baselines = {who: sweep.baseline(f"{who}_{metric}")[0] for who in ("probe", "expert")}
        gains = {b: gain_curves(sweep, metric, batch_size=b) for b in sweep.batch_sizes}
        seeds = max((g.seeds for lines in gains.values() for g in lines), default=0)
        path, relative = ctx.figure_path(arch, f"{name}-{metric}")
        ctx.draw(
            fig.cascade_figure,
            panels,
            baselines,
            metric=metric,
            title=f"{arch}: {what}",
            path=path,
            gains=gains,
        )
        ctx.image(
            relative,
            f"{arch}, {what}: cascade {METRIC_NAMES[metric]} vs target budget, one panel per batch size; "
            f"calibrated policies (solid) selected for {METRIC_NAMES[objective]}, top-k dashed; grey: probe "
            "only (dotted), expert only (dashed; named in a corner when it falls off the axis, which fits "
            "the curves); CTD drawn last, with diamonds. The calibrated policies decide each input on its "
            "own, so their curves are the same in every panel; top-k takes k = round(budget x B) per batch. "
            "DV top-k (the DV probe's k highest) and Oracle top-k (the k whose expert answer helps most, "
            "known only with the labels) are references without a guarantee. Below: CTD's paired gain over "
            "the probe alone and "
            f"over Unc. top-k, each seed's CTD minus the same seed's baseline; line: the mean over the "
            f"{seeds} seeds, band: the smallest to the largest seed's difference (above zero: CTD ahead "
            "in every seed).",
        )


def cascade_section(ctx: ReportContext) -> None:
    ctx.lines += ["## Cascade performance vs target budget", ""]
    for arch, sweep in ctx.sweeps.items():
        ctx.progress(f"{arch}: cascade curves")
        _cascade_figures(
            ctx, arch, sweep, merge="default", name="cascade", what="method-specific merge rules"
        )


def realised_section(ctx: ReportContext) -> None:
    ctx.lines += ["## Realised delegation vs target budget", ""]
    for arch, sweep in ctx.sweeps.items():
        largest = max(sweep.batch_sizes)
        panels = {}
        for objective in sweep.objectives:
            lines = curves(sweep, "realised", objective=objective, batch_size=largest)
            panels[objective] = [c for c in lines if c.policy in ("ctd", "unc-calibrated")]
            ctx.curve_rows.setdefault(arch, []).extend(
                _curve_rows(
                    lines, merge="default", metric="realised", objective=objective, batch_size=largest
                )
            )
        lines = curves(sweep, "realised", objective=sweep.objectives[0], batch_size=largest)
        topk = [c for c in lines if c.policy in ("dv-topk", "unc-topk", "oracle-topk")]
        path, relative = ctx.figure_path(arch, "realised")
        ctx.draw(
            fig.realised_figure,
            panels,
            topk[0] if topk else None,
            title=f"{arch}: realised delegation",
            path=path,
        )
        ctx.image(
            relative,
            f"{arch}: realised delegation rate of CTD and Unc. calibrated vs target budget (one panel "
            f"per Pareto objective); top-k at B = {largest} (dark dashed, crosses) spends its budget "
            "rounded to whole calls per batch (k = round(budget x B)), so it runs along y = x (the wide "
            "pale line).",
        )


# ---------------------------------------------------------------- groups, DV quality, mean v


def group_section(ctx: ReportContext) -> None:
    ctx.lines += [f"## Group-conditional results at budget {GROUP_BUDGET:g}", ""]
    for arch, sweep in ctx.sweeps.items():
        where = sweep.files.groups.relative_to(ctx.run_dir)
        budget = sweep.grid_point(GROUP_BUDGET)
        if sweep.groups is None:
            ctx.note(f"{arch}: no {where} (an older `ctd calibrate` wrote this folder; run it again).")
            continue
        if budget is None:
            ctx.note(
                f"{arch}: budget {GROUP_BUDGET:g} is not on calibrate/{arch}'s budget grid; no group table."
            )
            continue
        batch = max(sweep.batch_sizes)
        result = group_result(
            sweep.groups, budget=budget, objective=sweep.objective_for("auroc"), batch_size=batch
        )
        ctx.arch_numbers(arch)["groups"] = {
            "budget": result.budget,
            "objective": result.objective,
            "batch_size": result.batch_size,
            "rows": result.rows,
        }
        if not result.rows:
            ctx.note(f"{arch}: the scores table has no groups.")
            continue
        relative = ctx.table(ctx.files.table(arch, "groups"), result.rows)
        header = ["group", "n", "mean v all", "mean v CTD", "mean v Unc", "rate CTD", "rate Unc"]
        body = [
            [
                r["group"],
                str(r["n"]),
                fmt(r["mean_v_all"]),
                fmt(r["mean_v_ctd"]),
                fmt(r["mean_v_unc-topk"]),
                pct(r["rate_ctd"]),
                pct(r["rate_unc-topk"]),
            ]
            for r in result.rows
        ]
        absent = [p for p in GROUP_POLICIES if p not in sweep.policies]
        ctx.lines += [f"**{arch}** (`{relative}`)", "", *markdown_table(header, body)]
        ctx.lines += [
            f"Means over seeds of `{where}`, the group table `ctd calibrate` wrote from the sweep's own "
            f"delegation masks on each seed's evaluation half (n sums the halves): CTD by budget control at "
            f"alpha = {GROUP_BUDGET:g} selected for {METRIC_NAMES.get(result.objective, result.objective)}, "
            f"Unc. top-k per batch of B = {batch}."
            + (f" Not swept, so shown as —: {', '.join(absent)}." if absent else ""),
            "",
        ]


def dv_quality_section(ctx: ReportContext) -> None:
    ctx.lines += ["## DV-probe quality", ""]
    for arch, sweep in ctx.sweeps.items():
        rows = dv_quality_rows(sweep, ctx.by_arch[arch])
        mse, spearman = (np.array([r[k] for r in rows]) for k in ("mse", "spearman"))
        ctx.arch_numbers(arch)["dv_quality"] = {
            "seeds": rows,
            "mse": dict(zip(("mean", "std"), mean_std(mse), strict=True)),
            "spearman": dict(zip(("mean", "std"), mean_std(spearman), strict=True)),
        }
        relative = ctx.table(ctx.files.table(arch, "dv-quality"), rows)
        body = [[str(r["seed"]), str(r["n"]), fmt(r["mse"]), fmt(r["spearman"])] for r in rows]
        body.append(["mean ± std", "", pm(mse), pm(spearman)])
        ctx.lines += [f"**{arch}** (`{relative}`)", ""]
        ctx.lines += markdown_table(["seed", "test rows", "MSE", "Spearman"], body)
    ctx.lines += [
        "MSE and Spearman's rho of the DV score against the true v on each seed's test rows, as "
        f"`ctd calibrate` wrote them (`{RunLayout(Path()).sweep('<arch>').summary}`, `dv_quality`).",
        "",
    ]


def mean_value_section(ctx: ReportContext) -> None:
    ctx.lines += ["## Mean v of the top-k set", ""]
    for arch, by_seed in ctx.by_arch.items():
        ctx.progress(f"{arch}: mean v at top-k")
        found = mean_value_curves(by_seed)
        signals = {k: found[k] for k in ("dv", "uncertainty", "oracle")}
        overall = float(found["all"].mean())
        grid = MEAN_V_FRACTIONS.tolist()
        at = {f: grid.index(f) for f in MEAN_V_TABLE_FRACTIONS}  # exact points of the grid
        ctx.arch_numbers(arch)["mean_v_at_k"] = {
            "all": overall,
            **{
                name: {
                    f"{f:g}": dict(zip(("mean", "std"), mean_std(values[:, i]), strict=True))
                    for f, i in at.items()
                }
                for name, values in signals.items()
            },
        }
        rows = [
            {
                "fraction": float(f),
                "signal": name,
                "mean": float(values[:, i].mean()),
                "std": float(values[:, i].std()),
            }
            for name, values in signals.items()
            for i, f in enumerate(MEAN_V_FRACTIONS)
        ]
        relative = ctx.table(ctx.files.table(arch, "mean-v-at-k"), rows)
        body = [[name, *(pm(values[:, i]) for i in at.values())] for name, values in signals.items()]
        ctx.lines += markdown_table(["signal", *(f"k/N = {f:g}" for f in at)], body)
        path, fig_relative = ctx.figure_path(arch, "mean-v-at-k")
        ctx.draw(
            fig.mean_value_figure,
            MEAN_V_FRACTIONS,
            signals,
            overall,
            title=f"{arch}: mean v at top-k",
            path=path,
        )
        ctx.image(
            fig_relative,
            f"{arch}: mean v of the top-k test examples ranked by the DV probe, uncertainty and the true v, "
            f"vs k/N (mean ± 1 std over seeds; table `{relative}`).",
        )


# ---------------------------------------------------------------- binary DV and merge controls


def _dv_topk(sweep: Sweep, metric: str) -> dict[int, Curve]:
    objective = sweep.objective_for(metric)
    out = {}
    for batch in sweep.batch_sizes:
        found = [
            c for c in curves(sweep, metric, objective=objective, batch_size=batch) if c.policy == "dv-topk"
        ]
        if found:
            out[batch] = found[0]
    return out


def _difference(continuous: Curve, binary: Curve) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Continuous minus binary mean at the budgets both grids hold (exact points)."""
    shared, i, j = np.intersect1d(continuous.budgets, binary.budgets, return_indices=True)
    return shared, continuous.mean[i] - binary.mean[j]


def _binary_pair(ctx: ReportContext, arch: str, binary: Sweep, continuous: Sweep) -> None:
    batch = max(continuous.batch_sizes)
    rows, off_grid = [], []
    for budget in BINARY_BUDGETS:
        row: dict[str, Any] = {"budget": budget}
        for name, sweep, folder in (
            ("binary", binary, f"{arch}{BINARY_SUFFIX}"),
            ("continuous", continuous, arch),
        ):
            point = sweep.grid_point(budget)
            if point is None:
                off_grid.append(f"{budget:g} (calibrate/{folder})")
            for metric in METRICS:
                row[f"{name}_{metric}"] = (
                    float("nan")
                    if point is None
                    else value_at(
                        sweep,
                        metric,
                        policy="dv-topk",
                        objective=sweep.objective_for(metric),
                        budget=point,
                        batch_size=batch,
                    )
                )
        rows.append(row)
    ctx.arch_numbers(arch)["binary_vs_continuous"] = {"batch_size": batch, "rows": rows}
    relative = ctx.table(ctx.files.table(arch, "binary-vs-continuous"), rows)
    header = ["budget", "binary AUROC", "binary acc.", "continuous AUROC", "continuous acc."]
    body = [
        [fmt(r["budget"], 3), *(fmt(r[f"{n}_{m}"]) for n in ("binary", "continuous") for m in METRICS)]
        for r in rows
    ]
    ctx.lines += [f"**{arch}** vs **{arch}{BINARY_SUFFIX}**, DV top-k at B = {batch} (`{relative}`)", ""]
    ctx.lines += markdown_table(header, body)
    if off_grid:
        ctx.lines += [f"— : budget not on the sweep's grid: {', '.join(off_grid)}.", ""]
    panels = {}
    for metric in METRICS:
        cont, bina = _dv_topk(continuous, metric), _dv_topk(binary, metric)
        panels[metric] = {b: _difference(cont[b], bina[b]) for b in sorted(cont.keys() & bina.keys())}
    path, fig_relative = ctx.figure_path(arch, "dv-binary-vs-continuous")
    ctx.draw(fig.dv_delta_figure, panels, title=f"{arch}: continuous - binary DV (DV top-k)", path=path)
    ctx.image(
        fig_relative,
        f"{arch}: DV top-k AUROC and accuracy, continuous minus binary DV target, per batch size, at "
        "the budgets both sweeps' grids hold.",
    )


def binary_section(ctx: ReportContext) -> None:
    """Binary vs continuous DV where the run trained both (`--dv-target both`); for a probe
    configuration without the binary twin, its continuous DV top-k per batch size under a heading
    of its own."""
    twins = {arch: ctx.sweeps.get(f"{arch}{BINARY_SUFFIX}") for arch in ctx.sweeps}
    paired = {arch: binary for arch, binary in twins.items() if binary is not None}
    alone = [arch for arch, binary in twins.items() if binary is None and not arch.endswith(BINARY_SUFFIX)]
    if paired:
        ctx.lines += ["## Binary vs continuous delegation value", ""]
        for arch, binary in paired.items():
            _binary_pair(ctx, arch, binary, ctx.sweeps[arch])
    if not alone:
        return
    ctx.lines += ["## DV top-k by batch size", ""]
    for arch in alone:
        ctx.note(
            f"{arch}: no binary-DV probe (arch '{arch}{BINARY_SUFFIX}' in "
            f"{RunLayout(ctx.run_dir).scores.name}, its DV probe "
            "trained on v_bin), so no binary vs continuous comparison; `ctd eval --dv-target both` trains "
            "one. Continuous DV top-k curves only."
        )
        panels = {metric: _dv_topk(ctx.sweeps[arch], metric) for metric in METRICS}
        path, relative = ctx.figure_path(arch, "dv-topk")
        ctx.draw(
            fig.dv_topk_figure, panels, title=f"{arch}: DV top-k by batch size, continuous DV", path=path
        )
        ctx.image(
            relative,
            f"{arch}: DV top-k (continuous DV target) AUROC and accuracy vs target budget, one line per "
            "batch size (mean +-1 std over seeds).",
        )


def merge_section(ctx: ReportContext) -> None:
    ctx.lines += ["## Score-merging controls", ""]
    for arch in ctx.sweeps:
        for rule in MERGE_CONTROLS:
            folder = RunLayout(ctx.run_dir).sweep(arch, rule).root
            if not folder.is_dir():
                where = folder.relative_to(ctx.run_dir)
                ctx.note(f"{arch}: no {where}/ (`ctd eval --merge-controls` sweeps it).")
                continue
            ctx.progress(f"{arch}: merge control {rule}")
            try:
                sweep = read_sweep(folder)
            except InputError as exc:
                ctx.note(f"{arch}: {exc}")
                continue
            _cascade_figures(ctx, arch, sweep, merge=rule, name=f"merge-{rule}", what=f"every policy {rule}s")
