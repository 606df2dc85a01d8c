"""`ctd report`: tables and figures for a finished run folder, file -> file.

Reads (run folder layout):

    scores.parquet                          the SPEC section 2 scores table        (required)
    calibrate/<arch>/                       calibrate_scores output per arch        (required)
        sweep.csv, baselines.csv, summary.json (SweepConfig, DV quality), groups.csv (optional)
    calibrate/<arch>/merge-{overwrite,average}/   the score-merging controls        (optional)
    validate/<arch>/{budget-pareto,budget-ltt,performance}.json                     (optional)
        one record per level (harness.run._validation), the per-trial table <name>.parquet beside it
    validate/<arch>/joint.json, joint.parquet   joint control (budget and error together)  (optional)
    cascade/scores.parquet, validate/cascade/<arch>.json     a cascade of experts   (optional)
    config.toml                             the resolved run config                 (optional)

The report reads the numbers the stages wrote and re-runs none of them (no sweep, no
validation); from the scores table it only ranks rows for the mean-v-at-top-k curves. Budgets are
read at exact points of a sweep's grid: the summary's are the budgets the run asked for (or
0.1/0.2/0.3 of the default grid); a fixed budget (the group table's, the binary comparison's)
that the grid lacks shows — and says so.

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

from .._errors import InputError
from .._workers import WorkerPool
from ..data import atomic_path, exchange_folders, read_scores, staging_folder, write_json
from ..run import RunLayout
from ._cascade_experts import cascade_experts_section
from ._checks import checks_section
from ._context import ReportContext, figure_workers
from ._costs import cost_section
from ._data import read_config_text, read_sweep
from ._examples import case_study_section, examples_table
from ._expert_answers import expert_answers_section
from ._expert_calibration import expert_calibration_section
from ._sections import (
    binary_section,
    cascade_section,
    dv_quality_section,
    group_section,
    mean_value_section,
    merge_section,
    realised_section,
)
from ._summary import summary_lines
from ._validation import validation_section

__all__ = ["build_report"]

# The report's sections, in order; the summary is built after them and placed first.
SECTIONS: tuple[Callable[[ReportContext], None], ...] = (
    cascade_section,
    realised_section,
    validation_section,
    cascade_experts_section,  # a run with later experts only
    group_section,
    dv_quality_section,
    mean_value_section,
    case_study_section,
    examples_table,
    binary_section,
    merge_section,
)


def build_report(
    run_dir: Path, *, progress: Callable[[str], None] | None = None, figures: WorkerPool | None = None
) -> Path:
    """Write run_dir/report/ for a finished run and return the path of report/report.md.

    A missing scores.parquet or calibrate/<arch>/ sweep is an InputError naming the file; a
    missing optional input (validation, merge controls, binary DV, config) is said in its
    section and listed under "missing" in numbers.json.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such run folder")
    with staging_folder(run_dir, ".report.") as staging:
        ctx = _load(run_dir, staging, progress or (lambda _message: None), figures)
        try:
            _title(ctx)
            summary_at = len(ctx.lines)
            _config(ctx)
            expert_answers_section(ctx)
            cost_section(ctx)
            checks_section(ctx)
            expert_calibration_section(ctx)
            for section in SECTIONS:
                section(ctx)
            # The summary reads what the sections found (validation rates, warnings), so it is
            # built last; it is placed first, right under the title.
            ctx.lines[summary_at:summary_at] = summary_lines(ctx)
            for arch, rows in ctx.curve_rows.items():
                ctx.table(ctx.files.table(arch, "curves"), rows)
            ctx.progress("drawing the figures")
            ctx.figures.wait()
            numbers = ctx.numbers | {"missing": ctx.missing, "warnings": ctx.warnings}
            write_json(ctx.files.numbers, numbers)
            with atomic_path(ctx.files.markdown) as tmp:
                tmp.write_text("\n".join(ctx.lines).rstrip() + "\n", encoding="utf-8")
            ctx.progress("publishing report/")
            _publish(ctx.out, RunLayout(run_dir).report.root)
        except BaseException:
            ctx.figures.close()  # no figure may land in the staging folder after it is removed
            raise
    return RunLayout(run_dir).report.markdown


def _load(
    run_dir: Path, staging: Path, progress: Callable[[str], None], figures: WorkerPool | None
) -> ReportContext:
    """Read the required inputs (every error here is an InputError naming the file)."""
    scores_path = RunLayout(run_dir).scores
    if not scores_path.is_file():
        raise InputError(f"{scores_path}: no such file (the report needs the run's scores table)")
    progress(f"reading {scores_path}")
    table = read_scores(scores_path)
    by_arch = {arch: table.test_scores(arch) for arch in table.archs}
    sweeps = {arch: read_sweep(RunLayout(run_dir).sweep(arch).root) for arch in table.archs}
    workers = figures or figure_workers()  # started ahead by `ctd eval`, or new ones
    return ReportContext(run_dir, staging, table, by_arch, sweeps, progress, figures=workers)


def _publish(staging: Path, final: Path) -> None:
    """Rename the finished staging folder to report/, replacing any previous report: in one atomic
    exchange where the system can (a reader sees the old report or the new one, never none), the
    old one left at the staging path and removed (by the next report's staging, if this process is
    killed first); else by two renames."""
    # A report/ that is a link or a file is left to the two renames, which refuse it, as before.
    if final.is_dir() and not final.is_symlink() and exchange_folders(staging, final):
        shutil.rmtree(staging, ignore_errors=True)
        return
    old = None
    if final.exists():
        # Not ".report.": the next report's staging would clear it as a dead writer's folder.
        old = Path(tempfile.mkdtemp(prefix=".old-report.", dir=final.parent))
        os.replace(final, old)  # onto an empty folder: allowed by rename(2)
    os.replace(staging, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _title(ctx: ReportContext) -> None:
    seeds = sorted({s for by_seed in ctx.by_arch.values() for s in by_seed})
    ctx.numbers |= {"run": ctx.run_dir.name, "seeds": seeds, "archs": {arch: {} for arch in ctx.by_arch}}
    ctx.lines += [
        f"# CTD report: {ctx.run_dir.name}",
        "",
        f"Probe configurations: {', '.join(ctx.by_arch)}; probe seeds: {', '.join(map(str, seeds))}. "
        "Curves and bands show the mean and one (population) standard deviation over seeds unless a "
        f"caption says otherwise. Every number in the tables is also in `{ctx.files.numbers.name}`; "
        "the run's configuration and any warnings follow the summary.",
        "",
    ]


def _config(ctx: ReportContext) -> None:
    path = RunLayout(ctx.run_dir).config
    text = read_config_text(path)
    ctx.lines += ["## Configuration", ""]
    if text is None:
        ctx.lines += [f"No {path.name} in the run folder.", ""]
    else:
        ctx.lines += [f"<details><summary>{path.name}</summary>", "", "```toml", text.rstrip(), "```", ""]
        ctx.lines += ["</details>", ""]
