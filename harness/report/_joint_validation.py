"""The "Joint control" subsection of the guarantee validation, read from validate/<arch>/joint.*
(written by `harness.stages._validate_joint.run_joint_job`): per joint level (the run's budget and
an error level, certified together) the violation and selection rates of LTT and of the empirical
selector, and the budget-accuracy plane of the headline level with every trial's policy in it.
Runs from before the joint job have no such files: the subsection is left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .._errors import InputError
from ..run import MIN_SELECTION, JointJobRecord, read_joint_job
from ._context import ReportContext, markdown_table, pct
from ._joint_figures import JointPoints, joint_plane_figure
from ._validation import measured, with_ci

__all__ = ["joint_subsection"]

# How the headline joint level was chosen (harness.stages._validate_joint.run_joint_job).
_CHOSEN = {
    "given": "the error level given",
    "smallest-certifiable": (
        f"the smallest error level at which LTT returned a policy in >= {MIN_SELECTION:.0%} of trials"
    ),
    "most-selected": "the error level at which LTT returned a policy most often",
}
_SELECTORS = (("LTT", None, ""), ("empirical", "empirical", "empirical_"))  # label, record key, column prefix


def _name(levels: dict[str, float]) -> str:
    return ", ".join(f"{risk} <= {alpha:g}" for risk, alpha in levels.items())


def _selector(level: dict[str, Any], key: str | None) -> dict[str, Any] | None:
    return level if key is None else level.get(key)


def joint_subsection(ctx: ReportContext, arch: str, folder: Path) -> None:
    """The subsection for one probe configuration, when its run validated joint control."""
    try:
        record = read_joint_job(folder)
    except InputError as exc:
        ctx.note(f"{arch}: {exc}")
        return
    if record is None:
        return
    numbers = ctx.arch_numbers(arch).setdefault("validation", {})
    numbers["joint"] = _numbers(record)
    rows, csv_rows = [], []
    for level in record.levels:
        risks = level["levels"]
        row = [f"{risks.get('budget', float('nan')):g}", f"{risks.get('error', float('nan')):g}"]
        for label, key, _ in _SELECTORS:
            selector = _selector(level, key)
            if selector is None:
                row += ["—", "—", "—"]
                continue
            population, paper = measured(selector, "population"), measured(selector, "paper")
            row += [with_ci(population), pct(paper["violation_rate"]), pct(population["selection_rate"])]
            for measurement, m in (("population", population), ("paper", paper)):
                csv_rows.append(
                    {
                        "procedure": label,
                        **{f"{r}_level": a for r, a in risks.items()},
                        "measurement": measurement,
                    }
                    | m
                )
        rows.append(row)
    relative = ctx.table(ctx.files.table(arch, "validation-joint"), csv_rows)
    delta = record.levels[0]["delta"]
    ctx.lines += [
        f"#### Joint control (`{relative}`)",
        "",
        "The run's budget and each error level certified together at one threshold (the max of the "
        f"two exact p-values, Pareto testing, delta = {delta:g}): a trial violates when its policy's "
        "delegations OR errors exceed the level on the rows measured. Violation rate of LTT and of "
        "the untested empirical selector (95% Clopper-Pearson interval on the population), and how "
        "often each returned a policy.",
        "",
        *markdown_table(
            [
                "budget",
                "error",
                "LTT: population",
                "paper",
                "selection",
                "empirical: population",
                "paper",
                "selection",
            ],
            rows,
        ),
    ]
    for skipped in record.not_validated:
        ctx.lines += [
            f"- joint control not validated at budget {skipped['budget']:g}, error {skipped['error']:g}: "
            f"{skipped['why']}.",
        ]
    if record.not_validated:
        ctx.lines += [""]
    _plane(ctx, arch, record)


def _numbers(record: JointJobRecord) -> dict[str, Any]:
    def level_numbers(level: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"levels": dict(level["levels"])}
        for label, key, _ in _SELECTORS:
            selector = _selector(level, key)
            if selector is not None:
                out[label] = {m: measured(selector, m) for m in ("population", "paper")}
        return out

    headline = record.headline_record
    return {
        "headline": record.headline,
        "headline_rule": record.headline_rule,
        "delta": record.levels[0]["delta"],
        "headline_level": None if headline is None else level_numbers(headline),
        "levels": [level_numbers(level) for level in record.levels],
        "max_population_violation": max(
            measured(level, "population")["violation_rate"] for level in record.levels
        ),
    }


def _plane(ctx: ReportContext, arch: str, record: JointJobRecord) -> None:
    headline, levels = record.headline_record, record.headline
    trials = record.trials_at(levels)
    if headline is None or trials is None or not {"budget", "error"} <= levels.keys():
        return
    panels = {}
    for label, key, prefix in _SELECTORS:
        selector = _selector(headline, key)
        needed = (f"{prefix}selected", f"{prefix}population_realised", f"{prefix}population_accuracy")
        if selector is None or not all(c in trials for c in needed):
            continue
        chosen = trials[f"{prefix}selected"].astype(bool)
        population = measured(selector, "population")
        violated = trials.get(f"{prefix}population_violated", np.zeros(chosen.size, bool)).astype(bool)
        panels[
            f"{label}: {int(chosen.sum())} policies in {chosen.size} trials, population violations "
            f"{pct(population['violation_rate'])}"
        ] = JointPoints(
            budget=trials[f"{prefix}population_realised"][chosen].astype(np.float64),
            error=1.0 - trials[f"{prefix}population_accuracy"][chosen].astype(np.float64),
            violated=violated[chosen],
        )
    if not panels:
        return
    path, relative = ctx.figure_path(arch, "validation-joint")
    chosen_by = _CHOSEN[record.headline_rule]
    ctx.draw(
        joint_plane_figure,
        panels,
        budget=levels["budget"],
        error=levels["error"],
        title=f"{arch}: joint control at {_name(levels)}",
        path=path,
    )
    ctx.image(
        relative,
        f"{arch}: each trial's returned policy on the population (the test split minus D_est) in the "
        f"budget-accuracy plane at the joint level {_name(levels)} ({chosen_by}): the shaded rectangle "
        "is the region the level certifies (its corner the two levels), red crosses the trials whose "
        "policy left it (a violation, decided on integer counts); LTT beside the untested empirical "
        "selector.",
    )
