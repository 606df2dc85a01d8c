"""`ctd eval` and `ctd report`."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

import calibrate
from probes import ARCHS

from .._errors import InputError
from ..run import (
    DV_TARGET_CHOICES,
    MIN_SELECTION,
    Roots,
    RunConfig,
    RunLayout,
    StageOutcome,
    StageProgress,
    StageStatus,
    check_roots,
    load_run_config,
    took,
)
from ._common import (
    clean_errors,
    no_run_folder,
    parse_floats,
    parse_ints,
    parse_names,
    parse_seeds,
    print_json,
    shown,
    stderr,
    stdout,
)
from ._expert_options import CostLimitOption

if TYPE_CHECKING:
    from ..report import SummaryRow

_DEFAULTS = RunConfig()


def _d(field: str) -> str:
    """` [DEFAULT]` for a help text, from RunConfig (the one place each default is written)."""
    return f" [{shown(getattr(_DEFAULTS, field))}]"


EVAL_HELP = (
    "Run every stage (probe, query, dv, calibrate, validate, report) in runs/NAME, resumably.\n\n"
    "With no options: the built-in data set, SmolLM2-135M-Instruct as the monitored model and the same "
    "model as a local llama.cpp expert, started and stopped by the run. Rerunning the same command skips "
    "every stage whose inputs have not changed and resumes an interrupted one (extraction from the "
    "activation store, expert queries from the SQLite cache); with every expert answer cached, the expert "
    "is neither asked nor started. The report is in runs/NAME/report/.\n\n"
    "Shared places, checked before any work: $CTD_RUNS_DIR (the runs folder, or --runs-dir), $CTD_STORE "
    "(the activation store, a folder), $CTD_MODEL_CACHE (converted and fetched weights, a folder) and "
    "$CTD_CACHE (the expert cache: a SQLite file, not a folder)."
)


def eval_command(
    *,
    config: Annotated[
        Path | None, typer.Option("--config", help="A TOML file with any of the options below (flags win).")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Run folder name (default: MODEL-EXPERT-DATA).")
    ] = None,
    data: Annotated[
        list[str] | None,
        typer.Option(
            "--data",
            help=(
                "Data spec 'train=PATH dev=GROUP:PATH,... test=GROUP:PATH,...'; without test=, dev files "
                "are cut into dev and test halves (default: the built-in data set)."
            ),
        ),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            help=(
                "At most N examples per split, stratified by group and label, to try a data set on a "
                "few examples first (a small test split certifies only large budgets: pass --budgets). "
                "Default: every example."
            ),
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Monitored model: 'smollm2', a .gguf file, a folder or a hub id" + _d("model") + ".",
        ),
    ] = None,
    revision: Annotated[str | None, typer.Option("--revision", help="Hub revision of --model.")] = None,
    layer: Annotated[
        int | None, typer.Option("--layer", help="Layer (default: 11 for Llama-3.2-1B, else 2/3 depth).")
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", help="Token limit per input" + _d("max_tokens") + ".")
    ] = None,
    batch_tokens: Annotated[
        int | None,
        typer.Option("--batch-tokens", help="Padded tokens per extraction batch" + _d("batch_tokens") + "."),
    ] = None,
    device_map: Annotated[str | None, typer.Option("--device-map", help="'auto' to spread --model.")] = None,
    arch: Annotated[
        str | None,
        typer.Option("--arch", help=f"Probe configurations: {','.join(ARCHS)}" + _d("archs") + "."),
    ] = None,
    seeds: Annotated[
        str | None, typer.Option("--seeds", help="Probe training seeds" + _d("seeds") + ".")
    ] = None,
    epochs: Annotated[
        int | None, typer.Option("--epochs", help="Maximum training epochs" + _d("epochs") + ".")
    ] = None,
    expert: Annotated[
        str | None,
        typer.Option(
            "--expert",
            help=(
                "A registered expert (ctd experts list) or a base URL"
                + _d("expert")
                + ". A cascade: several, in order, comma-separated (small,large): each later one, a "
                "registered name, is asked only about what the stage before escalates (its own DV probe)."
            ),
        ),
    ] = None,
    expert_model: Annotated[
        str | None, typer.Option("--expert-model", help="Served model name when --expert is a URL.")
    ] = None,
    serve: Annotated[
        str | None,
        typer.Option(
            "--serve",
            help="auto: start a local expert server if none serving it answers at its URL; never"
            + _d("serve")
            + ".",
        ),
    ] = None,
    expert_calibration: Annotated[
        str | None,
        typer.Option(
            "--expert-calibration",
            help="Recalibrate the expert's P(high): none, contextual (divide out its answer to "
            "content-free inputs) or dev (a logit shift fitted on the dev split)"
            + _d("expert_calibration")
            + ".",
        ),
    ] = None,
    dv_target: Annotated[
        str | None,
        typer.Option("--dv-target", help=f"{', '.join(DV_TARGET_CHOICES)}" + _d("dv_target") + "."),
    ] = None,
    budgets: Annotated[
        str | None,
        typer.Option("--budgets", help="Target budgets, list or START:STOP:COUNT" + _d("budgets") + "."),
    ] = None,
    batch_sizes: Annotated[
        str | None, typer.Option("--batch-sizes", help="Batch sizes" + _d("batch_sizes") + ".")
    ] = None,
    delta: Annotated[
        float | None, typer.Option("--delta", help="LTT error level delta" + _d("delta") + ".")
    ] = None,
    objectives: Annotated[
        str | None,
        typer.Option(
            "--objectives",
            help=f"Selection objectives: {','.join(calibrate.OBJECTIVES)}" + _d("objectives") + ".",
        ),
    ] = None,
    merge_controls: Annotated[
        bool | None,
        typer.Option(
            "--merge-controls/--no-merge-controls",
            help="Also sweep all-overwrite and all-average"
            + (" [--merge-controls]." if _DEFAULTS.merge_controls else " [--no-merge-controls]."),
        ),
    ] = None,
    trials: Annotated[
        int | None, typer.Option("--trials", help="Random splits for validation" + _d("trials") + ".")
    ] = None,
    performance_alphas: Annotated[
        str | None,
        typer.Option(
            "--performance-alphas",
            help="Error levels at which performance control is validated" + _d("performance_alphas") + ".",
        ),
    ] = None,
    budget_alpha: Annotated[
        float | None,
        typer.Option(
            "--budget-alpha",
            help="Budget whose per-trial histogram the report draws (every budget is validated)"
            + _d("budget_alpha")
            + ".",
        ),
    ] = None,
    performance_alpha: Annotated[
        float | None,
        typer.Option(
            "--performance-alpha",
            help=(
                "Error level (minimum accuracy 1 - alpha) whose performance control the summary shows "
                "and whose per-trial histogram the report draws [the smallest level of "
                f"--performance-alphas at which CTD returns a policy in at least {MIN_SELECTION:.0%} of "
                "the validation trials]."
            ),
        ),
    ] = None,
    pvalue: Annotated[
        str | None,
        typer.Option(
            "--pvalue",
            help="LTT p-value: binomial (exact, the paper's text) or hb (Hoeffding-Bentkus)"
            + _d("pvalue")
            + ".",
        ),
    ] = None,
    max_failed: Annotated[
        float | None,
        typer.Option(
            "--max-failed",
            help="Stop before calibration when over this fraction of a split failed at the expert"
            + _d("max_failed")
            + ".",
        ),
    ] = None,
    cost_limit: CostLimitOption = None,
    runs_dir: Annotated[
        Path | None, typer.Option("--runs-dir", help="Runs root (default: $CTD_RUNS_DIR or ./runs).")
    ] = None,
    retry_failed: Annotated[
        bool,
        typer.Option(
            "--retry-failed",
            help="Ask the experts again (a cascade's later ones too) for the examples they failed "
            "on, and for those whose answers left the cache since (`ctd cache forget`).",
        ),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as one JSON object.")] = False,
) -> None:
    """Run every stage (probe, query, dv, calibrate, validate, report) in runs/NAME, resumably."""
    overrides: dict[str, Any] = {
        "name": name,
        "data": tuple(data) if data else None,
        "limit": limit,
        "model": model,
        "revision": revision,
        "layer": layer,
        "max_tokens": max_tokens,
        "batch_tokens": batch_tokens,
        "device_map": device_map,
        "archs": parse_names(arch, "--arch", ARCHS) if arch else None,
        "seeds": parse_seeds(seeds, "--seeds") if seeds else None,
        "epochs": epochs,
        "expert": _first_expert(expert),
        "cascade": _later_experts(expert),
        "expert_model": expert_model,
        "serve": serve,
        "expert_calibration": expert_calibration,
        "dv_target": dv_target,
        "budgets": parse_floats(budgets, "--budgets") if budgets else None,
        "batch_sizes": parse_ints(batch_sizes, "--batch-sizes") if batch_sizes else None,
        "delta": delta,
        "objectives": parse_names(objectives, "--objectives", calibrate.OBJECTIVES) if objectives else None,
        "merge_controls": merge_controls,
        "trials": trials,
        "performance_alphas": (
            parse_floats(performance_alphas, "--performance-alphas") if performance_alphas else None
        ),
        "budget_alpha": budget_alpha,
        "performance_alpha": performance_alpha,
        "pvalue": pvalue,
        "max_failed": max_failed,
        "cost_limit": cost_limit,
    }
    run_config = load_run_config(config, overrides)
    check_roots(runs_dir)  # before the run's imports: a mistyped path is told at once
    # One console for the stage lines and the bars: a line printed while the bars are up goes
    # above them and stays on the screen.
    display = StageProgress(stderr, enabled=not json_out)

    def announce(outcome: StageOutcome) -> None:
        if not json_out:
            verb = (
                "skipped (up to date)"
                if outcome.status is StageStatus.SKIPPED
                else f"done in {took(outcome.seconds)}"
            )
            shown = outcome.detail and outcome.status is not StageStatus.SKIPPED  # its detail is the verb
            detail = f": {escape(outcome.detail)}" if shown else ""
            display.print(f"{display.counter(outcome.stage)}[bold]{outcome.stage}[/bold] {verb}{detail}")

    try:
        with display:
            # In a terminal, a line at once: the imports and checks before the first stage take
            # seconds (the status row is removed again when a check refuses the run).
            display.status(f"ctd eval {run_config.run_name}: checking the data, the model and the expert")
            # torch, the expert engine and matplotlib load only when a run starts
            from .._eval import run_eval

            result = run_eval(
                run_config,
                runs_root=runs_dir,
                display=display,
                on_stage=announce,
                retry_failed=retry_failed,
            )
    except KeyboardInterrupt:
        print("error: interrupted; rerun the same command to resume", file=sys.stderr)
        raise typer.Exit(code=130) from None
    if json_out:
        print_json(
            {
                "run": str(result.run_dir),
                "report": str(result.report),
                "stages": [o.__dict__ for o in result.stages],
                "summary": [row.cells() for row in result.summary],  # as the CSV holds them
                "warnings": result.warnings,
            }
        )
        return
    _print_summary(result.summary)
    _print_warnings(result.warnings)
    print(f"report: {result.report}")


def _print_warnings(warnings: list[str]) -> None:
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)


def _print_summary(rows: Sequence[SummaryRow]) -> None:
    """The report's summary tables, as report.md shows them: a row per metric, a column per budget
    (or per selector)."""
    from ..report import summary_tables

    tables = summary_tables(rows)
    if tables:
        shown_in = RunLayout(Path()).report.markdown.name
        stdout.print(f"summary: means over seeds, as {shown_in}'s Summary shows them")
    for found in tables:
        # No outer border: the summary and every stage line above it fit one screen.
        table = Table(title=escape(found.title), title_justify="left", box=box.HEAVY_HEAD, show_edge=False)
        table.add_column("metric")
        for column in found.columns:
            table.add_column(escape(column), justify="right")
        for metric, cells in found.rows:
            table.add_row(escape(metric), *cells)
        stdout.print(table)


def report_command(
    name: Annotated[
        str, typer.Argument(help="Run name (a folder under the runs root) or a run folder path.")
    ],
    *,
    runs_dir: Annotated[
        Path | None, typer.Option("--runs-dir", help="Runs root (default: $CTD_RUNS_DIR or ./runs).")
    ] = None,
) -> None:
    """Rebuild the report of a finished run from its files, recomputing nothing."""
    from .._eval import read_summary
    from ..report import build_report, read_warnings

    folder = Path(name)
    if not RunLayout(folder).scores.is_file():
        folder = Roots.resolve(runs_dir).run(name).root
    if not folder.is_dir():
        raise no_run_folder(name, folder)
    path = build_report(folder)
    _print_summary(read_summary(RunLayout(folder).report.summary_table))
    _print_warnings(read_warnings(folder))
    print(f"report: {path}")


def register(app: typer.Typer) -> None:
    app.command("eval", help=EVAL_HELP)(clean_errors(eval_command))
    app.command("report")(clean_errors(report_command))


def _first_expert(expert: str | None) -> str | None:
    """--expert small,large: the first stage's expert (a URL or a name)."""
    if expert is None:
        return None
    first = expert.split(",")[0].strip()
    if "," in expert and not first:
        raise InputError(f"--expert {expert!r}: an empty name between commas")
    return first


def _later_experts(expert: str | None) -> tuple[str, ...] | None:
    """--expert small,large: the cascade's later experts; None: the option names one (a config
    file's `cascade` stands)."""
    if expert is None or "," not in expert:
        return None
    later = tuple(part.strip() for part in expert.split(",")[1:])
    if not all(later):
        raise InputError(f"--expert {expert!r}: an empty name between commas")
    return later
