"""The guarantee-validation section of the run report, read from validate/<arch>/ (written by
`harness.stages._validate.run_job`): violation and selection rates at every level, measured on the
population and by the paper's protocol, and the per-trial histograms at the headline levels; then
the joint-control subsection (`_joint_validation`) where the run validated it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._errors import InputError
from ..run import JOBS, MIN_SELECTION, JobRecord, RunLayout, read_job
from . import _validation_figures as fig
from ._context import ReportContext, markdown_table, pct

__all__ = ["measured", "validation_section", "with_ci"]

_COLOURS = {
    "budget-pareto": "#1f77b4",
    "budget-ltt": "#2ca02c",
    "performance": "#1f77b4",
    "empirical": "#ff7f0e",
}
INTRO = (
    "Each trial draws a random half of a seed's test split, calibrates on it (30% D_est, 70% "
    "D_cal), and measures the returned policy two ways. **population**: its realised risk on the "
    "test split minus D_est, the finite population D_cal was drawn from, whose risk Learn-then-Test "
    "certifies: the violation rate should stay at or below delta (brackets and bands: 95% "
    "Clopper-Pearson intervals). D_cal is a large share of that population and the binomial test "
    "is conservative for such a sample, so rates well under delta here show the guarantee holds "
    "but are a weak test of the procedure; a sharp one calibrates on small samples of a large table "
    "(`ctd validate --cal-size N --eval-scores FILE`). **paper**: on the other half only, the "
    "paper's protocol. It over-reads violations through finite evaluation noise: LTT puts the chosen "
    "policy's risk just below alpha, and a policy whose risk is exactly alpha exceeds floor(alpha m) "
    "losses on m evaluation rows about half the time. A violation is decided on integer counts; a "
    "trial that returns no policy does not violate."
)


# How the headline level was chosen, in a figure title (harness.stages._validate.headline_level).
_CHOSEN = {
    "given": "the level given",
    "smallest-certifiable": (
        f"smallest certifiable level: CTD returned a policy in >= {MIN_SELECTION:.0%} of trials"
    ),
    "most-selected": "the level where CTD returned a policy most often",
}


def measured(record: dict[str, Any], measurement: str) -> dict[str, float]:
    """Rates of one measurement of a level record (the paper protocol's keys are top level)."""
    r = record if measurement == "paper" else record[measurement]
    low, high = r.get("violation_ci95") or (np.nan, np.nan)
    return {
        "violation_rate": _number(r["violation_rate"]),
        "ci_low": _number(low),
        "ci_high": _number(high),
        "selection_rate": _number(r.get("selection_rate")),
        "mean_realised_budget": _number(r.get("mean_realised_budget")),
        "mean_accuracy": _number(r.get("mean_accuracy")),
        "trials": int(r.get("trials", -1)),
    }


def _number(value: object) -> float:
    return float("nan") if value is None else float(value)  # JSON writes NaN as null


def with_ci(m: dict[str, float]) -> str:
    return f"{pct(m['violation_rate'])} [{pct(m['ci_low'])}, {pct(m['ci_high'])}]"


def _selectors(record: JobRecord) -> dict[str, list[dict[str, Any]]]:
    """Selector label -> its level records (the tested selector, and the empirical one)."""
    out = {record.job.label: record.levels}
    if record.job.mode == "performance":
        out["empirical selector"] = [level["empirical"] for level in record.levels]
    return out


def _read_jobs(ctx: ReportContext, arch: str) -> dict[str, JobRecord]:
    folder = RunLayout(ctx.run_dir).validation(arch).root
    if not folder.is_dir():
        ctx.note(f"{arch}: no validate/{arch}/ folder; `ctd eval` writes it in its validate stage.")
        return {}
    found = {}
    for job in JOBS:
        try:
            found[job.name] = read_job(folder, job)
        except InputError as exc:
            ctx.note(f"{arch}: {exc}")
    return found


def validation_section(ctx: ReportContext) -> None:
    from ._joint_validation import joint_subsection  # it reads this module's helpers

    ctx.lines += ["## Guarantee validation", "", INTRO, ""]
    for arch in ctx.configurations:  # a binary-DV twin is not validated (its stage skips it)
        ctx.progress(f"{arch}: guarantee validation")
        found = _read_jobs(ctx, arch)
        if not found:
            continue
        numbers = ctx.arch_numbers(arch).setdefault("validation", {})
        csv_rows = []
        for name, record in found.items():
            numbers[name] = _job_numbers(record)
            for label, levels in _selectors(record).items():
                for level, alpha in zip(levels, (r["alpha"] for r in record.levels), strict=True):
                    for measurement in ("population", "paper"):
                        csv_rows.append(
                            {"procedure": label, "alpha": alpha, "measurement": measurement}
                            | measured(level, measurement)
                        )
        relative = ctx.table(ctx.files.table(arch, "validation"), csv_rows)
        delta = next(iter(found.values())).levels[0]["delta"]  # read_job: every record has levels
        ctx.lines += [f"### {arch} (`{relative}`)", ""]
        _budget_table(ctx, found)
        _performance_table(ctx, found)
        _levels_figure(ctx, arch, found, delta)
        _budget_histograms(ctx, arch, found)
        _performance_histograms(ctx, arch, found)
        for record in found.values():
            for skipped in record.not_validated:
                ctx.lines += [
                    f"- {record.job.label} not validated at alpha {skipped['alpha']:g}: {skipped['why']}."
                ]
        ctx.lines += [""]
        joint_subsection(ctx, arch, RunLayout(ctx.run_dir).validation(arch).root)


def _job_numbers(record: JobRecord) -> dict[str, Any]:
    def level_numbers(level: dict[str, Any]) -> dict[str, Any]:
        out = {m: measured(level, m) for m in ("population", "paper")}
        if "empirical" in level:
            out["empirical"] = {m: measured(level["empirical"], m) for m in ("population", "paper")}
        return {"alpha": level["alpha"]} | out

    headline = record.headline
    return {
        "headline_alpha": record.headline_alpha,
        "headline_rule": record.headline_rule,
        "delta": record.levels[0]["delta"],
        "headline": None if headline is None else level_numbers(headline),
        "levels": [level_numbers(level) for level in record.levels],
        "max_population_violation": max(
            (measured(level, "population")["violation_rate"] for level in record.levels), default=np.nan
        ),
    }


def _budget_table(ctx: ReportContext, found: dict[str, JobRecord]) -> None:
    jobs = [found[n] for n in ("budget-pareto", "budget-ltt") if n in found and found[n].levels]
    if not jobs:
        return
    alphas = sorted({level["alpha"] for record in jobs for level in record.levels})
    header = ["target budget"]
    for record in jobs:
        header += [f"{record.job.label}: population", "paper", "mean realised"]
    rows = []
    for alpha in alphas:
        row = [f"{alpha:g}"]
        for record in jobs:
            level = next((r for r in record.levels if np.isclose(r["alpha"], alpha)), None)
            if level is None:
                row += ["—", "—", "—"]
                continue
            population, paper = measured(level, "population"), measured(level, "paper")
            row += [
                with_ci(population),
                pct(paper["violation_rate"]),
                f"{population['mean_realised_budget']:.3f}",
            ]
        rows.append(row)
    ctx.lines += [
        "**Budget control**: violation rate (realised delegation above the target) at every budget; "
        "mean realised delegation on the population.",
        "",
        *markdown_table(header, rows),
    ]


def _performance_table(ctx: ReportContext, found: dict[str, JobRecord]) -> None:
    record = found.get("performance")
    if record is None or not record.levels:
        return
    header = ["alpha (min. accuracy)", "CTD: population", "paper", "selection"]
    header += ["empirical: population", "paper", "selection"]
    rows, vacuous = [], []
    for level in record.levels:
        row = [f"{level['alpha']:g} ({1 - level['alpha']:.2f})"]
        for selector in (level, level.get("empirical")):
            if selector is None:
                row += ["—", "—", "—"]
                continue
            population, paper = measured(selector, "population"), measured(selector, "paper")
            row += [with_ci(population), pct(paper["violation_rate"]), pct(population["selection_rate"])]
        rows.append(row)
        if measured(level, "population")["selection_rate"] == 0:
            vacuous.append(f"{level['alpha']:g}")
    ctx.lines += [
        "**Performance control**: violation rate (cascade error above alpha) of CTD's LTT selector "
        "and of the untested empirical selector, and how often each returned a policy.",
        "",
        *markdown_table(header, rows),
    ]
    trivial = [
        f"{level['alpha']:g}"
        for level in record.levels
        if all(
            measured(selector, "population")["mean_realised_budget"] == 0
            and measured(selector, "population")["selection_rate"] == 1
            for selector in (level, level.get("empirical") or level)
        )
    ]
    if trivial:
        ctx.lines += [
            f"At alpha {', '.join(trivial)} both selectors never delegate in any trial: the probe alone "
            "meets the target, so these rows cannot tell the selectors apart.",
            "",
        ]
    if vacuous:
        ctx.lines += [
            f"CTD returned no policy in any trial at alpha {', '.join(vacuous)}: nothing was certified, "
            "so its 0% there shows nothing about the guarantee (the cascade cannot be shown to reach "
            "that accuracy with this much calibration data).",
            "",
        ]


def _line(
    label: str, colour: str, levels: list[dict[str, Any]], alphas: list[float], key: str, measurement: str
) -> fig.RateLine:
    values = [measured(level, measurement) for level in levels]
    x = np.asarray(alphas)
    y = np.array([v[key] for v in values])
    if measurement == "population" and key == "violation_rate":
        low, high = np.array([v["ci_low"] for v in values]), np.array([v["ci_high"] for v in values])
        return fig.RateLine(f"{label}: population", colour, x, y, low, high)
    suffix = ": paper" if measurement == "paper" else ""
    return fig.RateLine(f"{label}{suffix}", colour, x, y, dashed=measurement == "paper")


def _levels_figure(ctx: ReportContext, arch: str, found: dict[str, JobRecord], delta: float) -> None:
    panels: dict[str, tuple[list[fig.RateLine], list[fig.RateLine]]] = {
        "budget control": ([], []),
        "performance control": ([], []),
    }
    for record in found.values():
        if not record.levels:
            continue
        alphas = [level["alpha"] for level in record.levels]
        panel = panels["budget control" if record.job.mode == "budget" else "performance control"]
        for label, levels in _selectors(record).items():
            colour = _COLOURS["empirical"] if label == "empirical selector" else _COLOURS[record.job.name]
            panel[0].append(_line(label, colour, levels, alphas, "violation_rate", "population"))
            panel[0].append(_line(label, colour, levels, alphas, "violation_rate", "paper"))
            key = "mean_realised_budget" if record.job.mode == "budget" else "selection_rate"
            panel[1].append(_line(label, colour, levels, alphas, key, "population"))
    path, relative = ctx.figure_path(arch, "validation-levels")
    ctx.draw(
        fig.validation_levels_figure,
        panels,
        delta=delta,
        title=f"{arch}: guarantee validation at every level",
        path=path,
    )
    ctx.image(
        relative,
        f"{arch}: violation rate against the target level (solid: population, with its 95% band; dashed: "
        f"paper protocol; red: delta = {delta:g}); below, the delegation spent under budget control and "
        "the selection rate under performance control.",
    )


def _population_size(record: JobRecord) -> int:
    """The population's size (the test split minus D_est: D_cal and the evaluation half), whose
    multiples 1/n the measured rates are; with seeds of different sizes, their least common multiple."""
    sizes = {int(n_cal) + int(n_eval) for _, n_cal, n_eval in record.levels[0]["splits_by_seed"].values()}
    return math.lcm(*sizes)


def _population(record: JobRecord, column: str, prefix: str = "") -> NDArray[np.float64]:
    """Per-trial population `column` at the headline level, over trials that returned a policy."""
    trials = record.trials_at(record.headline_alpha)
    name = f"{prefix}population_{column}"
    if trials is None or name not in trials or f"{prefix}selected" not in trials:
        return np.array([])
    return trials[name][trials[f"{prefix}selected"].astype(bool)].astype(np.float64)


def _budget_histograms(ctx: ReportContext, arch: str, found: dict[str, JobRecord]) -> None:
    budget = [r for n, r in found.items() if n.startswith("budget") and r.headline is not None]
    if not budget:
        return
    alpha = budget[0].headline_alpha
    panels = {}
    for record in budget:
        headline = record.headline or {}
        population, paper = measured(headline, "population"), measured(headline, "paper")
        rates = f"population {pct(population['violation_rate'])}, paper {pct(paper['violation_rate'])}"
        spent = f"spent {pct(population['mean_realised_budget'])}"
        panels[f"{record.job.label}: {rates}, {spent}"] = _population(record, "realised")
    path, relative = ctx.figure_path(arch, "validation-budget")
    population = _population_size(budget[0])
    ctx.draw(
        fig.budget_validation_figure,
        panels,
        alpha=alpha,
        population=population,
        title=f"{arch}: budget control at alpha = {alpha:g}",
        path=path,
    )
    ctx.image(
        relative,
        f"{arch}: realised delegation rate on the population (the test split minus D_est) over random "
        f"calibration halves under budget control (alpha = {alpha:g}), one bar per multiple of "
        f"1/{population} (or a few); the red line at alpha separates the rates that meet it from those "
        "that violate it; violation rates and the mean delegation spent in each title.",
    )


def _performance_histograms(ctx: ReportContext, arch: str, found: dict[str, JobRecord]) -> None:
    record = found.get("performance")
    if record is None or record.headline is None:
        return
    headline, alpha = record.headline, record.headline_alpha
    panels = {}
    for label, level, prefix in (
        ("CTD (LTT)", headline, ""),
        ("empirical", headline.get("empirical"), "empirical_"),
    ):
        if level is None:
            continue
        population, paper = measured(level, "population"), measured(level, "paper")
        rates = f"population {pct(population['violation_rate'])}, paper {pct(paper['violation_rate'])}"
        selection = f"selection {pct(population['selection_rate'])}"
        panels[f"{label}: {rates}, {selection}"] = _population(record, "accuracy", prefix)
    path, relative = ctx.figure_path(arch, "validation-performance")
    chosen = _CHOSEN[record.headline_rule]
    ctx.draw(
        fig.performance_validation_figure,
        panels,
        alpha=alpha,
        population=_population_size(record),
        title=f"{arch}: performance control at alpha = {alpha:g} ({chosen})",
        path=path,
    )
    ctx.image(
        relative,
        f"{arch}: accuracy on the population of the returned policies under performance control "
        f"(alpha = {alpha:g}, {chosen}), CTD's LTT selector against the empirical selector, binned on the "
        "multiples of 1/population size; the dashed line at 1 - alpha separates the accuracies that "
        "violate it (left) from those that meet it.",
    )
