"""`ctd validate`'s joint mode: the joint level its options name, and its table."""

from __future__ import annotations

import math
from pathlib import Path

from rich.table import Table

import calibrate

from .._bounds import check_levels
from .._errors import InputError
from ._common import print_json, stdout

__all__ = ["error_level", "joint_level", "print_joint"]


def error_level(accuracy: float) -> float:
    """The error level that --accuracy certifies, 1 - ACCURACY without float noise."""
    check_levels("--accuracy", (accuracy,))
    return round(1.0 - accuracy, 12)


def joint_level(
    mode: str | None, alpha: float | None, budget: float | None, accuracy: float | None, fnr: float | None
) -> calibrate.JointLevel | None:
    """The joint level asked for (None: one risk, as --mode/--alpha). --budget and --accuracy
    are the risk levels themselves, so --mode or --alpha beside them is an error."""
    given = [
        name
        for name, value in (("--budget", budget), ("--accuracy", accuracy), ("--fnr", fnr))
        if value is not None
    ]
    if given and (mode is not None or alpha is not None):
        old = "--mode" if mode is not None else "--alpha"
        raise InputError(f"{old} cannot be combined with {given[0]}: give --mode/--alpha, or the risk levels")
    if fnr is None and (budget is None or accuracy is None):
        return None
    for option, value in (("--budget", budget), ("--fnr", fnr)):
        if value is not None:
            check_levels(option, (value,))
    return calibrate.JointLevel(
        budget=budget, error=None if accuracy is None else error_level(accuracy), fnr=fnr
    )


def print_joint(
    result: calibrate.ValidationResult,
    scores_path: Path,
    eval_scores: Path | None,
    *,
    trials: int,
    json_output: bool,
) -> None:
    record = {"scores": str(scores_path), **result.to_dict()}
    if eval_scores is not None:
        record["eval_scores"] = str(eval_scores)
    if json_output:
        print_json(record)
        return
    levels = result.levels or {}
    named = ", ".join(f"{name}<={alpha:g}" for name, alpha in levels.items())
    title = (
        f"joint control, {named}, delta={result.delta:g}, {trials} trials ({result.policy}, {result.fwer})"
    )
    table = Table(title=title)
    risks = list(levels)
    columns = ("selector", "measured", "violation rate", *(f"{r} violated" for r in risks))
    for column in (*columns, "selected", "realised", "accuracy"):
        table.add_column(column, no_wrap=True)
    by_risk = result.by_risk or {}

    def rate(s: calibrate.SelectorSummary) -> str:
        return f"{s.violation_rate:.1%} [{100 * s.violation.low:.1f}, {100 * s.violation.high:.1f}]"

    for key, name, selector in (
        ("tested", "LTT", result.tested),
        ("empirical", "empirical", result.empirical),
    ):
        if selector is None:
            continue
        for measurement in calibrate.MEASUREMENTS:
            s = selector.measured(measurement)
            if s is None:
                continue
            per_risk = [by_risk[r][key].measured(measurement) for r in risks]
            table.add_row(
                name,
                measurement,
                rate(s),
                *(rate(p) if p is not None else "" for p in per_risk),
                f"{s.selection_rate:.1%}",
                *(_mean(value) for value in (s.mean_realised_budget, s.mean_accuracy)),
            )
    stdout.print(table)
    stdout.print(
        "A trial violates when its policy exceeds any level on the rows measured; violation rates with 95% "
        "Clopper-Pearson intervals, realised delegation and accuracy are means over the trials that returned "
        f"a policy (— where none did). The population (and fresh) rates should stay at or below delta = "
        f"{result.delta:g}."
    )
    tested = result.tested.measured("population") if result.tested is not None else None
    if tested is not None and tested.selections == 0:
        stdout.print(
            "LTT returned no policy in any trial: no threshold is certified at these levels on this "
            "run's calibration halves, so its 0% violation rate shows nothing; try looser levels."
        )


def _mean(value: float) -> str:
    """A mean over the trials that returned a policy: — where none did (NaN)."""
    return "—" if math.isnan(value) else f"{value:.3f}"
