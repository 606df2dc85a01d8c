"""The report's summary, built after the sections (it reads the validation rates they found) and
placed first in report.md. Per probe configuration, two tables with a row per metric:

    budget        columns: target budgets. The probe and the expert alone, CTD and the two
                  uncertainty baselines (Unc. top-k, Unc. calibrated), CTD's paired per-seed gains
                  over the probe and over Unc. top-k, and budget control's violations and spend.
    performance   columns: CTD's tested selector and the empirical one, at the headline error
                  level (the one given, or the smallest certifiable: `harness.stages._validate`).

The budgets are those the run asked for (evenly spaced picks of a long grid), or SUMMARY_BUDGETS
when the run swept the default grid. Tidy rows go to tables/summary.csv (`_summary_table`).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

import calibrate

from ..run import MIN_SELECTION
from ._context import ReportContext, fmt, markdown_table
from ._data import GAIN_BASELINES, Sweep, paired_gain, value_at
from ._summary_table import SummaryKind, SummaryPart, SummaryRow, summary_tables

__all__ = ["SUMMARY_BUDGETS", "summary_budgets", "summary_lines"]

SUMMARY_BUDGETS: tuple[float, ...] = (0.1, 0.2, 0.3)
"""The budgets the summary shows for a run that swept the default grid."""
MAX_BUDGETS = 6
"""A grid of the run's own with more budgets than this: this many, evenly spaced, are shown."""

_LABELS = {"ctd": "CTD", "unc-topk": "Unc. top-k", "unc-calibrated": "Unc. calibrated", "probe": "probe"}
_METRIC_NAMES = {"auroc": "AUROC", "accuracy": "accuracy"}
# Budget control's rows: (job, key of its population numbers, row name).
_BUDGET_ROWS: tuple[tuple[str, str, str], ...] = (
    ("budget-pareto", "violation_rate", "Pareto LTT (CTD): violations"),
    ("budget-pareto", "mean_realised_budget", "Pareto LTT (CTD): delegation spent"),
    ("budget-ltt", "violation_rate", "budget-only LTT: violations"),
    ("budget-ltt", "mean_realised_budget", "budget-only LTT: delegation spent"),
)
# Performance control's rows: (key of the population numbers, row name, kind).
_PERFORMANCE_ROWS: tuple[tuple[str, str, SummaryKind], ...] = (
    ("violation_rate", "violations", "rate"),
    ("selection_rate", "returned a policy", "rate"),
    ("mean_realised_budget", "mean delegation (policies returned)", "rate"),
    ("mean_accuracy", "mean accuracy (policies returned)", "score"),
)
_RULES = {
    "given": "the level given (--performance-alpha)",
    "smallest-certifiable": (
        f"the smallest certifiable level (the first at which CTD returned a policy in >= {MIN_SELECTION:.0%} "
        "of the trials)"
    ),
    "most-selected": (
        f"the level where CTD returned a policy most often (in < {MIN_SELECTION:.0%} of the trials at "
        "every level)"
    ),
}


def summary_budgets(sweep: Sweep) -> tuple[list[float], str]:
    """The budgets of the summary's columns (points of the sweep's grid) and how they were chosen."""
    grid = sweep.budgets
    default = np.asarray(calibrate.DEFAULT_BUDGETS)
    if grid.size == default.size and np.allclose(grid, default, rtol=0, atol=1e-9):
        points = [sweep.grid_point(b) for b in SUMMARY_BUDGETS]
        return [b for b in points if b is not None], "headline budgets of the default grid"
    if grid.size <= MAX_BUDGETS:
        return [float(b) for b in grid], "the budgets asked for"
    picks = np.unique(np.round(np.linspace(0, grid.size - 1, MAX_BUDGETS)).astype(int))
    return [
        float(grid[i]) for i in picks
    ], f"{picks.size} of the {grid.size} budgets asked for, evenly spaced"


def _level(found: dict[str, Any], job: str, alpha: float) -> dict[str, float]:
    """The population numbers of a validation job at one level; empty when not validated there."""
    levels = (found.get(job) or {}).get("levels") or []
    match = [level for level in levels if np.isclose(level["alpha"], alpha, rtol=0, atol=1e-9)]
    return match[0]["population"] if match else {}


class _Rows:
    """Collects one part's tidy rows."""

    def __init__(self, arch: str, part: SummaryPart, title: str) -> None:
        self.arch, self.part, self.title = arch, part, title
        self.rows: list[SummaryRow] = []

    def add(
        self,
        metric: str,
        column: str,
        at: float,
        value: float,
        kind: SummaryKind,
        gain: np.ndarray | None = None,
    ) -> None:
        low, high = (
            (float(gain.min()), float(gain.max())) if gain is not None and gain.size else (np.nan, np.nan)
        )
        self.rows.append(
            SummaryRow(
                self.arch, self.part, metric, column, float(at), float(value), low, high, kind, self.title
            )
        )


def _budget_part(ctx: ReportContext, arch: str, sweep: Sweep) -> tuple[_Rows, dict[str, Any]]:
    batch = max(sweep.batch_sizes)
    budgets, chosen = summary_budgets(sweep)
    seeds = len(np.unique(sweep.baselines["seed"]))
    validated = arch in ctx.configurations
    title = (
        f"{arch} at target budgets ({chosen}), B = {batch}, means over {seeds} seed{'s' * (seeds != 1)} "
        "on each one's evaluation half; gains: mean [min, max] over seeds"
        + ("" if validated else "; a binary-DV twin, not validated (see Binary vs continuous)")
    )
    part = _Rows(arch, "budget", title)
    found = ctx.arch_numbers(arch).get("validation", {})
    numbers: dict[str, Any] = {
        "batch_size": batch,
        "budgets": budgets,
        "budgets_chosen": chosen,
        "seeds": seeds,
    }
    numbers |= {
        f"{who}_{m}": sweep.baseline(f"{who}_{m}")[0] for who in ("probe", "expert") for m in _METRIC_NAMES
    }
    at: dict[str, dict[str, Any]] = {f"{b:g}": {} for b in budgets}
    for metric, name in _METRIC_NAMES.items():
        for who in ("probe", "expert"):
            for b in budgets:
                part.add(f"{who} alone {name}", f"{b:g}", b, numbers[f"{who}_{metric}"], "score")
        for policy in ("ctd", "unc-topk", "unc-calibrated"):
            for b in budgets:
                value = value_at(
                    sweep,
                    metric,
                    policy=policy,
                    objective=sweep.objective_for(metric),
                    budget=b,
                    batch_size=batch,
                )
                at[f"{b:g}"][f"{policy}_{metric}"] = value
                part.add(f"{_LABELS[policy]} {name}", f"{b:g}", b, value, "score")
        for versus in GAIN_BASELINES:
            for b in budgets:
                gain = paired_gain(sweep, metric, versus=versus, budget=b, batch_size=batch)
                mean = float(gain.mean()) if gain.size else float("nan")
                at[f"{b:g}"][f"gain_{versus}_{metric}"] = {"mean": mean, "per_seed": gain.tolist()}
                part.add(f"CTD - {_LABELS[versus]} {name}", f"{b:g}", b, mean, "gain", gain)
        # The paper compares at every batch size: top-k's quota is per batch, CTD's is not.
        for other in sorted(size for size in sweep.batch_sizes if size != batch):
            for b in budgets:
                gain = paired_gain(sweep, metric, versus="unc-topk", budget=b, batch_size=other)
                mean = float(gain.mean()) if gain.size else float("nan")
                at[f"{b:g}"][f"gain_unc-topk_{metric}_b{other}"] = {"mean": mean, "per_seed": gain.tolist()}
                part.add(f"CTD - {_LABELS['unc-topk']} {name}, B = {other}", f"{b:g}", b, mean, "gain", gain)
    for job, key, label in _BUDGET_ROWS if validated else ():  # a twin's would be rows of dashes
        for b in budgets:
            value = float(_level(found, job, b).get(key, np.nan))
            at[f"{b:g}"][f"{job}_{key}"] = value
            part.add(label, f"{b:g}", b, value, "rate")
    return part, numbers | {"at": at}


def _performance_part(ctx: ReportContext, arch: str) -> tuple[_Rows | None, dict[str, Any]]:
    found = (ctx.arch_numbers(arch).get("validation") or {}).get("performance") or {}
    headline = found.get("headline")
    if not headline:
        return None, {}
    alpha, rule, delta = found["headline_alpha"], found.get("headline_rule", "given"), found["delta"]
    title = (
        f"{arch}: performance control at alpha = {alpha:g} (accuracy >= {1 - alpha:.2f}, delta = "
        f"{delta:.0%}), {_RULES[rule]}"
    )
    part = _Rows(arch, "performance", title)
    numbers: dict[str, Any] = {"alpha": alpha, "rule": rule, "delta": delta}
    for selector, column, measured in (
        ("ctd", "CTD (LTT)", headline["population"]),
        ("empirical", "empirical selector", (headline.get("empirical") or {}).get("population", {})),
    ):
        numbers[selector] = {key: float(measured.get(key, np.nan)) for key, _, _ in _PERFORMANCE_ROWS}
        for key, label, kind in _PERFORMANCE_ROWS:
            part.add(label, column, alpha, numbers[selector][key], kind)
    return part, numbers


def summary_lines(ctx: ReportContext) -> list[str]:
    """The summary section's Markdown; its numbers go to numbers.json and its rows to
    tables/summary.csv."""
    rows: list[SummaryRow] = []
    for arch, sweep in ctx.sweeps.items():
        budget, numbers = _budget_part(ctx, arch, sweep)
        performance, performance_numbers = _performance_part(ctx, arch)
        ctx.arch_numbers(arch)["summary"] = numbers | {"performance": performance_numbers}
        rows += budget.rows + (performance.rows if performance else [])
    relative = ctx.table(ctx.files.summary_table, [asdict(row) for row in rows])
    lines = ["## Summary", ""]
    for table in summary_tables(rows):
        lines += [f"**{table.title}**", ""]
        lines += markdown_table(["metric", *table.columns], [[m, *cells] for m, cells in table.rows])
    lines += [
        "Rows are metrics. CTD and Unc. calibrated are selected for the metric of their row (the "
        "Pareto objective), and every number is a mean over seeds on each seed's evaluation half: the "
        "probe's AUROC here is on those halves, not the whole test split the probe stage reports. The "
        "probe and the expert alone do not depend on the budget; they are repeated for reading down a "
        "column. **Gains** pair each seed's CTD with the same seed's probe or Unc. top-k and show the "
        "mean of the per-seed differences with the smallest and largest in brackets: with few seeds a "
        "range, not a confidence interval; Unc. top-k at the title's B, and at each smaller B in the rows "
        "that name it (CTD decides each input alone: only top-k depends on B). **Budget control** rows "
        "are the validation at that budget on "
        "the population (the test split minus D_est): the share of trials whose delegation exceeded it, "
        "and the mean delegation spent. **Performance control** (its level in the title): the share of "
        "trials whose returned policy missed the accuracy target (a guarantee keeps it at or below "
        "delta), how often each selector returned a policy, and what the returned policies delegated "
        "and scored. "
        f"CSV: `{relative}`.",
        "",
    ]
    cannot_show = [f"- **{arch}**: {line}" for arch in ctx.sweeps for line in _cannot_show(ctx, arch)]
    if cannot_show:
        lines += ["**What these rates cannot show**", "", *cannot_show, ""]
    sizes = [f"- **{arch}**: {line}" for arch in ctx.configurations for line in batch_notes(ctx.sweeps[arch])]
    if sizes:
        lines += ["**What the batches and seeds hold**", "", *sizes, ""]
    if ctx.warnings:
        lines += [
            f"> {len(ctx.warnings)} warnings about degenerate scores: see *Degenerate scores* below.",
            "",
        ]
    return lines


def batch_notes(sweep: Sweep) -> list[str]:
    """Where the numbers labelled "B = b" or "over N seeds" are not what the label says: a batch
    size above a seed's evaluation rows (top-k then ran on one shorter batch), a
    budget whose top-k quota rounds to no call at all (k = round(budget * b) per batch), and seeds
    whose evaluation half holds one class (AUROC undefined there; its means skip them)."""
    out = []
    n_eval = sweep.baselines["n_eval"].astype(int)
    smallest = int(n_eval.min())
    for batch in sweep.batch_sizes:
        if batch > smallest:
            out.append(
                f"B = {batch} is more than the {smallest} evaluation rows of a seed: its top-k policies "
                f"ran on one batch of {smallest} there, not on batches of {batch}."
            )
        topk = (sweep.table["policy"] == "unc-topk") & (sweep.table["batch_size"] == batch)
        spent = sweep.table["realised"][topk]
        idle = np.unique(sweep.table["budget"][topk][spent == 0])
        if idle.size:
            out.append(
                f"At B = {batch} the top-k quota (budget x B, rounded) is 0 for budget {idle.max():g} "
                "and below: top-k delegates nothing there."
            )
    undefined = sweep.baselines["seed"][np.isnan(sweep.baselines["probe_auroc"])]
    if undefined.size:
        seeds = len(sweep.baselines["seed"])
        out.append(
            f"Seed{'s' * (undefined.size > 1)} {', '.join(map(str, undefined))}: the evaluation half "
            f"holds one class, so AUROC is undefined there; the AUROC means are over the other "
            f"{seeds - undefined.size} of {seeds} seeds (accuracy is over all)."
        )
    return out


def _headline(found: dict[str, Any], job: str, selector: str | None = None) -> dict[str, float]:
    """The population numbers of one validation job (or its empirical selector) at its headline
    level; empty when the job was not validated."""
    headline = (found.get(job) or {}).get("headline") or {}
    measured = headline.get(selector, {}) if selector else headline
    return measured.get("population", {})


def _cannot_show(ctx: ReportContext, arch: str) -> list[str]:
    """Say in words where a violation rate is vacuous: no policy to violate, or nothing delegated."""
    numbers = ctx.arch_numbers(arch)
    found = numbers.get("validation", {})
    summary = numbers.get("summary", {})
    probe, expert = summary.get("probe_accuracy", float("nan")), summary.get("expert_accuracy", float("nan"))
    out = []
    for job, label in (("budget-pareto", "Budget control (Pareto)"), ("budget-ltt", "Budget-only LTT")):
        spent = _headline(found, job).get("mean_realised_budget")
        if spent == 0:
            alpha = found[job]["headline_alpha"]
            out.append(
                f"{label} never delegated in any trial at budget {alpha:g}: its 0% violation rate is met by "
                "spending nothing and says nothing about how close to the budget a selector can go."
            )
    performance = found.get("performance") or {}
    ltt, empirical = _headline(found, "performance"), _headline(found, "performance", "empirical")
    if ltt and empirical:
        alpha = performance["headline_alpha"]
        target = f"accuracy {1 - alpha:.2f} (alpha = {alpha:g})"
        if ltt.get("selection_rate") == 0:
            out.append(
                f"Performance control: CTD returned no policy in any trial for {target}, so its violation "
                f"rate of 0% shows nothing. The probe's accuracy ({fmt(probe)}, expert {fmt(expert)}) is "
                "below the target, and no cascade could be certified to reach it with this calibration data."
            )
        never = (
            ltt.get("selection_rate") == 1
            and empirical.get("selection_rate") == 1
            and ltt.get("mean_realised_budget") == 0
            and empirical.get("mean_realised_budget") == 0
        )
        # The probe alone already meets the target and neither selector ever missed it: the
        # contrast is as vacuous as when both return "never delegate".
        easy = ltt.get("violation_rate") == 0 and empirical.get("violation_rate") == 0 and probe >= 1 - alpha
        if never:
            out.append(
                f'Performance control: both selectors return "never delegate" in every trial for {target} '
                f"(the probe alone, accuracy {fmt(probe)}, meets it), so neither can violate and the "
                "contrast between CTD's tested selector and the untested empirical one cannot show here."
            )
        elif easy:
            out.append(
                f"Performance control: neither selector violated {target} in any trial, because the probe "
                f"alone (accuracy {fmt(probe)}) already meets it: the contrast between CTD's tested "
                "selector and the untested empirical one cannot show at this level; it shows at an error "
                "level below the probe's own error (see the validation figure's every-level panel)."
            )
    numbers["cannot_show"] = out
    return out
