"""`ctd simulate` and `ctd calibrate`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

import calibrate
from calibrate import (
    OBJECTIVES,
    POLICIES,
    MergeChoice,
    SweepConfig,
)

from .._bounds import LIMITS, check_levels
from .._errors import InputError
from ..data import DEFAULT_RANDOM_STATE, Scenario
from ..run import Roots, RunLayout, RunLog
from ..stages import calibrate_scores, resolve_scores, simulate
from ._cascade_calibrate import (
    POLICIES_HELP,
    CascadeAbstainOption,
    CascadeBudgetOption,
    calibrate_cascade_command,
)
from ._common import (
    BUDGETS_TEXT,
    clean_errors,
    parse_floats,
    parse_ints,
    parse_names,
    print_json,
    stdout,
)
from ._table_options import (
    ArchOption,
    DeltaOption,
    FwerOption,
    JsonOption,
    ParetoOption,
    PValueOption,
    RunOption,
    ScoresOption,
    unit_level,
)

# The command's defaults are the config object's own: one place for each.
_SWEEP = SweepConfig()


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
    n: Annotated[int, typer.Option("--n", min=2, max=LIMITS["--n"], help="Test examples per seed.")] = 1600,
    n_dev: Annotated[
        int | None,
        typer.Option("--n-dev", min=0, max=LIMITS["--n-dev"], help="Dev examples per seed (default: --n)."),
    ] = None,
    seeds: Annotated[
        int, typer.Option("--seeds", min=1, max=LIMITS["values"], help="Probe training seeds.")
    ] = 3,
    out: Annotated[Path, typer.Option("--out", help="Output file: Parquet, or CSV when it ends .csv.")],
    random_state: Annotated[
        int, typer.Option("--random-state", help="Seed of the generator.")
    ] = DEFAULT_RANDOM_STATE,
    stages: Annotated[
        int,
        typer.Option(
            "--stages",
            min=1,
            max=LIMITS["stages"],
            help=(
                "Experts in the cascade: above 1, each later expert is larger (better on hard inputs) and "
                "has its columns expert_K and dv_K (its DV score: its value over the stage before)."
            ),
        ),
    ] = 1,
) -> None:
    """Write a synthetic scores table: four groups, a strong or weak expert, a noisy DV score."""
    rows = seeds * (n + (n if n_dev is None else n_dev))
    if rows > LIMITS["rows"]:
        raise InputError(f"--n/--n-dev x --seeds: {rows:,} rows in all, at most {LIMITS['rows']:,}")
    path = simulate(scenario, n, seeds, out, n_dev=n_dev, random_state=random_state, stages=stages)
    cascade = f", {stages} experts" if stages > 1 else ""
    stdout.print(
        f"wrote {path} ({seeds} seeds x {n} test + {n if n_dev is None else n_dev} dev rows{cascade})"
    )


@clean_errors
def calibrate_command(
    *,
    scores: ScoresOption = None,
    run: RunOption = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help=(
                "Output folder (default with --run: the run's sweep, runs/NAME/calibrate/ARCH/, or "
                "ARCH/merge-RULE/ with --merge, which `ctd report NAME` reads; a run made by `ctd eval` "
                "is swept again by `ctd eval` itself)."
            ),
        ),
    ] = None,
    budgets: Annotated[
        str | None,
        typer.Option("--budgets", help=f"Target budgets: 0.1,0.2 or START:STOP:COUNT [{BUDGETS_TEXT}]."),
    ] = None,
    batch_sizes: Annotated[
        str, typer.Option("--batch-sizes", help="Batch sizes for the top-k policies.")
    ] = ",".join(map(str, _SWEEP.batch_sizes)),
    policies: Annotated[
        str, typer.Option("--policies", help=f"Comma-separated, from: {', '.join(POLICIES)}. {POLICIES_HELP}")
    ] = ",".join(_SWEEP.policies),
    objectives: Annotated[
        str,
        typer.Option(
            "--objectives",
            help=f"Pareto objectives of the calibrated policies: {', '.join(calibrate.OBJECTIVES)}.",
        ),
    ] = ",".join(_SWEEP.objectives),
    delta: DeltaOption = _SWEEP.delta,
    merge: Annotated[
        MergeChoice,
        typer.Option(
            "--merge",
            help="default: each policy's own rule; overwrite/average: one rule for all (merging controls).",
        ),
    ] = _SWEEP.merge,
    fwer: FwerOption = _SWEEP.fwer,
    pvalue: PValueOption = _SWEEP.pvalue,
    pareto: ParetoOption = _SWEEP.pareto,
    split_seed: Annotated[
        int, typer.Option("--split-seed", help="Seed of the calibration/evaluation split.")
    ] = _SWEEP.split_seed,
    accuracy: Annotated[
        float | None,
        typer.Option(
            "--accuracy",
            help=(
                "Also certify accuracy >= this, in (0, 1): every calibrated row's threshold is certified "
                "jointly (delegation rate <= its budget and error <= 1 - accuracy, family-wise error "
                "delta) and chosen by its objective; a budget where none is certified has no policy "
                "(empty metrics, n_certified 0)."
            ),
        ),
    ] = _SWEEP.accuracy,
    budget: CascadeBudgetOption = None,
    abstain: CascadeAbstainOption = None,
    arch: ArchOption = None,
    json_output: JsonOption = False,
) -> None:
    """Compare the delegation policies over budgets, batch sizes, seeds and objectives.

    Policies: CTD and uncertainty-calibrated (Learn-then-Test thresholds), DV, uncertainty and
    oracle top-k per batch, and McKenzie's central-k. Writes sweep.csv (one row per policy x
    budget x batch size x seed x objective), ltt.jsonl (the tests behind every calibrated row),
    baselines.csv and summary.json. A cascade of experts (--budget B1,B2): one row per seed and
    level (and policy, with --policies ctd,uncertainty) in sweep.csv, baselines.csv and summary.json.
    """
    if budget is not None or abstain is not None:
        calibrate_cascade_command(
            scores=scores,
            run=run,
            out=out,
            budget=budget or [],
            accuracy=accuracy,
            abstain=abstain,
            control=calibrate.ControlConfig(delta=unit_level(delta, "--delta"), fwer=fwer, pvalue=pvalue),
            split_seed=split_seed,
            arch=arch,
            json_output=json_output,
            sweep_options={
                "--budgets": budgets,
                "--batch-sizes": batch_sizes,
                "--policies": policies,
                "--objectives": objectives,
                "--merge": merge,
                "--pareto": pareto,
            },
        )
        return
    scores_path = resolve_scores(scores, run)
    if out is None and run is None:
        raise InputError("--out: give an output folder (or use --run NAME)")
    target = out if out is not None else _run_sweep(str(run))
    try:
        config = SweepConfig(
            budgets=(
                check_levels("--budgets", parse_floats(budgets, "--budgets"))
                if budgets is not None
                else _SWEEP.budgets
            ),
            batch_sizes=parse_ints(batch_sizes, "--batch-sizes"),
            policies=parse_names(policies, "--policies", tuple(POLICIES)),
            objectives=parse_names(objectives, "--objectives", OBJECTIVES),
            delta=unit_level(delta, "--delta"),
            merge=merge,
            fwer=fwer,
            pvalue=pvalue,
            pareto=pareto,
            split_seed=split_seed,
            accuracy=None if accuracy is None else unit_level(accuracy, "--accuracy"),
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None
    summary = calibrate_scores(scores_path, target, config, arch=arch)
    if json_output:
        print_json(summary)
        return
    stdout.print(_means_table(summary, max(config.batch_sizes)))
    b = summary["baselines"]
    stdout.print(
        f"probe only: AUROC {b['probe_auroc']:.3f}, accuracy {b['probe_accuracy']:.3f}; "
        f"expert only: AUROC {b['expert_auroc']:.3f}, accuracy {b['expert_accuracy']:.3f}"
    )
    stdout.print(f"wrote {summary['rows']} rows to {summary['table']} in {summary['elapsed_s']:.2f} s")


def _run_sweep(run: str) -> RunLayout:
    """The run whose sweep --run NAME writes (the one its report reads), unless `ctd eval` made
    that sweep: its record and the later stages (validate, report) follow the run's settings, and
    its next run would replace a sweep written here."""
    layout = Roots.resolve().run(run)
    if layout.run_log.is_file() and "calibrate" in RunLog.read(layout.run_log).stages:
        raise InputError(
            f"--run {run}: its sweep was made by `ctd eval` ({layout.run_log}); sweep it again with other "
            f"settings through `ctd eval --config {layout.config} --budgets ...` (it reruns calibrate, "
            "validate and report only), or write this sweep elsewhere with --out"
        )
    return layout


def _means_table(summary: dict, batch_size: int) -> Table:
    """The summary's means per objective and policy; with --accuracy, over the rows that have a
    policy, and how many of the (budget, seed) rows that is."""
    found = summary.get("policies_found")
    title = f"Mean over budgets and seeds, batch size {batch_size}"
    if found is not None:
        title += f"; joint with error <= {summary['error_level']:g}, over the budgets with a policy"
    table = Table(title=title)
    for column in ("objective", "policy", "AUROC", "accuracy", "realised") + (
        ("with policy",) if found is not None else ()
    ):
        table.add_column(column)
    for objective, by_policy in summary["mean_over_budgets"].items():
        for policy, m in by_policy.items():
            cells = [objective, policy, f"{m['auroc']:.3f}", f"{m['accuracy']:.3f}", f"{m['realised']:.3f}"]
            if found is not None:
                count = found.get(objective, {}).get(policy)
                cells.append("-" if count is None else f"{count['with_policy']}/{count['rows']}")
            table.add_row(*cells)
    return table


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_command)
    app.command("calibrate")(calibrate_command)
