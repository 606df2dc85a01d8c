"""`ctd calibrate` on a cascade of experts: `--budget B1,B2[,...]` (one budget per expert; the
option again for another level of the sweep), with `--accuracy` and `--abstain`, sweeps the
K-stage cascade of a table's expert_K and dv_K columns (or a run's cascade table): per probe
seed and level the configuration certified on the calibration half and its realised rates on
the evaluation half (`harness.stages._cascade_calibrate`). `--policies ctd,uncertainty` sweeps
each stage's threshold on the DV score (CTD) and on the uncertainty of the score held
(`calibrate.uncertainty_signals`) side by side, on the same splits."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.table import Table

import calibrate

from .._errors import InputError
from ..run import Roots
from ..stages import calibrate_cascade_scores, resolve_scores
from ._cascade_validation import cascade_budgets, cascade_level, cascade_scores_path
from ._common import parse_names, print_json, stdout

__all__ = [
    "POLICIES_HELP",
    "SWEEP_ONLY",
    "CascadeAbstainOption",
    "CascadeBudgetOption",
    "calibrate_cascade_command",
]

CascadeBudgetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--budget",
        metavar="B1,B2",
        help=(
            "A cascade of experts (columns expert_2, dv_2, ...; --run: the run's cascade table): one "
            "budget per expert, B1,B2, each expert's share of the inputs, certified with --accuracy "
            "and --abstain jointly; give it again for another level. Writes per probe seed and level "
            "the configuration chosen (a threshold per expert, the abstention margin) and its rates on "
            "the evaluation half (--out default: runs/NAME/cascade/calibrate). --policies ctd,uncertainty: "
            "also each stage's threshold on the uncertainty of the score held, side by side."
        ),
    ),
]
CascadeAbstainOption = Annotated[
    float | None,
    typer.Option(
        "--abstain",
        help="A cascade: also leave at most this share of inputs to a human, certified with the rest.",
    ),
]

POLICIES_HELP = (
    f"A cascade (--budget B1,B2): from {', '.join(calibrate.CASCADE_POLICIES)} "
    f"[default there: {','.join(calibrate.DEFAULT_CASCADE_POLICIES)}]."
)

_SWEEP = calibrate.SweepConfig()
# The options of the one-expert sweep, and their defaults: given otherwise, a cascade refuses
# them, but for --policies, which a cascade takes with its own names (CASCADE_POLICIES).
SWEEP_ONLY: dict[str, object] = {
    "--budgets": None,
    "--batch-sizes": ",".join(map(str, _SWEEP.batch_sizes)),
    "--policies": ",".join(_SWEEP.policies),
    "--objectives": ",".join(_SWEEP.objectives),
    "--merge": _SWEEP.merge,
    "--pareto": _SWEEP.pareto,
}


def _levels(
    budget: list[str], accuracy: float | None, abstain: float | None
) -> tuple[calibrate.CascadeLevels, ...]:
    """One level per --budget, each B1,B2,... with the error and abstention levels given."""
    levels = []
    for text in budget:
        level = cascade_level(cascade_budgets(text), accuracy, abstain)
        if level in levels:
            raise InputError(f"--budget {text}: given twice")
        levels.append(level)
    counts = sorted({len(level.budgets) for level in levels})
    if len(counts) > 1:
        raise InputError(
            f"--budget: every level needs one budget per expert, got {counts[0]} and {counts[1]}"
        )
    return tuple(levels)


def _out(scores: Path | None, run: str | None, out: Path | None, stages: int) -> tuple[Path, Path]:
    """The table swept (--scores, or the run's cascade table; its main one for one expert) and
    the output folder (--out, or the run's cascade/calibrate/)."""
    path = cascade_scores_path(scores, run) if stages > 1 else resolve_scores(scores, run)
    if out is None:
        if run is None:
            raise InputError("--out: give an output folder (or use --run NAME)")
        out = Roots.resolve().run(run).cascade.calibrate.root
    return path, out


def calibrate_cascade_command(
    *,
    scores: Path | None,
    run: str | None,
    out: Path | None,
    budget: list[str],
    accuracy: float | None,
    abstain: float | None,
    control: calibrate.ControlConfig,
    split_seed: int,
    arch: str | None,
    json_output: bool,
    sweep_options: dict[str, object],
) -> None:
    """Sweep the cascade at every --budget level and print one row per seed and level (or the
    JSON summary)."""
    given = [
        name for name, value in sweep_options.items() if value != SWEEP_ONLY[name] and name != "--policies"
    ]
    if given:
        raise InputError(
            f"{given[0]}: does not apply to a cascade (--budget B1,B2), which takes --accuracy and --abstain"
        )
    if not budget:
        raise InputError("--abstain: give the cascade's budgets too (--budget B1[,B2,...])")
    policies = _policies(str(sweep_options.get("--policies", SWEEP_ONLY["--policies"])))
    levels = _levels(budget, accuracy, abstain)
    stages = len(levels[0].budgets)
    path, out = _out(scores, run, out, stages)
    try:
        config = calibrate.CascadeSweepConfig(
            levels=levels,
            delta=control.delta,
            fwer=control.fwer,
            pvalue=control.pvalue,
            split_seed=split_seed,
            policies=policies,
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None
    summary, table = calibrate_cascade_scores(path, out, config, arch=arch)
    if json_output:
        print_json(summary)
        return
    stdout.print(_rows_table(table, levels, stages, control.delta))
    signal = (
        "threshold on the policy's signal (ctd: its DV score; uncertainty: -|s - 0.5|, s the score held)"
        if config.by_policy
        else "DV threshold"
    )
    stdout.print(
        f"certified: configurations certified; λk: expert k's {signal} (never: not asked); τ: the "
        "abstention margin; calls k, error, abstained: shares of the evaluation half; accuracy: 1 - error."
    )
    if config.by_policy:
        stdout.print(_policies_table(summary, stages))
    else:
        _print_levels(summary, stages)
    b = summary["baselines"]
    stdout.print(
        f"alone: probe accuracy {b['probe_accuracy']:.3f}; "
        + "; ".join(f"expert {k} {b[f'expert_{k}_accuracy']:.3f}" for k in range(1, stages + 1))
    )
    stdout.print(f"wrote {summary['rows']} rows to {summary['table']} in {summary['elapsed_s']:.2f} s")


def _policies(text: str) -> tuple[str, ...]:
    """--policies in a cascade: its own names; not given (the one-expert default), the cascade's."""
    if text == SWEEP_ONLY["--policies"]:
        return calibrate.DEFAULT_CASCADE_POLICIES
    return parse_names(text, "--policies", calibrate.CASCADE_POLICIES)  # each once


def _print_levels(summary: dict, stages: int) -> None:
    """Per level, the mean rates over the seeds that certified a configuration (CTD alone)."""
    for entry in summary["by_level"]:
        named = ", ".join(f"{k} {v:g}" for k, v in entry["levels"].items())
        mean = entry["mean"]
        if entry["seeds_certified"] == 0:
            stdout.print(f"{named}: nothing certified in any of {entry['seeds']} seeds")
            continue
        calls = ", ".join(f"expert {k} {mean[f'calls_{k}']:.3f}" for k in range(1, stages + 1))
        stdout.print(
            f"{named}: certified in {entry['seeds_certified']}/{entry['seeds']} seeds; mean calls {calls}; "
            f"error {mean['error']:.3f}, abstained {mean['abstained']:.3f}, accuracy {mean['accuracy']:.3f}"
        )


def _policies_table(summary: dict, stages: int) -> Table:
    """Per level, each policy's seeds certified and mean accuracy, calls per expert and
    abstentions over them, one row per policy under its level."""
    ks = range(1, stages + 1)
    shown = Table(title="per level and policy: the mean over the seeds that certified a configuration")
    for column in ["levels", "policy", "seeds", "accuracy", *(f"calls {k}" for k in ks), "abstained"]:
        shown.add_column(column, no_wrap=column != "levels")
    previous = None
    for entry in summary["by_level"]:
        named = ", ".join(f"{k} {v:g}" for k, v in entry["levels"].items())
        mean = entry["mean"]
        rates = ["accuracy", *(f"calls_{k}" for k in ks), "abstained"]
        shown.add_row(
            named if named != previous else "",
            entry["policy"],
            f"{entry['seeds_certified']}/{entry['seeds']}",
            *("-" if entry["seeds_certified"] == 0 else f"{mean[r]:.3f}" for r in rates),
        )
        previous = named
    return shown


def _cell(value: float, digits: int = 3) -> str:
    if np.isnan(value):
        return "-"
    return "never" if np.isinf(value) else f"{value:.{digits}f}"


def _rows_table(
    table: dict[str, np.ndarray], levels: tuple[calibrate.CascadeLevels, ...], stages: int, delta: float
) -> Table:
    """One row per seed and level: the configuration chosen and its rates on the evaluation half."""
    others = ", ".join(
        f"{name} {level:g}" for name, level in levels[0].named() if not name.startswith("budget")
    )
    experts = f"{stages} expert{'s' if stages > 1 else ''}"
    shown = Table(
        title=f"cascade of {experts}{': ' + others if others else ''}; delta={delta:g}: per seed and "
        "budgets, the configuration certified on the calibration half and its rates on the evaluation half"
    )
    ks = range(1, stages + 1)
    policy = "policy" in table
    header = [
        "seed",
        "budgets",
        *(["policy"] if policy else []),
        "certified",
        *(f"λ{k}" for k in ks),
        "τ",
        *(f"calls {k}" for k in ks),
    ]
    for column in [*header, "error", "abstained", "accuracy"]:
        shown.add_column(column, no_wrap=True)
    for i in range(table["seed"].size):
        level = levels[int(table["level"][i])]
        shown.add_row(
            str(int(table["seed"][i])),
            ", ".join("-" if b is None else f"{b:g}" for b in level.budgets),
            *([str(table["policy"][i])] if policy else []),
            str(int(table["n_certified"][i])),
            *(_cell(float(table[f"threshold_{k}"][i])) for k in ks),
            _cell(float(table["margin"][i])),
            *(_cell(float(table[f"calls_{k}"][i])) for k in ks),
            *(_cell(float(table[c][i])) for c in ("error", "abstained", "accuracy")),
        )
    return shown
