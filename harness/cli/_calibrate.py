"""`ctd simulate`, `ctd calibrate` and `ctd validate`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, cast

import typer
from rich.table import Table

import calibrate
from calibrate import (
    OBJECTIVES,
    POLICIES,
    CalibratedPolicyName,
    FWERMethod,
    JointObjective,
    MergeChoice,
    MergeRule,
    Objective,
    PValueMethod,
    SweepConfig,
    ValidationConfig,
    ValidationMode,
)

from .._bounds import LIMITS, check_levels
from .._errors import InputError
from ..data import DEFAULT_RANDOM_STATE, Scenario
from ..run import RunLayout
from ..stages import calibrate_scores, resolve_scores, simulate, validate_joint_scores, validate_scores
from ._cascade_calibrate import (
    POLICIES_HELP,
    CascadeAbstainOption,
    CascadeBudgetOption,
    calibrate_cascade_command,
)
from ._cascade_validation import cascade_budgets, cascade_scores_path, validate_cascade_command
from ._common import (
    BUDGETS_TEXT,
    clean_errors,
    parse_floats,
    parse_ints,
    parse_names,
    print_json,
    stdout,
)
from ._joint_validation import error_level, joint_level, print_joint

ScoresOption = Annotated[
    Path | None,
    typer.Option("--scores", help="A scores table (.parquet, or .csv) with the SPEC section 2 columns."),
]
RunOption = Annotated[
    str | None,
    typer.Option(
        "--run", help=f"A run name: uses {RunLayout(Path('runs', 'NAME')).scores} instead of --scores."
    ),
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
PValueOption = Annotated[
    PValueMethod,
    typer.Option(
        "--pvalue",
        help=(
            "p-value of each LTT test: binomial (exact, as the paper's text says) or hb (Hoeffding-Bentkus, "
            "as the authors' code did for performance control; more conservative)."
        ),
    ),
]
DeltaOption = Annotated[
    float, typer.Option("--delta", help="Failure probability of the guarantee, in (0, 1).")
]


# The commands' defaults are the config objects' own: one place for each.
_SWEEP = SweepConfig()
_VALIDATION = ValidationConfig()
# ValidationConfig's, typed as the option takes it: a method's name (the field also takes a procedure).
_VALIDATION_FWER = cast(FWERMethod, _VALIDATION.fwer)
_DEFAULT_ALPHA = 0.3  # ctd validate's risk level when neither --alpha nor a risk option is given


def _unit(value: float, option: str) -> float:
    check_levels(option, (value,))
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
        typer.Option("--out", help="Output folder (default: runs/NAME/calibrate with --run)."),
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
            control=calibrate.ControlConfig(delta=_unit(delta, "--delta"), fwer=fwer, pvalue=pvalue),
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
    if out is None:
        if run is None:
            raise InputError("--out: give an output folder (or use --run NAME)")
        out = scores_path.parent / "calibrate"
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
            delta=_unit(delta, "--delta"),
            merge=merge,
            fwer=fwer,
            pvalue=pvalue,
            pareto=pareto,
            split_seed=split_seed,
            accuracy=None if accuracy is None else _unit(accuracy, "--accuracy"),
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None
    summary = calibrate_scores(scores_path, out, config, arch=arch)
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


_VALIDATE_TEXT = """Check a guarantee empirically over many random calibration samples.

Each trial draws a calibration sample from a seed's test split (--cal-size, default half),
calibrates on it (30% D_est, 70% D_cal), and measures the returned policy's realised risk three
ways. paper: on the rest of the split, the paper's protocol. population: on the split minus
D_est, the finite population D_cal was drawn from, whose risk LTT certifies; its violation
rate should stay at or below delta. fresh (with --eval-scores): on an independent table with
the same columns. With half splits D_cal is a large share of the population and the binomial
test is conservative for such a sample, so a population rate well under delta shows the
guarantee holds but is a weak test of a procedure: a test at 2 delta still read under delta
there. For a sharp check, calibrate on small samples of a large table (below).

Why paper reads higher: finite evaluation noise and the complementarity of the halves, about
equally. LTT puts the chosen policy's risk just below alpha, and a policy whose risk is exactly
alpha exceeds floor(800 alpha) losses on 800 evaluation rows about half the time (48% at alpha
0.3); and the evaluation half is what the calibration half left of one fixed split, so a
calibration half with few losses (when LTT certifies an aggressive threshold) leaves one with
more. Measured on 2,000 trials: the complementary half read 11.6%, an independent 800 rows of the
same table 6.0%, the population 1.8%. On 1,600-row simulated splits at delta 0.1 the paper
protocol read up to 10.8% where the population rate stayed at or below 3.0%.

Fresh data measures the guarantee when each trial's calibration sample is a small draw from a
large table: give a small --cal-size with a large --scores. Trials drawn from one small fixed
table are all conditioned on that table: a table whose probe happens to err less than the
generator's (or delegate less) can violate on fresh data in most trials while the guarantee,
which is over draws of the calibration data, holds. Halves of one 1,600-row table read up to
18.6% on fresh data for budget-only LTT; 800-row samples of a 20,000-row table stayed below
delta, and a test at 2 delta read 12.8% on fresh data (800-row samples of 100,000 rows).

A violation is more than floor(alpha m) delegations (budget mode) or errors (performance mode)
on the m rows measured, decided on integer counts. Reports the violation rate with its 95%
Clopper-Pearson interval and the selection rate, and in performance mode the same for the
untested empirical selector.

--budget A --accuracy B (and --fnr C) validate joint control: every risk certified at one
threshold, the max of the risks' exact p-values tested in sequence; a trial violates when any
risk exceeds its level, and the table also gives each risk's rate, for LTT and the empirical
selector. Either alone is --mode budget --alpha A or --mode performance --alpha 1-B."""
# One line per paragraph: the help formatter keeps line breaks as they are written.
VALIDATE_HELP = "\n\n".join(" ".join(paragraph.split()) for paragraph in _VALIDATE_TEXT.split("\n\n"))


@clean_errors
def validate_command(
    *,
    scores: ScoresOption = None,
    run: RunOption = None,
    mode: Annotated[
        ValidationMode | None,
        typer.Option(
            "--mode",
            help=(
                "budget: certify the delegation rate <= alpha; performance: certify the 0-1 error <= alpha "
                "[default: budget]."
            ),
        ),
    ] = None,
    alpha: Annotated[
        float | None, typer.Option("--alpha", help=f"Risk target in (0, 1) [default: {_DEFAULT_ALPHA:g}].")
    ] = None,
    budget: Annotated[
        str | None,
        typer.Option(
            "--budget",
            help=(
                "Certify the delegation rate <= BUDGET. With --accuracy (or --fnr): joint control, every "
                "risk at one threshold; alone: --mode budget --alpha BUDGET. A cascade of experts "
                "(columns expert_2, dv_2, ...; --run: the run's cascade table): one budget per expert, "
                "B1,B2, each expert's share of the inputs, certified with --accuracy and --abstain jointly."
            ),
        ),
    ] = None,
    abstain: Annotated[
        float | None,
        typer.Option(
            "--abstain",
            help="A cascade: also leave at most this share of inputs to a human (abstain when the last "
            "score is within a margin of 0.5), certified with the other levels. --selection, --pareto, "
            "--policy, --objective and --merge do not apply to a cascade (its choice: the smallest D_est "
            "error).",
        ),
    ] = None,
    accuracy: Annotated[
        float | None,
        typer.Option(
            "--accuracy",
            help=(
                "Certify the cascade's accuracy >= ACCURACY (error <= 1 - ACCURACY). With --budget (or "
                "--fnr): joint control; alone: --mode performance --alpha 1-ACCURACY. With --abstain, the "
                "error is the share of all inputs decided wrongly (left to a human: not an error)."
            ),
        ),
    ] = None,
    fnr: Annotated[
        float | None,
        typer.Option(
            "--fnr",
            help="Joint control also certifies the false-negative rate on the positives (label 1) <= FNR.",
        ),
    ] = None,
    selection: Annotated[
        JointObjective,
        typer.Option(
            "--selection",
            help="Joint control: pick among the certified thresholds by D_est AUROC, accuracy or budget.",
        ),
    ] = _VALIDATION.selection,
    delta: DeltaOption = _VALIDATION.delta,
    trials: Annotated[
        int,
        typer.Option("--trials", min=1, max=LIMITS["--trials"], help="Random calibration samples (trials)."),
    ] = _VALIDATION.trials,
    policy: Annotated[
        CalibratedPolicyName, typer.Option("--policy", help="Calibrated policy to validate.")
    ] = _VALIDATION.policy,
    objective: Annotated[
        Objective, typer.Option("--objective", help="Pareto objective in budget mode.")
    ] = _VALIDATION.objective,
    pareto: ParetoOption = _VALIDATION.pareto,
    fwer: FwerOption = _VALIDATION_FWER,
    pvalue: PValueOption = _VALIDATION.pvalue,
    merge: Annotated[
        MergeRule | None,
        typer.Option("--merge", help="Merge rule on delegated inputs (default: the policy's own)."),
    ] = _VALIDATION.merge,
    seed: Annotated[
        int,
        typer.Option(
            "--seed",
            help=(
                "Seed of the random calibration samples: trial t of probe seed s is drawn from a generator "
                "seeded by (--seed, s), so the same seed gives the same trials."
            ),
        ),
    ] = calibrate.DEFAULT_SPLIT_SEED,  # ValidationConfig's, typed as the one seed this option takes
    cal_size: Annotated[
        int | None,
        typer.Option(
            "--cal-size",
            min=2,
            max=LIMITS["--cal-size"],
            help="Calibration sample per trial, 30% D_est and 70% D_cal (default: half of each test split).",
        ),
    ] = None,
    eval_scores: Annotated[
        Path | None,
        typer.Option(
            "--eval-scores",
            help="An independent scores table (same columns and seeds) to measure every policy on: 'fresh'.",
        ),
    ] = None,
    arch: ArchOption = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Also write one row per trial to this table (.csv or .parquet)."),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    budgets = cascade_budgets(budget) if budget is not None else None
    if budgets is not None and (len(budgets) > 1 or abstain is not None):
        if fnr is not None or mode is not None or alpha is not None:
            raise InputError(
                "--budget B1,B2 (a cascade) takes --accuracy and --abstain, not --fnr, --mode, --alpha"
            )
        validate_cascade_command(
            cascade_scores_path(scores, run) if len(budgets) > 1 else resolve_scores(scores, run),
            budgets=budgets,
            accuracy=accuracy,
            abstain=abstain,
            control=calibrate.ControlConfig(delta=_unit(delta, "--delta"), fwer=fwer, pvalue=pvalue),
            trials=trials,
            cal_size=cal_size,
            seed=seed,
            arch=arch,
            eval_scores=eval_scores,
            out=out,
            json_output=json_output,
        )
        return
    if abstain is not None:
        raise InputError("--abstain: give the cascade's budgets too (--budget B1[,B2,...])")
    budget_level = None if budgets is None else budgets[0]
    scores_path = resolve_scores(scores, run)
    joint = joint_level(mode, alpha, budget_level, accuracy, fnr)
    if joint is None:
        if budget_level is not None:
            mode, alpha = "budget", _unit(budget_level, "--budget")
        elif accuracy is not None:
            mode, alpha = "performance", error_level(accuracy)
    mode = mode or "budget"
    alpha = _DEFAULT_ALPHA if alpha is None else alpha
    alphas = (_unit(alpha, "--alpha"),)
    config = ValidationConfig(
        trials=trials,
        policy=policy,
        objective=objective,
        merge=merge,
        delta=_unit(delta, "--delta"),
        fwer=fwer,
        pareto=pareto,
        pvalue=pvalue,
        cal_size=cal_size,
        seed=seed,
        selection=selection,
    )
    if joint is not None:
        result = validate_joint_scores(
            scores_path,
            level=joint,
            config=config,
            arch=arch,
            eval_scores=eval_scores,
            out=out,
        )
        print_joint(result, scores_path, eval_scores, trials=trials, json_output=json_output)
        return
    (result,) = validate_scores(
        scores_path,
        mode=mode,
        alphas=alphas,
        config=config,
        arch=arch,
        eval_scores=eval_scores,
        out=out,
    )
    record = {"scores": str(scores_path), **result.to_dict()}
    if eval_scores is not None:
        record["eval_scores"] = str(eval_scores)
    if json_output:
        print_json(record)
        return
    table = Table(title=f"{mode} control, alpha={alpha:g}, delta={delta:g}, {trials} trials ({policy})")
    for column in ("selector", "measured", "violation rate", "selected", "realised", "accuracy"):
        table.add_column(column, no_wrap=True)
    selectors = [("LTT", result.tested)] + ([("empirical", result.empirical)] if result.empirical else [])
    for name, selector in selectors:
        for measurement in calibrate.MEASUREMENTS:
            s = selector.measured(measurement)
            if s is None:
                continue
            table.add_row(
                name,
                measurement,
                f"{s.violation_rate:.1%} [{100 * s.violation.low:.1f}, {100 * s.violation.high:.1f}]",
                f"{s.selection_rate:.1%}",
                f"{s.mean_realised_budget:.3f}",
                f"{s.mean_accuracy:.3f}",
            )
    stdout.print(table)
    stdout.print(
        "Violation rates with 95% Clopper-Pearson intervals; realised delegation and accuracy are means "
        "over the trials that returned a policy. The population (and fresh) rates measure the guarantee "
        f"and should stay at or below delta = {delta:g}; the paper protocol over-reads it (see --help)."
    )


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_command)
    app.command("calibrate")(calibrate_command)
    app.command("validate", help=VALIDATE_HELP)(validate_command)
