"""`ctd validate` on a cascade of experts: `--budget B1,B2[,...]` (one budget per expert), with
`--accuracy` and `--abstain`, validates the K-stage cascade's joint guarantee on the table's
expert_K and dv_K columns (`calibrate.validate_cascade`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.table import Table

import calibrate

from .._bounds import check_levels
from .._errors import InputError
from ..data import read_scores, write_table
from ..run import Roots
from ..stages import check_budget_count
from ._common import parse_floats, print_json, stdout
from ._joint_validation import error_level

__all__ = ["cascade_budgets", "cascade_level", "cascade_scores_path", "validate_cascade_command"]


def cascade_budgets(text: str) -> tuple[float, ...]:
    """--budget's B1,B2,...: one budget per expert, so a plain list (no START:STOP:COUNT range)."""
    if ":" in text:
        raise InputError(
            f"--budget {text!r}: one budget per expert as B1,B2,..., not a START:STOP:COUNT range"
        )
    try:
        return parse_floats(text, "--budget")
    except InputError:
        raise InputError(f"--budget {text!r}: expected one number per expert, like 0.5,0.2") from None


def cascade_level(
    budgets: tuple[float, ...], accuracy: float | None, abstain: float | None
) -> calibrate.CascadeLevels:
    """A cascade's levels, checked: a budget per expert, and the error and abstention levels given."""
    check_levels("--budget", budgets)
    if abstain is not None:
        check_levels("--abstain", (abstain,))
    return calibrate.CascadeLevels(
        budgets, error=None if accuracy is None else error_level(accuracy), abstain=abstain
    )


def cascade_scores_path(scores: Path | None, run: str | None) -> Path:
    """The table a cascade is validated on: --scores FILE, or the run's cascade/scores.parquet."""
    if (scores is None) == (run is None):
        raise InputError("give exactly one of --scores FILE and --run NAME")
    if scores is not None:
        return Path(scores)
    path = Roots.resolve().run(str(run)).cascade.scores
    if not path.is_file():
        raise InputError(
            f"--run {run}: {path} does not exist (was the run's --expert a cascade, small,large?)"
        )
    return path


def validate_cascade_command(
    path: Path,
    *,
    budgets: tuple[float, ...],
    accuracy: float | None,
    abstain: float | None,
    control: calibrate.ControlConfig,
    trials: int,
    cal_size: int | None,
    seed: int,
    arch: str | None,
    eval_scores: Path | None,
    out: Path | None,
    json_output: bool,
) -> None:
    """Validate the cascade of `path` at one level per expert (and the error and abstention
    levels given) and print the table (or the JSON record)."""
    levels = cascade_level(budgets, accuracy, abstain)
    table = read_scores(path)
    check_budget_count(path, table.stages, len(budgets))
    scores = table.cascade_scores(arch)
    fresh = None
    if eval_scores is not None:
        other = read_scores(eval_scores)
        if other.stages != table.stages:
            raise InputError(
                f"--eval-scores: {eval_scores} holds {other.stages} experts, {path} {table.stages}"
            )
        fresh = other.cascade_scores(arch)
        missing = sorted(set(scores) - set(fresh))
        if missing:
            raise InputError(f"--eval-scores: {eval_scores} has no test rows for probe seed {missing[0]}")
    (result,) = calibrate.validate_cascade(
        scores,
        levels=[levels],
        trials=trials,
        control=control,
        cal_size=cal_size,
        fresh=fresh,
        seed=seed,
    )
    if out is not None:
        write_table(out, result.per_trial)
    record = {"scores": str(path), **result.to_dict()}
    if json_output:
        print_json(record)
        return
    named = ", ".join(f"{name} {level:g}" for name, level in levels.named())
    shown = Table(
        title=f"cascade of {table.stages} experts: {named}; delta={control.delta:g}, {trials} trials"
    )
    for column in ("selector", "measured", "violation rate", "selected", "violations by risk"):
        shown.add_column(column, no_wrap=True)
    for selector, label in (("ltt", "LTT"), ("empirical", "empirical")):
        for measurement, interval in result.violation[selector].items():
            by_risk = ", ".join(f"{k} {v}" for k, v in result.risk_violations[selector][measurement].items())
            shown.add_row(
                label,
                measurement,
                f"{interval.proportion:.1%} [{100 * interval.low:.1f}, {100 * interval.high:.1f}]",
                f"{result.selection[selector].proportion:.1%}",
                by_risk,
            )
    stdout.print(shown)
    realised = result.per_trial
    chosen = realised["ltt_selected"].astype(bool)
    if chosen.any():
        calls = [
            float(np.mean(realised[f"ltt_population_calls_{k}"][chosen])) for k in range(1, table.stages + 1)
        ]
        stdout.print(
            "LTT's chosen configurations on the population: calls "
            + ", ".join(f"expert {k} {c:.3f}" for k, c in enumerate(calls, start=1))
            + f"; error {float(np.mean(realised['ltt_population_error'][chosen])):.3f}"
            + f"; abstained {float(np.mean(realised['ltt_population_abstained'][chosen])):.3f}"
        )
    stdout.print(
        "A trial violates when any certified risk exceeds its level on the rows measured (integer "
        f"counts); the LTT rates should stay at or below delta = {control.delta:g}. The empirical "
        "selector tests nothing."
    )
