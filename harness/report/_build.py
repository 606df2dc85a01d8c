"""`ctd report`: tables and figures for a finished run folder, file -> file.

Reads (run folder layout):

    scores.parquet                          the SPEC section 2 scores table        (required)
    calibrate/<arch>/                       calibrate_scores output per arch        (required)
        sweep.csv, baselines.csv, summary.json (SweepConfig, DV quality), groups.csv (optional)
    calibrate/<arch>/merge-{overwrite,average}/   the score-merging controls        (optional)
    validate/<arch>/{budget-pareto,budget-ltt,performance}.json                     (optional)
        one record per level (harness.stages._validate), the per-trial table <name>.parquet beside it
    config.toml                             the resolved run config                 (optional)

The report reads the numbers the stages wrote and re-runs none of them (no sweep, no
validation); from the scores table it only ranks rows for the mean-v-at-top-k curves. Fixed
budgets (the summary's 0.1/0.2/0.3, the group table's, the binary comparison's) are read at
exact points of a sweep's grid; a grid that lacks one shows — and says so.

Writes report/: report.md, numbers.json, figures/<arch>/*.png, tables/**/*.csv. The report is
built in a hidden staging folder and renamed into place, so an interrupted build never
leaves a report/ that looks complete, and a rebuild leaves no stale files behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._errors import InputError
from ..data._scores import read_scores
from ..data._tables import atomic_path, read_table, write_json
from ..run._layout import RunLayout
from ._checks import checks_section
from ._context import ReportContext, fmt, markdown_table, pct, slug
from ._data import Sweep, read_config_text, read_sweep, value_at
from ._examples import case_study_section, examples_table
from ._sections import (
    binary_section,
    cascade_section,
    dv_quality_section,
    group_section,
    mean_value_section,
    merge_section,
    realised_section,
)
from ._validation import validation_section

__all__ = ["build_report"]

SUMMARY_BUDGETS: tuple[float, ...] = (0.1, 0.2, 0.3)
# The report's sections, in order; the summary table is built after them and placed first.
SECTIONS: tuple[Callable[[ReportContext], None], ...] = (
    cascade_section,
    realised_section,
    validation_section,
    group_section,
    dv_quality_section,
    mean_value_section,
    case_study_section,
    examples_table,
    binary_section,
    merge_section,
)
_BASELINES = ("probe_auroc", "probe_accuracy", "expert_auroc", "expert_accuracy")


def build_report(run_dir: Path, *, progress: Callable[[str], None] | None = None) -> Path:
    """Write run_dir/report/ for a finished run and return the path of report/report.md.

    A missing scores.parquet or calibrate/<arch>/ sweep is an InputError naming the file; a
    missing optional input (validation, merge controls, binary DV, config) is said in its
    section and listed under "missing" in numbers.json.
    """
    run_dir = Path(run_dir)
    ctx = _load(run_dir, progress or (lambda _message: None))
    try:
        _header(ctx)
        _left_out(ctx)
        checks_section(ctx)
        summary_at = len(ctx.lines)
        for section in SECTIONS:
            section(ctx)
        # The summary reads what the sections found (validation rates), so it is built last.
        ctx.lines[summary_at:summary_at] = _summary(ctx)
        for arch, rows in ctx.curve_rows.items():
            ctx.table(f"tables/{slug(arch)}/curves.csv", rows)
        numbers = ctx.numbers | {"missing": ctx.missing, "warnings": ctx.warnings}
        write_json(ctx.out / RunLayout(run_dir).report_numbers.name, numbers)
        with atomic_path(ctx.out / "report.md") as tmp:
            tmp.write_text("\n".join(ctx.lines).rstrip() + "\n", encoding="utf-8")
        ctx.progress("publishing report/")
        _publish(ctx.out, RunLayout(run_dir).report)
    except BaseException:
        shutil.rmtree(ctx.out, ignore_errors=True)
        raise
    return RunLayout(run_dir).report_md


def _load(run_dir: Path, progress: Callable[[str], None]) -> ReportContext:
    """Read the required inputs (every error here is an InputError naming the file) and open
    the staging folder."""
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such run folder")
    scores_path = RunLayout(run_dir).scores
    if not scores_path.is_file():
        raise InputError(f"{scores_path}: no such file (the report needs the run's scores table)")
    progress(f"reading {scores_path}")
    table = read_scores(scores_path)
    by_arch = {arch: table.test_scores(arch) for arch in table.archs}
    sweeps = {arch: read_sweep(RunLayout(run_dir).sweep(arch)) for arch in table.archs}
    staging = Path(tempfile.mkdtemp(prefix=".report.", dir=run_dir))
    return ReportContext(run_dir, staging, table, by_arch, sweeps, progress)


def _publish(staging: Path, final: Path) -> None:
    """Rename the finished staging folder to report/, replacing any previous report."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(staging, 0o777 & ~mask)  # mkdtemp makes it owner-only; give it a plain mkdir's mode
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=".report.old.", dir=final.parent))
        os.replace(final, old)  # onto an empty folder: allowed by rename(2)
    os.replace(staging, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _header(ctx: ReportContext) -> None:
    text = read_config_text(RunLayout(ctx.run_dir).config)
    seeds = sorted({s for by_seed in ctx.by_arch.values() for s in by_seed})
    ctx.numbers |= {"run": ctx.run_dir.name, "seeds": seeds, "archs": {arch: {} for arch in ctx.by_arch}}
    ctx.lines += [
        f"# CTD report: {ctx.run_dir.name}",
        "",
        f"Probe configurations: {', '.join(ctx.by_arch)}; probe seeds: {', '.join(map(str, seeds))}. "
        "Curves and bands show the mean and one (population) standard deviation over seeds. "
        "Every number in the tables is also in `numbers.json`.",
        "",
    ]
    if text is None:
        ctx.lines += ["No config.toml in the run folder.", ""]
    else:
        ctx.lines += ["<details><summary>config.toml</summary>", "", "```toml", text.rstrip(), "```", ""]
        ctx.lines += ["</details>", ""]


def _left_out(ctx: ReportContext) -> None:
    """How many examples the expert failed on, per split and group: they are not in the scores
    table, so calibration and every number below went without them."""
    path = RunLayout(ctx.run_dir).failed
    if not path.is_file():
        return
    table = read_table(path).columns
    n = len(table.get("id", []))
    ctx.numbers["left_out"] = n
    if n == 0:
        ctx.lines += ["The expert answered every dev and test example; none was left out.", ""]
        return
    counts: dict[tuple[str, str], int] = {}
    for split, group in zip(table["split"].astype(str), table["group"].astype(str), strict=True):
        counts[split, group] = counts.get((split, group), 0) + 1
    ctx.numbers["left_out_by_split_group"] = {f"{s}/{g}": c for (s, g), c in sorted(counts.items())}
    rows = [[s, g, str(c)] for (s, g), c in sorted(counts.items())]
    ctx.lines += [
        f"**Left out**: the expert failed on {n} examples, which are not in the scores table "
        "(their ids and reasons: `query/failed.csv`; `ctd eval --retry-failed` asks again).",
        "",
        *markdown_table(["split", "group", "left out"], rows),
    ]


def _summary_numbers(ctx: ReportContext, arch: str, sweep: Sweep) -> dict[str, Any]:
    batch = max(sweep.batch_sizes)
    out: dict[str, Any] = {"batch_size": batch} | {name: sweep.baseline(name)[0] for name in _BASELINES}
    for target in SUMMARY_BUDGETS:
        budget = sweep.grid_point(target)  # None: not on the grid, shown as —
        out[f"ctd@{target:g}"] = {"budget": budget} | {
            metric: float("nan")
            if budget is None
            else value_at(
                sweep,
                metric,
                policy="ctd",
                objective=sweep.objective_for(metric),
                budget=budget,
                batch_size=batch,
            )
            for metric in ("auroc", "accuracy")
        }
    found = ctx.arch_numbers(arch).get("validation", {})
    rates: dict[str, float] = {}
    for column, (job, selector, key) in _VALIDATION_COLUMNS.items():
        rates[column] = _headline(found, job, selector).get(key, float("nan"))
    return out | {"validation": rates}


def _headline(found: dict[str, Any], job: str, selector: str | None = None) -> dict[str, float]:
    """The population numbers of one validation job (or its empirical selector) at its headline
    level; empty when the job was not validated."""
    headline = (found.get(job) or {}).get("headline") or {}
    measured = headline.get(selector, {}) if selector else headline
    return measured.get("population", {})


# Summary columns at the headline levels: (job, selector, key of its population numbers). Each
# violation rate stands beside what the selector did: the delegation it spent under budget
# control (it always returns a policy, at worst "never delegate"), and how often it returned a
# policy at all under performance control.
_VALIDATION_COLUMNS: dict[str, tuple[str, str | None, str]] = {
    "viol. budget Pareto": ("budget-pareto", None, "violation_rate"),
    "spent budget Pareto": ("budget-pareto", None, "mean_realised_budget"),
    "viol. budget-only LTT": ("budget-ltt", None, "violation_rate"),
    "spent budget-only LTT": ("budget-ltt", None, "mean_realised_budget"),
    "viol. perf. CTD": ("performance", None, "violation_rate"),
    "sel. perf. CTD": ("performance", None, "selection_rate"),
    "viol. perf. empirical": ("performance", "empirical", "violation_rate"),
    "sel. perf. empirical": ("performance", "empirical", "selection_rate"),
}


def _summary(ctx: ReportContext) -> list[str]:
    """Per arch: baselines, CTD at budgets 0.1/0.2/0.3 and the validation violation rates."""
    header = ["arch", "probe AUROC", "probe acc.", "expert AUROC", "expert acc."]
    header += [f"CTD AUROC @{b:g}" for b in SUMMARY_BUDGETS] + [f"CTD acc. @{b:g}" for b in SUMMARY_BUDGETS]
    header += list(_VALIDATION_COLUMNS)
    rows, csv_rows, notes = [], [], []
    for arch, sweep in ctx.sweeps.items():
        numbers = _summary_numbers(ctx, arch, sweep)
        ctx.arch_numbers(arch)["summary"] = numbers
        ctd = [numbers[f"ctd@{b:g}"] for b in SUMMARY_BUDGETS]
        values = [numbers[k] for k in _BASELINES] + [c["auroc"] for c in ctd] + [c["accuracy"] for c in ctd]
        violations = [numbers["validation"][k] for k in _VALIDATION_COLUMNS]
        rows.append([arch, *map(fmt, values), *map(pct, violations)])
        csv_rows.append(dict(zip(header, [arch, *values, *violations], strict=True)))
        off_grid = [f"{b:g}" for b, c in zip(SUMMARY_BUDGETS, ctd, strict=True) if c["budget"] is None]
        notes.append(
            f"{arch}: B = {numbers['batch_size']}"
            + (f", budget grid lacks {'/'.join(off_grid)} (—)" if off_grid else "")
        )
    relative = ctx.table("tables/summary.csv", csv_rows)
    cannot_show = [f"- **{arch}**: {line}" for arch in ctx.sweeps for line in _cannot_show(ctx, arch)]
    return [
        "## Summary",
        "",
        *markdown_table(header, rows),
        "CTD AUROC rows are selected for AUROC, CTD accuracy rows for accuracy (means over seeds); "
        "probe and expert numbers are the means over seeds on each seed's evaluation half. CTD is read "
        f"at exactly these budgets of the sweep's grid: {'; '.join(notes)}. Violation (viol.) "
        "and selection (sel.) rates are on the population (the test split minus D_est), at the headline "
        f"levels of the validation section (— when absent); beside each violation rate, what the "
        "selector did: the mean delegation rate it spent (budget control) or the share of trials in which "
        f"it returned a policy (performance control). CSV: `{relative}`.",
        "",
        *(["**What these rates cannot show**", "", *cannot_show, ""] if cannot_show else []),
    ]


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
