"""`ctd simulate`, `ctd calibrate` and `ctd validate`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

import calibrate
from calibrate import (
    OBJECTIVES,
    POLICIES,
    CalibratedPolicyName,
    FWERMethod,
    MergeChoice,
    MergeRule,
    Objective,
    SweepConfig,
    ValidationMode,
)

from .._calibration import calibrate_scores, resolve_scores, simulate, validate_scores
from .._errors import InputError
from .._simulate import Scenario
from ._common import (
    clean_errors,
    parse_floats,
    parse_ints,
    parse_names,
    parse_unit_interval,
    print_json,
    stdout,
)

ScoresOption = Annotated[
    Path | None,
    typer.Option("--scores", help="A scores table (.parquet, or .csv) with the SPEC section 2 columns."),
]
RunOption = Annotated[
    str | None, typer.Option("--run", help="A run name: uses runs/NAME/scores.parquet instead of --scores.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as one JSON object on stdout.")]
ArchOption = Annotated[
    str | None,
    typer.Option("--arch", help="Probe configuration to use when the table holds several (column 'arch')."),
]
FwerOption = Annotated[FWERMethod, typer.Option("--fwer", help="Multiple-testing procedure.")]
ParetoOption = Annotated[
    bool,
    typer.Option(
        "--pareto/--no-pareto",
        help=(
            "Pareto-filter the thresholds on D_est. --no-pareto: in budget mode, budget-only LTT (test "
            "every threshold, keep the most aggressive certified one); in performance mode, test every "
            "threshold unfiltered."
        ),
    ),
]
DeltaOption = Annotated[
    float, typer.Option("--delta", help="Failure probability of the guarantee, in (0, 1).")
]


def _unit(value: float, option: str) -> float:
    parse_unit_interval((value,), option)
    return value


@clean_errors
def simulate_command(
    *,
    scenario: Annotated[
        Scenario,
        typer.Option(
            "--scenario",
            help="strong: the expert beats the probe on average; weak: it does not.",
        ),
    ],
    n: Annotated[int, typer.Option("--n", min=2, help="Test examples per seed.")] = 1600,
    n_dev: Annotated[
        int | None, typer.Option("--n-dev", min=0, help="Dev examples per seed (default: --n).")
    ] = None,
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="Probe training seeds.")] = 3,
    out: Annotated[Path, typer.Option("--out", help="Output file: Parquet, or CSV when it ends .csv.")],
    random_state: Annotated[int, typer.Option("--random-state", help="Seed of the generator.")] = 0,
) -> None:
    """Write a synthetic scores table: four groups, a strong or weak expert, a noisy DV score."""
    path = simulate(scenario, n, seeds, out, n_dev=n_dev, random_state=random_state)
    stdout.print(f"wrote {path} ({seeds} seeds x {n} test + {n if n_dev is None else n_dev} dev rows)")


@clean_errors
def calibrate_command(
    *,
    scores: ScoresOption = None,
    run: RunOption = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Output folder (default: runs/NAME/calibrate with --run)."),
    ] = None,
    budgets: Annotated[
        str, typer.Option("--budgets", help="Target budgets: 0.1,0.2 or START:STOP:COUNT.")
    ] = "0.05:0.95:20",
    batch_sizes: Annotated[
        str, typer.Option("--batch-sizes", help="Batch sizes for the top-k policies.")
    ] = "32,64,128",
    policies: Annotated[
        str, typer.Option("--policies", help=f"Comma-separated, from: {', '.join(POLICIES)}.")
    ] = ",".join(calibrate.DEFAULT_POLICIES),
    objectives: Annotated[
        str,
        typer.Option("--objectives", help="Pareto objectives of the calibrated policies: auroc, accuracy."),
    ] = ",".join(OBJECTIVES),
    delta: DeltaOption = 0.1,
    merge: Annotated[
        MergeChoice,
        typer.Option(
            "--merge",
            help="default: each policy's own rule; overwrite/average: one rule for all (merging controls).",
        ),
    ] = "default",
    fwer: FwerOption = "fixed-sequence",
    pareto: ParetoOption = True,
    split_seed: Annotated[
        int, typer.Option("--split-seed", help="Seed of the calibration/evaluation split.")
    ] = 0,
    arch: ArchOption = None,
    json_output: JsonOption = False,
) -> None:
    """Compare the delegation policies over budgets, batch sizes, seeds and objectives.

    Policies: CTD and uncertainty-calibrated (Learn-then-Test thresholds), DV, uncertainty and
    oracle top-k per batch, and McKenzie's central-k. Writes sweep.csv (one row per policy x
    budget x batch size x seed x objective), ltt.jsonl (the tests behind every calibrated row),
    baselines.csv and summary.json.
    """
    scores_path = resolve_scores(scores, run)
    if out is None:
        if run is None:
            raise InputError("--out: give an output folder (or use --run NAME)")
        out = scores_path.parent / "calibrate"
    try:
        config = SweepConfig(
            budgets=parse_unit_interval(parse_floats(budgets, "--budgets"), "--budgets"),
            batch_sizes=parse_ints(batch_sizes, "--batch-sizes"),
            policies=parse_names(policies, "--policies", tuple(POLICIES)),
            objectives=parse_names(objectives, "--objectives", OBJECTIVES),
            delta=_unit(delta, "--delta"),
            merge=merge,
            fwer=fwer,
            pareto=pareto,
            split_seed=split_seed,
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None
    summary = calibrate_scores(scores_path, out, config, arch=arch)
    if json_output:
        print_json(summary)
        return
    table = Table(title=f"Mean over budgets and seeds, batch size {max(config.batch_sizes)}")
    for column in ("objective", "policy", "AUROC", "accuracy", "realised"):
        table.add_column(column)
    for objective, by_policy in summary["mean_over_budgets"].items():
        for policy, m in by_policy.items():
            table.add_row(
                objective, policy, f"{m['auroc']:.3f}", f"{m['accuracy']:.3f}", f"{m['realised']:.3f}"
            )
    stdout.print(table)
    b = summary["baselines"]
    stdout.print(
        f"probe only: AUROC {b['probe_auroc']:.3f}, accuracy {b['probe_accuracy']:.3f}; "
        f"expert only: AUROC {b['expert_auroc']:.3f}, accuracy {b['expert_accuracy']:.3f}"
    )
    stdout.print(f"wrote {summary['rows']} rows to {summary['table']} in {summary['elapsed_s']:.2f} s")


@clean_errors
def validate_command(
    *,
    scores: ScoresOption = None,
    run: RunOption = None,
    mode: Annotated[
        ValidationMode,
        typer.Option(
            "--mode",
            help="budget: certify the delegation rate <= alpha; performance: certify the 0-1 error <= alpha.",
        ),
    ] = "budget",
    alpha: Annotated[float, typer.Option("--alpha", help="Risk target in (0, 1).")] = 0.3,
    delta: DeltaOption = 0.1,
    trials: Annotated[
        int, typer.Option("--trials", min=1, help="Random calibration/evaluation splits.")
    ] = 500,
    policy: Annotated[
        CalibratedPolicyName, typer.Option("--policy", help="Calibrated policy to validate.")
    ] = "ctd",
    objective: Annotated[
        Objective, typer.Option("--objective", help="Pareto objective in budget mode.")
    ] = "auroc",
    pareto: ParetoOption = True,
    fwer: FwerOption = "fixed-sequence",
    merge: Annotated[
        MergeRule | None,
        typer.Option("--merge", help="Merge rule on delegated inputs (default: the policy's own)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random splits.")] = 0,
    arch: ArchOption = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Also write one row per trial to this table (.csv or .parquet)."),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Check a guarantee empirically over many random calibration/evaluation splits.

    Each trial calibrates on a random half of a seed's test split and measures the returned
    policy on the other half. Reports the violation rate with a 95% Clopper-Pearson interval,
    the selection rate, and in performance mode the same for the untested empirical selector.
    The halves are complementary, so a calibration half that delegates little leaves an
    evaluation half that delegates more: expect violation rates somewhat above those on fresh
    data.
    """
    scores_path = resolve_scores(scores, run)
    result = validate_scores(
        scores_path,
        mode=mode,
        alpha=_unit(alpha, "--alpha"),
        delta=_unit(delta, "--delta"),
        trials=trials,
        policy=policy,
        objective=objective,
        pareto=pareto,
        fwer=fwer,
        merge=merge,
        seed=seed,
        arch=arch,
        out=out,
    )
    record = {"scores": str(scores_path), **result.to_dict()}
    if json_output:
        print_json(record)
        return
    table = Table(title=f"{mode} control, alpha={alpha:g}, delta={delta:g}, {trials} trials ({policy})")
    for column in (
        "selector",
        "violation rate (95% CI)",
        "selection rate",
        "mean realised budget",
        "mean accuracy",
    ):
        table.add_column(column)
    selectors = [("LTT", result.tested)] + ([("empirical", result.empirical)] if result.empirical else [])
    for name, s in selectors:
        table.add_row(
            name,
            f"{s.violation_rate:.3f} [{s.violation.low:.3f}, {s.violation.high:.3f}]",
            f"{s.selection_rate:.3f}",
            f"{s.mean_realised_budget:.3f}",
            f"{s.mean_accuracy:.3f}",
        )
    stdout.print(table)


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_command)
    app.command("calibrate")(calibrate_command)
    app.command("validate")(validate_command)
