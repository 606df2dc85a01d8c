"""`ctd eval`: probe -> query -> dv -> calibrate -> validate -> report, resumable.

A run folder `runs/NAME/` holds:
    config.toml            the resolved configuration
    run.json               the run log: versions, and each stage's status, time and detail
    manifests/STAGE.json   the stage's fingerprint (its settings and the hashes of its inputs) and
                           the hashes of its outputs; written only when the stage has finished
    probe/ query/ dv/      stage outputs; scores.parquet (SPEC section 2) at the top
    calibrate/ARCH/ validate/ARCH/ report/
    log.txt                what ran, what was skipped and why, with times

A stage is skipped when its manifest's fingerprint equals the one computed now and every output
it recorded still has the recorded hash. Nothing else is trusted, so a changed option, a changed
input file or a deleted output reruns exactly the stages that depend on it. An interrupted stage
has no manifest and runs again; extraction resumes from the activation store and the expert
stage from its SQLite cache, so no expert answer is paid for twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

import calibrate
import experts
from calibrate import SweepConfig
from experts import ConfigError, ExpertSpec
from probes import ModelInfo, ProbeConfig, ProbeError, describe_model, process_state, resolve_layer

from .._errors import InputError, RunFailed, check_failed_fraction
from ..data._dataspec import DataSplits, load_data
from ..data._scores import read_scores, write_scores
from ..data._tables import atomic_path, read_json, read_table, write_json, write_table
from ..stages._calibrate import calibrate_scores, default_runs_root
from ..stages._dv import dv_stage
from ..stages._probe import ProbeSettings, probe_stage
from ..stages._query import check_expert, score_items
from ..stages._validate import JOBS, run_job
from ._config import RunConfig
from ._progress import StageProgress

__all__ = ["STAGES", "EvalResult", "StageOutcome", "run_eval"]

STAGES: tuple[str, ...] = ("probe", "query", "dv", "calibrate", "validate", "report")
RUN_LOG_VERSION = 1


@dataclass(frozen=True)
class StageOutcome:
    stage: str
    status: str  # "ran" or "skipped"
    seconds: float
    detail: str = ""


@dataclass(frozen=True)
class EvalResult:
    run_dir: Path
    report: Path
    stages: tuple[StageOutcome, ...]
    summary: list[dict[str, str]] = field(default_factory=list)  # report/tables/summary.csv rows


# ---------------------------------------------------------------------------------------------
# hashing and manifests


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _outputs(run_dir: Path, paths: list[Path]) -> dict[str, str]:
    """Relative path -> sha256 of every file under `paths` (files or folders)."""
    out: dict[str, str] = {}
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if not file.name.startswith("."):
                out[str(file.relative_to(run_dir))] = file_sha256(file)
    return out


def _fingerprint(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


class RunFolder:
    """The run folder: manifests, the run log and the text log."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "manifests").mkdir(parents=True, exist_ok=True)

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def log(self, message: str) -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self.path("log.txt").open("a", encoding="utf-8") as handle:
            handle.write(f"{stamp} {message}\n")

    def manifest(self, stage: str) -> dict | None:
        path = self.path("manifests", f"{stage}.json")
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None

    def up_to_date(self, stage: str, fingerprint: str) -> bool:
        """The stage finished with this fingerprint and its outputs are unchanged."""
        manifest = self.manifest(stage)
        if not manifest or manifest.get("fingerprint") != fingerprint or manifest.get("status") != "done":
            return False
        for relative, digest in manifest.get("outputs", {}).items():
            path = self.path(relative)
            if not path.is_file() or file_sha256(path) != digest:
                return False
        return True

    def finish(self, stage: str, fingerprint: str, inputs: dict, outputs: list[Path], **extra: Any) -> None:
        manifest = {
            "stage": stage,
            "status": extra.pop("status", "done"),
            "fingerprint": fingerprint,
            "inputs": inputs,
            "outputs": _outputs(self.root, outputs),
            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
            **extra,
        }
        write_json(self.path("manifests", f"{stage}.json"), manifest)

    def invalidate(self, stage: str) -> None:
        self.path("manifests", f"{stage}.json").unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for package in ("ctd-harness", "numpy", "scipy", "torch", "transformers", "accelerate", "httpx"):
        with suppress(metadata.PackageNotFoundError):
            out[package] = metadata.version(package)
    return out


def _git_revision() -> str | None:
    head = Path(__file__).resolve().parents[1] / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            return (head.parent / ref[5:]).read_text().strip()
        return ref
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------
# the expert


def resolve_expert_spec(config: RunConfig) -> ExpertSpec:
    """--expert NAME (registered) or --expert URL with --expert-model."""
    try:
        if config.expert.startswith(("http://", "https://")):
            return experts.expert_from_url(config.expert, str(config.expert_model))
        return experts.resolve_expert(config.expert)
    except ConfigError as error:
        raise InputError(f"--expert {config.expert}: {error}") from None


def _expert_identity(spec: ExpertSpec) -> dict[str, Any]:
    """What decides the expert's answers (the cache key's fields), never the API key."""
    return {
        "name": spec.name,
        "endpoint": spec.endpoint_id(),
        "model": spec.model,
        "method": spec.method,
        "template": spec.template,
        "top_logprobs": spec.top_logprobs,
    }


def _local_server_needed(spec: ExpertSpec, config: RunConfig) -> bool:
    """A llama.cpp expert on loopback that is not answering yet: start it for the query stage."""
    return config.serve == "auto" and spec.server == "llama.cpp" and not check_expert(spec).ok


@contextmanager
def _expert_available(spec: ExpertSpec, config: RunConfig, run: RunFolder) -> Iterator[None]:
    if _local_server_needed(spec, config):
        run.log(f"starting a local llama.cpp server for {spec.name} at {spec.resolved_urls()[0]}")
        server = experts.LocalServer(spec, log=run.path("query", "server.log"))
        try:
            server.start()
        except ConfigError as error:
            raise InputError(f"--expert {spec.name}: the local server did not start: {error}") from None
        try:
            yield
        except experts.EndpointDown as error:
            assert server.process is not None
            code = server.process.poll()
            if code is None:
                raise
            raise experts.EndpointDown(
                f"the local server for {spec.name} exited with code {code} during the run "
                f"(its log: {server.log}); {error}"
            ) from None
        finally:
            server.stop()
            run.log(f"stopped the local server for {spec.name}")
    else:
        yield


def _preflight_expert(spec: ExpertSpec, config: RunConfig) -> None:
    """Before any expensive work: the expert answers, or it is a local server we can start."""
    if config.serve == "auto" and spec.server == "llama.cpp":
        try:
            experts.server_command(spec)
        except ConfigError as error:
            raise InputError(f"--expert {spec.name}: {error}") from None
        return
    report = check_expert(spec)
    if not report.ok:
        raise InputError(f"--expert {config.expert}: {report.problem}")


# ---------------------------------------------------------------------------------------------
# the stages


@dataclass
class _Context:
    config: RunConfig
    run: RunFolder
    data: DataSplits
    spec: ExpertSpec
    model: ModelInfo
    progress: Callable[[str, int, int], None]
    show_progress: bool
    store_root: Path
    cache_path: Path


def _probe_settings(config: RunConfig) -> ProbeSettings:
    return ProbeSettings(
        model=config.model,
        revision=config.revision,
        layer=config.layer,
        max_tokens=config.max_tokens,
        batch_tokens=config.batch_tokens,
        device_map=config.device_map,
        archs=config.archs,  # type: ignore[arg-type]
        seeds=config.seeds,
        training=ProbeConfig(epochs=config.epochs),
    )


def _probe_fingerprint(ctx: _Context) -> tuple[str, dict]:
    inputs = {f"data.{s}": ctx.data.content_hash(s) for s in ("train", "dev", "test")}
    settings = ctx.config.section("layer", "max_tokens", "batch_tokens", "archs", "seeds", "epochs")
    settings["model"] = ctx.model.identity  # the weights' identity (file hash, hub commit), not the name
    return _fingerprint({"inputs": inputs, "settings": settings}), inputs


def _stores_intact(run: RunFolder) -> bool:
    try:
        record = read_json(run.path("probe", "stores.json"))
    except InputError:
        return False
    return all((Path(s["folder"]) / "complete.json").is_file() for s in record["splits"].values())


def _run_probe(ctx: _Context) -> str:
    out = ctx.run.path("probe")
    try:
        result = probe_stage(
            ctx.data, _probe_settings(ctx.config), out, store_root=ctx.store_root, progress=ctx.progress
        )
    except ProbeError as error:
        raise InputError(str(error)) from None
    means = result.metrics["mean"]
    ext = result.metrics["extraction"]
    tokens = sum(e["tokens"] for e in ext.values())
    truncated = sum(e["truncated"] for e in ext.values())
    ctx.run.log(
        f"probe: layer {result.layer} of {result.metrics['n_layers']}, {tokens} tokens, "
        f"{truncated} conversations truncated to {ctx.config.max_tokens} tokens"
    )
    return "; ".join(
        f"{arch} test AUROC {m['test_auroc']:.3f}" for arch, m in means.items() if m["test_auroc"]
    )


def _query_fingerprint(ctx: _Context) -> tuple[str, dict]:
    inputs = {f"data.{s}": ctx.data.content_hash(s) for s in ("dev", "test")}
    return _fingerprint({"inputs": inputs, "expert": _expert_identity(ctx.spec)}), inputs


def _run_query(ctx: _Context) -> tuple[str, str]:
    examples = [*ctx.data.dev, *ctx.data.test]
    out = ctx.run.path("query", "expert_scores.parquet")
    out.parent.mkdir(parents=True, exist_ok=True)
    with _expert_available(ctx.spec, ctx.config, ctx.run):
        summary = score_items(
            [e.item() for e in examples],
            [e.label for e in examples],
            ctx.spec,
            out,
            cache_path=ctx.cache_path,
            check=True,
            progress=ctx.show_progress,
            extra={
                "split": np.array([e.split for e in examples]),
                "group": np.array([e.group for e in examples]),
            },
        )
    ctx.run.log(
        f"query: {summary.total} examples, {summary.cached} from the cache, {summary.scored} scored, "
        f"{summary.failed} failed {summary.failure_reasons or ''} in {summary.seconds:.1f} s"
    )
    detail = f"{summary.scored} scored, {summary.cached} cached, {summary.failed} failed"
    if summary.failed:
        detail += " (rerun with --retry-failed to ask again for those)"
    return detail, {"failed": summary.failed}


def _check_failures(ctx: _Context) -> None:
    """After the query stage (run or skipped): list the examples the expert failed on in
    query/failed.csv (they are left out of the scores table), and stop before the DV stage and
    calibration when more than --max-failed of a split failed: leaving many examples out can
    bias the calibration set."""
    table = read_table(ctx.run.path("query", "expert_scores.parquet")).columns
    failed = table["source"].astype(str) == "failed"
    listing = ctx.run.path("query", "failed.csv")
    write_table(listing, {k: table[k][failed].astype(str) for k in ("split", "group", "id", "reason")})
    for split in ("dev", "test"):
        rows = table["split"].astype(str) == split
        check_failed_fraction(
            int((rows & failed).sum()),
            int(rows.sum()),
            ctx.config.max_failed,
            what=f"the expert failed on {split} examples",
            remedy=(
                f"rerun with --retry-failed to ask again for those (their ids: {listing}), or raise "
                "--max-failed to go on without them"
            ),
        )


def _dv_fingerprint(ctx: _Context) -> tuple[str, dict]:
    inputs = {
        "probe_scores": file_sha256(ctx.run.path("probe", "probe_scores.parquet")),
        "stores": file_sha256(ctx.run.path("probe", "stores.json")),
        "expert_scores": _expert_scores_digest(ctx.run.path("query", "expert_scores.parquet")),
    }
    settings = ctx.config.section("dv_target", "epochs")
    return _fingerprint({"inputs": inputs, "settings": settings}), inputs


def _expert_scores(path: Path) -> dict[tuple[str, str], float]:
    """(split, id) -> expert P(y=1) (NaN where it failed): ids are unique within a split only."""
    table = read_table(path).columns
    keys = zip(table["split"], table["id"], strict=True)
    return {(str(s), str(i)): float(e) for (s, i), e in zip(keys, table["expert"], strict=True)}


def _expert_scores_digest(path: Path) -> str:
    """A hash of what the DV stage reads from the query table (split, id, expert), so that a rerun
    answered from the cache (its `source` column says "cache") does not look like new input."""
    scores = _expert_scores(path)
    return _fingerprint(sorted((s, i, repr(v)) for (s, i), v in scores.items()))


def _run_dv(ctx: _Context) -> str:
    expert = _expert_scores(ctx.run.path("query", "expert_scores.parquet"))
    training = ProbeConfig(epochs=ctx.config.epochs)
    out = ctx.run.path("scores.parquet")
    targets = ["continuous", "binary"] if ctx.config.dv_target == "both" else [ctx.config.dv_target]
    parts, metrics = [], {}
    for target in targets:
        path = ctx.run.path("dv", f"scores-{target}.parquet")
        path.parent.mkdir(parents=True, exist_ok=True)
        result = dv_stage(
            ctx.run.path("probe"), expert, path, target=target, training=training, progress=ctx.progress
        )
        metrics[target] = result.metrics
        columns = read_table(path).columns
        if target == "binary" and len(targets) == 2:  # the report reads "<arch>-binary" as the twin
            columns["arch"] = np.array([f"{a}-binary" for a in columns["arch"]])
        parts.append(columns)
    merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    write_json(ctx.run.path("dv", "dv_metrics.json"), metrics)
    write_scores(out, merged)
    read_scores(out)  # the contract holds
    first = metrics[targets[0]]
    return "; ".join(
        f"{arch} DV Spearman {m['test_spearman']:.3f}, MSE {m['test_mse']:.4f}"
        for arch, m in first["mean"].items()
    ) + (f"; {first['missing_expert']} left out (expert failed)" if first["missing_expert"] else "")


def _scores_fingerprint(ctx: _Context, *names: str) -> tuple[str, dict]:
    inputs = {"scores": file_sha256(ctx.run.path("scores.parquet"))}
    return _fingerprint({"inputs": inputs, "settings": ctx.config.section(*names)}), inputs


_CALIBRATE_SETTINGS = ("budgets", "batch_sizes", "delta", "objectives", "merge_controls", "pvalue")
_VALIDATE_SETTINGS = (
    "trials",
    "budgets",
    "budget_alpha",
    "performance_alphas",
    "performance_alpha",
    "delta",
    "pvalue",
)


def _archs(ctx: _Context) -> list[str]:
    return read_scores(ctx.run.path("scores.parquet")).archs


def _run_calibrate(ctx: _Context) -> str:
    shutil.rmtree(ctx.run.path("calibrate"), ignore_errors=True)  # no stale merge controls or archs
    merges = ["default", "overwrite", "average"] if ctx.config.merge_controls else ["default"]
    archs = _archs(ctx)
    total, done = len(archs) * len(merges), 0
    parts = []
    for arch in archs:
        for merge in merges:
            ctx.progress("calibrate sweeps", done, total)
            folder = (
                ctx.run.path("calibrate", arch)
                if merge == "default"
                else ctx.run.path("calibrate", arch, f"merge-{merge}")
            )
            sweep = SweepConfig(
                budgets=ctx.config.budgets,
                batch_sizes=ctx.config.batch_sizes,
                delta=ctx.config.delta,
                objectives=ctx.config.objectives,  # type: ignore[arg-type]
                merge=merge,  # type: ignore[arg-type]
                pvalue=ctx.config.pvalue,
            )
            summary = calibrate_scores(ctx.run.path("scores.parquet"), folder, sweep, arch=arch)
            done += 1
            if merge == "default":
                parts.append(f"{arch}: {summary['rows']} rows")
    ctx.progress("calibrate sweeps", total, total)
    return "; ".join(parts)


def _run_validate(ctx: _Context) -> str:
    config = ctx.config
    levels = {"budget": config.budgets, "performance": config.performance_alphas}
    headline = {"budget": config.budget_alpha, "performance": config.performance_alpha}
    archs = [a for a in _archs(ctx) if not a.endswith("-binary")]
    shutil.rmtree(ctx.run.path("validate"), ignore_errors=True)
    total, done, parts = len(archs) * len(JOBS), 0, []
    for arch in archs:
        folder = ctx.run.path("validate", arch)
        folder.mkdir(parents=True, exist_ok=True)
        for job in JOBS:
            ctx.progress("validate guarantees", done, total)
            record = run_job(
                ctx.run.path("scores.parquet"),
                folder,
                job,
                arch=arch,
                alphas=levels[job.mode],
                headline_alpha=headline[job.mode],
                delta=config.delta,
                trials=config.trials,
                pvalue=config.pvalue,
            )
            if "error" in record:
                ctx.run.log(f"validate {arch} {job.name}: not run: {record['error']}")
                parts.append(f"{arch} {job.name}: not run")
            else:
                worst = max(level["population"]["violation_rate"] for level in record["levels"])
                parts.append(
                    f"{arch} {job.name}: {len(record['levels'])} levels, population violations <= {worst:.1%}"
                )
            done += 1
    ctx.progress("validate guarantees", total, total)
    return "; ".join(parts)


def _report_fingerprint(ctx: _Context) -> tuple[str, dict]:
    inputs = {
        stage: (ctx.run.manifest(stage) or {}).get("outputs", {}) for stage in ("dv", "calibrate", "validate")
    }
    inputs["config"] = ctx.config.section(*_CALIBRATE_SETTINGS, *_VALIDATE_SETTINGS)
    return _fingerprint(inputs), {"stages": ["dv", "calibrate", "validate"]}


def _run_report(ctx: _Context) -> str:
    from ..report._build import build_report  # matplotlib is imported only when a report is built

    path = build_report(ctx.run.root)
    return str(path)


# ---------------------------------------------------------------------------------------------
# the run


@dataclass(frozen=True)
class Prepared:
    data: DataSplits
    spec: ExpertSpec
    model: ModelInfo
    run_dir: Path
    store_root: Path
    cache_path: Path


def prepare(config: RunConfig, runs_root: Path | None = None) -> Prepared:
    """Every check that needs no weights and no expert call: data spec, expert, model and layer,
    budgets against the test split's size. Caches live beside the runs root unless $CTD_STORE
    or $CTD_CACHE say otherwise."""
    data = load_data(list(config.data) if config.data else None)
    spec = resolve_expert_spec(config)
    try:
        model = describe_model(config.model, revision=config.revision)
        resolve_layer(config.layer, model.n_layers, model.config)
    except ProbeError as error:
        raise InputError(str(error)) from None
    n_cal = calibrate.split_sizes(len(data.test))[1]  # D_cal of a calibration half (SPEC section 4)
    need = calibrate.min_calibration_size(min(config.budgets), config.delta)
    if n_cal < need:
        raise InputError(
            f"--budgets {min(config.budgets):g}: the test split has {len(data.test)} examples, so D_cal "
            f"holds {n_cal}; certifying this budget at delta {config.delta:g} needs at least {need}"
        )
    root = Path(runs_root) if runs_root else default_runs_root()
    store_root = (
        Path(os.environ["CTD_STORE"]) if os.environ.get("CTD_STORE") else root / "cache" / "activations"
    )
    cache_path = (
        Path(os.environ["CTD_CACHE"]) if os.environ.get("CTD_CACHE") else root / "cache" / "experts.sqlite"
    )
    return Prepared(data, spec, model, root / config.run_name, store_root.resolve(), cache_path.resolve())


def run_eval(
    config: RunConfig,
    *,
    runs_root: Path | None = None,
    show_progress: bool = True,
    on_stage: Callable[[StageOutcome], None] | None = None,
    retry_failed: bool = False,
) -> EvalResult:
    """Run (or resume) every stage of `config` in its run folder and return what happened.
    `retry_failed` reruns the query stage when it recorded expert failures (answers already in
    the cache are not asked again)."""
    prepared = prepare(config, runs_root)
    data, spec, run_dir = prepared.data, prepared.spec, prepared.run_dir
    state = process_state()
    if not state.is_main_process:
        # Under `accelerate launch`, the other processes extract their share of the activations
        # and stop; the main process runs every stage.
        probe_stage(data, _probe_settings(config), run_dir / "probe", store_root=prepared.store_root)
        return EvalResult(run_dir, run_dir / "report" / "report.md", ())
    ctx_progress = StageProgress(enabled=show_progress)
    run = RunFolder(run_dir)
    ctx = _Context(
        config=config,
        run=run,
        data=data,
        spec=spec,
        model=prepared.model,
        progress=ctx_progress,
        show_progress=show_progress,
        store_root=prepared.store_root,
        cache_path=prepared.cache_path,
    )
    run.log(
        f"ctd eval {config.run_name}: {len(data.train)} train, {len(data.dev)} dev, {len(data.test)} test"
    )
    plan: list[tuple[str, Callable[[], tuple[str, dict]], Callable[[], Any], list[Path]]] = [
        ("probe", lambda: _probe_fingerprint(ctx), lambda: _run_probe(ctx), [run.path("probe")]),
        (
            "query",
            lambda: _query_fingerprint(ctx),
            lambda: _run_query(ctx),
            [run.path("query", "expert_scores.parquet")],
        ),
        (
            "dv",
            lambda: _dv_fingerprint(ctx),
            lambda: _run_dv(ctx),
            [run.path("scores.parquet"), run.path("dv")],
        ),
        (
            "calibrate",
            lambda: _scores_fingerprint(ctx, *_CALIBRATE_SETTINGS),
            lambda: _run_calibrate(ctx),
            [run.path("calibrate")],
        ),
        (
            "validate",
            lambda: _scores_fingerprint(ctx, *_VALIDATE_SETTINGS),
            lambda: _run_validate(ctx),
            [run.path("validate")],
        ),
        ("report", lambda: _report_fingerprint(ctx), lambda: _run_report(ctx), [run.path("report")]),
    ]
    # The expert is checked before the first expensive stage, but only if it will be queried.
    query_fp, _ = _query_fingerprint(ctx)
    failed_before = (run.manifest("query") or {}).get("failed", 0)
    if retry_failed and failed_before:
        run.invalidate("query")
    if not run.up_to_date("query", query_fp):
        _preflight_expert(spec, config)
    # Written only now that the options passed every check, so a mistyped rerun leaves it alone.
    write_text_atomic(run.path("config.toml"), config.to_toml())
    run_log = _read_run_log(run) | {"version": RUN_LOG_VERSION, "config": asdict(config)}
    run_log |= {"versions": _versions(), "git_revision": _git_revision()}
    outcomes: list[StageOutcome] = []
    with ctx_progress if show_progress else nullcontext():
        for stage, fingerprint_of, execute, outputs in plan:
            started = time.perf_counter()
            fingerprint, inputs = fingerprint_of()
            extra_ok = stage != "probe" or _stores_intact(run)
            if run.up_to_date(stage, fingerprint) and extra_ok:
                outcome = StageOutcome(stage, "skipped", 0.0, "up to date")
                run.log(f"{stage}: skipped (inputs unchanged)")
            else:
                run.invalidate(stage)
                run.log(f"{stage}: started")
                _set_stage(run_log, stage, "running", None, "")
                write_json(run.path("run.json"), run_log)
                try:
                    returned = execute()
                except BaseException as error:
                    status = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
                    run.log(f"{stage}: {status}: {type(error).__name__}: {error}")
                    _set_stage(run_log, stage, status, time.perf_counter() - started, str(error))
                    write_json(run.path("run.json"), run_log)
                    raise
                detail, extra = returned if isinstance(returned, tuple) else (returned, {})
                run.finish(stage, fingerprint, inputs, outputs, **extra)
                outcome = StageOutcome(stage, "ran", time.perf_counter() - started, detail)
                run.log(f"{stage}: finished in {outcome.seconds:.1f} s: {detail}")
            _set_stage(run_log, stage, outcome.status, outcome.seconds, outcome.detail)
            write_json(run.path("run.json"), run_log)
            outcomes.append(outcome)
            if on_stage is not None:
                on_stage(outcome)
            if stage == "query":
                try:
                    _check_failures(ctx)
                except RunFailed as error:
                    run.log(f"stopped after the query stage: {error}")
                    raise
    summary_path = run.path("report", "tables", "summary.csv")
    summary = _summary_rows(summary_path)
    return EvalResult(run_dir, run.path("report", "report.md"), tuple(outcomes), summary)


def _read_run_log(run: RunFolder) -> dict:
    try:
        return read_json(run.path("run.json"))
    except InputError:
        return {"created": datetime.now(UTC).isoformat(timespec="seconds"), "stages": {}}


def _set_stage(run_log: dict, stage: str, status: str, seconds: float | None, detail: str) -> None:
    run_log.setdefault("stages", {})[stage] = {
        "status": status,
        "seconds": None if seconds is None else round(seconds, 2),
        "detail": detail,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _summary_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    table = read_table(path).columns
    n = len(next(iter(table.values())))
    return [{k: str(v[i]) for k, v in table.items()} for i in range(n)]
