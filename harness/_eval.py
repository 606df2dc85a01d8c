"""`ctd eval` as a library call: probe -> query -> dv -> calibrate -> validate -> report, resumable.

The stages are listed here, in order, with no registry. The run folder's layout is in
`harness.run.RunLayout`; what a rerun may skip is decided by `harness.run.Manifests`.
Extraction resumes from the shared activation store and the expert stage from its SQLite cache,
so an interrupted run pays for no expert answer twice.
"""

from __future__ import annotations

import gc
import math
import os
import shutil
import sys
from collections.abc import Callable
from contextlib import closing, suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from rich.markup import escape

import calibrate
import experts
from probes import ModelInfo, ProbeError, describe_model, resolve_layer

from ._errors import InputError
from .data import DataSplits, atomic_path, load_data, read_table
from .expert import ResolvedExpert
from .report import SUMMARY_COLUMNS, SummaryRow, figure_workers, read_warnings
from .run import (
    Manifests,
    Roots,
    RunConfig,
    RunContext,
    RunLayout,
    RunLog,
    Stage,
    StageOutcome,
    StageProgress,
    StageStatus,
    Together,
    check_roots,
    one_invocation,
    run_stages,
)
from .stages import (
    CalibrateStage,
    CascadeStage,
    DVStage,
    ProbeStage,
    QueryStage,
    ReportStage,
    ValidateStage,
    preflight_cache,
    probe_stage,
    refuse_uncounted_limit,
)

__all__ = ["EvalResult", "read_summary", "run_eval"]


@dataclass(frozen=True)
class EvalResult:
    run_dir: Path
    report: Path
    stages: tuple[StageOutcome, ...]
    summary: tuple[SummaryRow, ...] = ()  # report/tables/summary.csv
    warnings: list[str] = field(default_factory=list)  # the report's (degenerate scorers)


@dataclass(frozen=True)
class _Prepared:
    data: DataSplits
    expert: ResolvedExpert
    model: ModelInfo
    roots: Roots
    layout: RunLayout


def _prepare(config: RunConfig, runs_root: Path | None) -> _Prepared:
    """Every check that needs no weights and no expert call: the shared places (runs root, store,
    caches), data spec, expert, model and layer, budgets against the test split's size."""
    check_roots(runs_root)
    config.probe_settings  # noqa: B018  (its checks: --arch, --max-tokens/--batch-tokens, --seeds)
    data = load_data(list(config.data) if config.data else None, limit=config.limit)
    expert = config.expert_settings.resolve()
    refuse_uncounted_limit(expert.spec, config.cost_limit)
    for later in config.cascade:  # a typo in a later expert is told now, not after hours of work
        spec = replace(config, expert=later, expert_model=None, cascade=()).expert_settings.resolve().spec
        refuse_uncounted_limit(spec, config.cost_limit)
    try:
        model = describe_model(config.model, revision=config.revision)
        resolve_layer(config.layer, model.n_layers, model.config)
    except ProbeError as error:
        raise InputError(str(error)) from None
    n_cal = calibrate.split_sizes(len(data.test))[1]  # D_cal of a calibration half (SPEC section 4)
    size = calibrate.calibration_size(n_cal, min(config.budgets), config.delta)
    if not size.enough:
        raise InputError(_budgets_too_small(config, len(data.test), size))
    roots = Roots.resolve(runs_root)
    roots = Roots(runs=roots.runs, store=roots.store.resolve(), cache=roots.cache.resolve())
    return _Prepared(data, expert, model, roots, roots.run(config.run_name))


def _budgets_too_small(config: RunConfig, n_test: int, size: calibrate.CalibrationSize) -> str:
    """The refusal of the smallest budget (`size`: D_cal against it), naming the budgets that would
    work: with n_cal rows, zero losses certify exactly the budgets at or above
    `calibrate.min_certifiable_level`."""
    budget, need, n_cal = size.alpha, size.need, size.n
    n_needed = n_test
    while calibrate.split_sizes(n_needed)[1] < need:
        n_needed += 1
    # The defaults are named as such: a user who never typed --budgets is not told of one.
    named = f"--budgets {budget:g}"
    if config.budgets == calibrate.DEFAULT_BUDGETS:
        named = f"budget {budget:g} of the default --budgets"
    head = (
        f"{named}: the test split has {n_test} examples, so D_cal holds {n_cal}; "
        f"certifying budget {budget:g} at delta {config.delta:g} needs at least {need} (a test split "
        f"of {n_needed} examples)"
    )
    low = size.lowest_level()
    if low is None:
        return head + "; no budget can be certified without calibration rows"
    workable = [b for b in config.budgets if calibrate.calibration_size(n_cal, b, config.delta).enough]
    if workable:
        advice = f"pass --budgets {','.join(f'{b:g}' for b in workable)} (those asked for that can)"
    else:
        first = math.ceil(low * 100) / 100  # the smallest two-decimal budget at or above the level
        advice = f"none of those asked for can; pass budgets of {first:g} or more"
    return head + f". With {n_cal} rows only budgets of {low:.3f} or more can be certified: {advice}"


def run_eval(
    config: RunConfig,
    *,
    runs_root: Path | None = None,
    display: StageProgress | None = None,
    on_stage: Callable[[StageOutcome], None] | None = None,
    retry_failed: bool = False,
    overlap: bool = True,
) -> EvalResult:
    """Run (or resume) every stage of `config` in its run folder and return what happened.
    `display` draws the stages' progress (None: nothing is shown); `on_stage` is called after
    each stage, while the display is still up, so a line it prints through `display.print` stays
    above the bars. `retry_failed` reruns the stages that ask experts (query, cascade) when they
    recorded failures or answers they had left the cache since (`ctd cache forget`); answers in
    the cache are not asked again. `overlap` False runs the query stage
    after the probe stage rather than beside it. When the probe stage is to run, torch and
    transformers are imported first and what the process holds then is frozen (`gc.freeze`: out
    of the cyclic collector's later scans, for the life of the process)."""
    prepared = _prepare(config, runs_root)
    expert, layout = prepared.expert, prepared.layout
    progress = display or StageProgress(enabled=False)
    ctx = RunContext(
        config=config,
        roots=prepared.roots,
        layout=layout,
        manifests=Manifests(layout),
        data=prepared.data,
        expert=expert,
        model=prepared.model,
        progress=progress,
    )
    if _launched_worker():
        # Under `accelerate launch`, the other processes extract their share of the activations
        # and stop; the main process runs every stage.
        probe_stage(ctx.data, ProbeStage.settings(ctx), layout.probe.root, store_root=ctx.roots.store)
        return EvalResult(layout.root, layout.report.markdown, ())
    RunLog.read(layout.run_log)  # before anything is written (the lock's file too): it may refuse the file
    # One invocation of a run at a time: each rewrites run.json and the manifests whole.
    with one_invocation(layout):
        return _run_stages(ctx, on_stage=on_stage, retry_failed=retry_failed, overlap=overlap)


def _run_stages(
    ctx: RunContext,
    *,
    on_stage: Callable[[StageOutcome], None] | None,
    retry_failed: bool,
    overlap: bool,
) -> EvalResult:
    """`run_eval`'s work once this invocation holds the run: plan the stages and run them."""
    config, layout, expert, progress = ctx.config, ctx.layout, ctx.expert, ctx.progress
    run_log = RunLog.read(layout.run_log)  # as it is now that this invocation holds the run
    ctx.costs.before = sum(run_log.costs().values())  # --cost-limit holds for the run, across resumes

    def record_spending(stage: str, usd: float) -> None:
        """The running stage's dollars so far into run.json (its record says "running")."""
        run_log.record(stage, StageStatus.RUNNING, None, "", usd)
        with suppress(OSError):  # the disk's error, if any, is met where the stage writes
            run_log.write(layout.run_log)

    ctx.costs.record = record_spending
    manifests = ctx.manifests
    if not config.cascade and layout.cascade.root.is_dir():
        # Back to one expert: the earlier cascade's tables (made again from the cache, should
        # it come back) are no part of this run, and the report and `ctd calibrate` would read them.
        shutil.rmtree(layout.cascade.root)
        manifests.invalidate(CascadeStage.name)
    data = ctx.data
    manifests.log(
        f"ctd eval {config.run_name}: {len(data.train)} train, {len(data.dev)} dev, {len(data.test)} test"
    )
    later = CascadeStage(ctx) if config.cascade else None
    query = _query_stage(ctx, later, retry_failed=retry_failed)
    # The expert is asked while the probe stage works: they need nothing of each other, and the
    # one waits on the network while the other computes. Only for an expert this run will not
    # serve (by URL, or --serve never): a server the run starts, now or when one goes away
    # mid-stage, takes the cores a CPU's extraction uses, and vLLM sizes its share of the GPU's
    # memory from what is free as it starts (the query stage frees the probe stage's cache for it).
    # Nor beside a llama.cpp server (it computes on those cores), nor when every answer is cached:
    # the stage then takes a moment, unless answers left the cache since, and it may start one.
    local = query.start_server or query.may_serve or expert.spec.server == "llama.cpp"
    beside = overlap and query.checked and not local
    probe = ProbeStage(ctx)
    if not (manifests.up_to_date(probe.name, probe.fingerprint()[0]) and probe.reusable()):
        # torch and transformers are imported before the stages (before the expert is asked,
        # when it is asked beside the probe stage), signals held: inside their imports a
        # KeyboardInterrupt aborts the process, and a stop held while the query stage works
        # would not reach it.
        progress.status("importing torch and transformers")
        with experts.signals_held():
            _import_model_stack()
    first: list[Stage | Together] = [Together((probe, query))] if beside else [probe, query]
    # The report's figure workers start with the calibrate stage: their import of matplotlib
    # (most of a second each) then overlaps calibration and validation, not the report.
    figures = figure_workers()

    def stage_started(stage: str) -> None:
        progress.stage_started(stage)
        if stage == CalibrateStage.name:
            with suppress(OSError):  # no process to spare now: the report starts its own
                figures.start()

    stages: list[Stage | Together] = [
        *first,
        DVStage(ctx),
        # Later experts of a cascade: a run of one expert has no such stage and is as it was.
        *([later] if later is not None else []),
        CalibrateStage(ctx),
        ValidateStage(ctx),
        ReportStage(ctx, figures),
    ]
    # Written only now that the options passed every check, so a mistyped rerun leaves it alone.
    with atomic_path(layout.config) as tmp:
        tmp.write_text(config.to_toml(), encoding="utf-8")
    run_log.started(asdict(config))
    with progress, closing(figures):  # the workers go, however the run ends
        names = [s.name for item in stages for s in (item.stages if isinstance(item, Together) else (item,))]
        header = f"ctd eval {config.run_name}: {len(names)} stages ({', '.join(names)}) in {layout.root}"
        progress.plan(header, names)
        outcomes = run_stages(
            stages,
            manifests,
            run_log,
            on_start=stage_started,
            on_stage=on_stage,
            on_failed=lambda stage, error: progress.print(
                escape(
                    f"{stage} failed: {error}; the stage beside it goes on to its end, so its work is kept"
                )
            ),
            spent=ctx.costs.spent,
        )
    return EvalResult(
        layout.root,
        layout.report.markdown,
        outcomes,
        read_summary(layout.report.summary_table),
        read_warnings(layout.root),
    )


def _query_stage(ctx: RunContext, later: CascadeStage | None, *, retry_failed: bool) -> QueryStage:
    """The query stage as this invocation runs it. The endpoint is checked once per run, before
    the first expensive stage, and only if the query stage will ask it something: with every
    answer in the cache the expert may be down."""
    manifests, expert = ctx.manifests, ctx.expert
    query = QueryStage(ctx)
    for asking in (query, later):
        if retry_failed and asking is not None and _asks_again(manifests, asking):
            manifests.invalidate(asking.name)
    if manifests.up_to_date("query", query.fingerprint()[0]):
        return query
    # A damaged, full or read-only cache costs no request.
    items = query.asked_items()
    missing = preflight_cache(ctx.roots.cache, expert.spec, items)
    may_serve = ctx.config.expert_settings.serve == "auto" and expert.spec.server != "external"
    if missing:
        return QueryStage(ctx, start_server=expert.preflight(serve=may_serve), may_serve=may_serve)
    manifests.log(f"query: all {len(items)} answers are in the cache; the expert is not needed")
    return QueryStage(ctx, may_serve=may_serve, checked=False)


def _asks_again(manifests: Manifests, stage: QueryStage | CascadeStage) -> bool:
    """Whether `--retry-failed` reruns a stage that asks experts (the query stage, the cascade's
    later experts): it recorded failures, or answers it had left the cache since (`ctd cache
    forget`). A stage not up to date runs anyway."""
    manifest = manifests.read(stage.name)
    try:
        if not manifest or not manifests.up_to_date(stage.name, stage.fingerprint()[0]):
            return False
    except OSError:  # an input of its fingerprint is gone: the stages before make it again
        return False
    if manifest.get("failed", 0):
        return True
    missing = stage.left_the_cache()
    if missing:
        manifests.log(f"{stage.name}: {missing} of its answers left the cache since it ran: asked again")
    return missing > 0


def _import_model_stack() -> None:
    """Import torch and transformers' model code with the cyclic garbage collector paused, then
    freeze what is loaded (`gc.freeze`). The import makes about 400,000 objects that live as long
    as the process, and each full collection scans every tracked object: six of them during the
    import, later ones and the interpreter's exit took about 2.4 s of a 64-row `ctd eval` on a
    2-core machine (issue 25, docs/benchmarks.md). Garbage made before is collected first, so that
    freezing keeps none of it; a process that has the model stack already (a second run in a
    notebook) is left as it is."""
    if "transformers.modeling_utils" in sys.modules:
        return
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        import transformers.modeling_utils  # noqa: F401

        gc.freeze()
    finally:
        if was_enabled:
            gc.enable()


def _launched_worker() -> bool:
    """A process of `accelerate launch` or `torchrun` other than the main one. Only a launch of
    several processes sets WORLD_SIZE above 1, so a lone run (every rerun that skips the probe
    stage) asks accelerate nothing and does not import torch."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    from probes import process_state  # accelerate, and with it torch

    return not process_state().is_main_process


def read_summary(path: Path) -> tuple[SummaryRow, ...]:
    """The rows of a report's summary table (report/tables/summary.csv); none when it is absent.
    A table with other columns (another version's) or a bad cell is one InputError line."""
    if not path.is_file():
        return ()
    table = read_table(path)
    if tuple(table.columns) != SUMMARY_COLUMNS:
        raise InputError(
            f"{path}: columns {', '.join(table.columns)}; expected {', '.join(SUMMARY_COLUMNS)} "
            "(written by another version: rebuild it with `ctd report`)"
        )
    return tuple(
        SummaryRow.from_cells(
            {name: str(cells[i]) for name, cells in table.columns.items()}, f"{path}: {table.where(i)}"
        )
        for i in range(len(table))
    )
