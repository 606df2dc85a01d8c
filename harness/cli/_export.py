"""`ctd export inspect`: a finished run as inspect_ai `.eval` logs, for inspect's log viewer."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ..export import SAMPLES_PER_LOG
from ..run import Roots, RunLayout
from ._common import clean_errors, no_run_folder, parse_floats

__all__ = ["register"]

export_app = typer.Typer(
    help="Write a finished run in another tool's format: inspect (inspect_ai's .eval logs).",
    no_args_is_help=True,
)


def _run_folder(name: str, runs_dir: Path | None) -> Path:
    """A run named as `ctd report` takes it: a run folder path, or a name under the runs root."""
    folder = Path(name)
    if RunLayout(folder).run_log.is_file() or RunLayout(folder).scores.is_file():
        return folder
    under_root = Roots.resolve(runs_dir).run(name).root
    if under_root.is_dir():
        return under_root
    if folder.is_dir():
        return folder  # not a run folder: the export says what it lacks
    raise no_run_folder(name, under_root)


@export_app.command("inspect")
@clean_errors
def inspect_command(
    name: Annotated[
        str, typer.Argument(help="Run name (a folder under the runs root) or a run folder path.")
    ],
    *,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help=(
                "A FILE.eval for a run of one probe configuration, a folder (ARCH.eval each) for a run of "
                "several (parts: FILE.partK-of-N.eval beside it). Default: RUN/inspect/ARCH.eval."
            ),
        ),
    ] = None,
    budgets: Annotated[
        str | None,
        typer.Option(
            "--budgets",
            help="Export the cascades at these budgets of the run's sweep only (default: every budget).",
        ),
    ] = None,
    samples_per_log: Annotated[
        int,
        typer.Option(
            "--samples-per-log",
            help=(
                "A configuration with more samples (test examples x seeds) is written in parts, "
                "ARCH.partK-of-N.eval, of about this many, by one process per CPU: inspect's writer "
                "slows with the square of a log's samples."
            ),
        ),
    ] = SAMPLES_PER_LOG,
    force: Annotated[
        bool,
        typer.Option("--force", help="Replace logs that are already there (an earlier export's parts too)."),
    ] = False,
    runs_dir: Annotated[
        Path | None, typer.Option("--runs-dir", help="Runs root (default: $CTD_RUNS_DIR or ./runs).")
    ] = None,
) -> None:
    """One inspect_ai log per probe configuration (in parts above --samples-per-log samples): a
    sample per test example (an epoch per probe seed) with the probe's, the expert's and each
    cascade's score, and the run's headline numbers as the log's results. Open them with
    `inspect view start --log-dir FOLDER`. Needs the inspect extra: pip install -e '.[inspect]'."""
    from ..export import export_inspect

    chosen = parse_floats(budgets, "--budgets") if budgets is not None else None
    folder = _run_folder(name, runs_dir)

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    written = export_inspect(
        folder, out, force=force, budgets=chosen, progress=progress, samples_per_log=samples_per_log
    )
    for path in written:
        print(path)


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
