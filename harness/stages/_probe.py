"""The probe stage, files to files: extract activations of every split into the store, train the
safety probe on train (one per architecture and seed), score dev and test.

Outputs in `out_dir`:
    probe_scores.parquet   id, group, split (dev/test), label, probe, seed, arch
    probe_metrics.json     extraction counts per split; per (arch, seed) training and AUROC/accuracy
    stores.json            the activation store of each split (the DV stage reads them)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

import calibrate
from probes import ActivationStore, ProbeError, Ragged, StoreKey

from .._errors import InputError
from ..data import SPLITS, DataSplits, SplitName, read_json, write_json, write_table
from ..run import ProbeLayout, ProbeSettings, ProgressFn, Roots, RunContext, StageResult, fingerprint
from ._probe_metrics import ProbeMetrics, ProbeRun, SplitExtraction

if TYPE_CHECKING:
    from probes import ExtractStats, LoadedModel

__all__ = ["ProbeSettings", "ProbeStage", "ProbeStageResult", "open_stores", "probe_stage"]


@dataclass(frozen=True)
class ProbeStageResult:
    scores: Path
    metrics: ProbeMetrics  # probe_metrics.json
    layer: int
    # Wall seconds of this call's parts: "model" (loading it; 0 when given), "extraction",
    # "training", "scoring". Logged, not written: the stage's files stay the same on a rerun.
    seconds: dict[str, float]


def open_stores(out_dir: Path) -> dict[SplitName, Ragged]:
    """The activations of each split recorded by a finished probe stage in `out_dir`."""
    record = read_json(ProbeLayout(out_dir).stores)
    out: dict[SplitName, Ragged] = {}
    for split, entry in record["splits"].items():
        out[split] = ActivationStore(Path(entry["folder"]), StoreKey(**entry["key"])).read()
    return out


def _extract_split(
    model: LoadedModel,
    data: DataSplits,
    split: SplitName,
    settings: ProbeSettings,
    layer: int,
    store_root: Path,
    progress: ProgressFn | None,
) -> tuple[ActivationStore, ExtractStats]:
    # torch loads when the stage runs, not when a rerun skips it
    from probes import RejectedExample, extract

    examples = data[split]

    def on_batch(done: int, total: int) -> None:
        if progress is not None:
            progress(f"extract {split}", done, total, unit="tokens")

    try:
        return extract(
            model,
            [e.conversation for e in examples],
            layer=layer,
            max_tokens=settings.max_tokens,
            data_hash=data.content_hash(split),
            store_root=store_root,
            batch_tokens=settings.batch_tokens,
            on_batch=on_batch,
        )
    except RejectedExample as error:
        # The position is in the split's sorted examples, which the user never sees: name the
        # example by its id and the file line it came from.
        example = examples[error.index]
        where = data.where.get((split, example.id))
        at = f" at {where}" if where else ""
        raise InputError(f"--data {split}: example {example.id!r}{at}: {error.reason}") from None


def probe_stage(
    data: DataSplits,
    settings: ProbeSettings,
    out_dir: Path,
    *,
    store_root: Path | None = None,
    progress: ProgressFn | None = None,
    model: LoadedModel | None = None,
    artifact: Callable[[str, int], Path] | None = None,
) -> ProbeStageResult | None:
    """Extract, train the safety probes on train, score dev and test; write the stage's files, and
    with `artifact` ((arch, seed) -> stem) save every trained probe (`probes.save_probe`).
    Under `accelerate launch` every process extracts its share; only the main process goes on
    (and returns the result; the others return None)."""
    from experts import signals_held

    with signals_held():  # a Ctrl-C inside torch's or transformers' import would abort, not stop
        import transformers.modeling_utils  # noqa: F401 - what loading a model imports: torch and more

        from probes import (
            ProbeArtifact,
            load_model,
            predict,
            process_state,
            resolve_layer,
            save_probe,
            train_probe,
        )

    store_root = store_root or Roots.resolve().store
    seconds = dict.fromkeys(("model", "extraction", "training", "scoring"), 0.0)
    try:
        started = time.perf_counter()
        model = model or load_model(
            settings.model, revision=settings.revision, device_map=settings.device_map
        )
        seconds["model"] = time.perf_counter() - started
        started = time.perf_counter()
        layer = resolve_layer(settings.layer, model.n_layers, model.model.config)
        stores: dict[SplitName, ActivationStore] = {}
        extraction: dict[str, SplitExtraction] = {}
        for split in SPLITS:
            store, stats = _extract_split(model, data, split, settings, layer, store_root, progress)
            stores[split] = store
            extraction[split] = SplitExtraction.from_stats(stats)
        seconds["extraction"] = time.perf_counter() - started
    except ProbeError as error:
        raise InputError(str(error)) from None
    if not process_state().is_main_process:
        return None  # under `accelerate launch` the other processes only extract
    acts = {split: store.read() for split, store in stores.items()}
    labels = {split: np.array([e.label for e in data[split]], dtype=np.int64) for split in SPLITS}

    columns: dict[str, list] = {k: [] for k in ("id", "group", "split", "label", "probe", "seed", "arch")}
    runs: list[ProbeRun] = []
    total = len(settings.archs) * len(settings.seeds)
    for number, (arch, seed) in enumerate((a, s) for a in settings.archs for s in settings.seeds):
        if progress is not None:
            progress("safety probes", number, total, unit="trained")
        config = replace(settings.training, arch=arch)
        started = time.perf_counter()
        try:
            result = train_probe(acts["train"], labels["train"], task="safety", config=config, seed=seed)
        except (ValueError, FloatingPointError) as error:
            raise InputError(f"safety probe {arch} seed {seed} on the train split: {error}") from None
        seconds["training"] += time.perf_counter() - started
        auroc: dict[str, float | None] = {}  # None on a split with one class
        accuracy: dict[str, float] = {}
        for split in ("dev", "test"):
            started = time.perf_counter()
            scores = predict(result.probe, acts[split], task="safety")
            seconds["scoring"] += time.perf_counter() - started
            both_classes = len(set(labels[split].tolist())) > 1
            auroc[split] = float(calibrate.auroc(scores, labels[split])) if both_classes else None
            accuracy[split] = float(calibrate.accuracy(scores, labels[split]))
            for example, score in zip(data[split], scores, strict=True):
                columns["id"].append(example.id)
                columns["group"].append(example.group)
                columns["split"].append(split)
                columns["label"].append(example.label)
                columns["probe"].append(float(score))
                columns["seed"].append(seed)
                columns["arch"].append(arch)
        run = ProbeRun(
            arch=arch,
            seed=seed,
            best_epoch=result.best_epoch,
            epochs_run=len(result.history),
            n_train=result.n_train,
            n_val=result.n_val,
            best_val_loss=result.best_val_loss,
            dev_auroc=auroc["dev"],
            dev_accuracy=accuracy["dev"],
            test_auroc=auroc["test"],
            test_accuracy=accuracy["test"],
        )
        runs.append(run)
        if artifact is not None:
            save_probe(
                artifact(arch, seed),
                result.probe,
                ProbeArtifact(
                    task="safety",
                    config=config,
                    dim=acts["train"].dim,
                    model=settings.model,
                    model_identity=model.identity,
                    layer=layer,
                    max_tokens=settings.max_tokens,
                    template=model.template_text,
                    template_hash=model.template_hash,
                    seed=seed,
                    metrics=asdict(run),
                    dtype=str(model.dtype).removeprefix("torch."),
                ),
            )
    if progress is not None:
        progress("safety probes", total, total, unit="trained")

    out_dir.mkdir(parents=True, exist_ok=True)
    files = ProbeLayout(out_dir)
    write_json(
        files.stores,
        {
            "splits": {
                split: {"folder": str(store.folder.resolve()), "key": asdict(store.key)}
                for split, store in stores.items()
            }
        },
    )
    metrics = ProbeMetrics(
        model=settings.model,
        model_identity=model.identity,
        layer=layer,
        n_layers=model.n_layers,
        hidden_size=model.hidden_size,
        dtype=str(model.dtype).removeprefix("torch."),
        extraction=extraction,
        runs=tuple(runs),
        mean=ProbeMetrics.means(runs),
    )
    write_json(files.metrics, metrics.to_json())
    write_table(files.scores, {k: np.array(v) for k, v in columns.items()})
    return ProbeStageResult(files.scores, metrics, layer, seconds)


@dataclass(frozen=True)
class ProbeStage:
    """`ctd eval`'s probe stage: `probe_stage` into probe/."""

    ctx: RunContext
    name: ClassVar[str] = "probe"

    @staticmethod
    def settings(ctx: RunContext) -> ProbeSettings:
        return ctx.config.probe_settings

    def fingerprint(self) -> tuple[str, dict[str, Any]]:
        ctx = self.ctx
        inputs: dict[str, Any] = {f"data.{s}": ctx.data.content_hash(s) for s in SPLITS}
        settings = ctx.config.section("layer", "max_tokens", "batch_tokens", "archs", "seeds", "epochs")
        settings["model"] = ctx.model.identity  # the weights' identity (file hash, hub commit), not the name
        return fingerprint({"inputs": inputs, "settings": settings}), inputs

    def reusable(self) -> bool:
        """The activation stores live outside the run folder (shared by runs): when one is gone,
        the stage runs again and refills it."""
        try:
            record = read_json(self.ctx.layout.probe.stores)
        except InputError:
            return False
        saved = all(
            self.ctx.layout.probe.artifact(arch, seed).with_suffix(".json").is_file()
            for arch in self.ctx.config.archs
            for seed in self.ctx.config.seeds
        )  # a run from before probes were saved trains them again
        return saved and all(
            ActivationStore(Path(s["folder"]), StoreKey(**s["key"])).is_complete
            for s in record["splits"].values()
        )

    def outputs(self) -> list[Path]:
        return [self.ctx.layout.probe.root]

    def run(self) -> StageResult:
        ctx = self.ctx
        # torch, transformers and the weights: the longest wait before the first bar
        ctx.progress.step(f"loading the monitored model {ctx.config.model}")
        try:
            result = probe_stage(
                ctx.data,
                self.settings(ctx),
                ctx.layout.probe.root,
                store_root=ctx.roots.store,
                progress=ctx.progress,
                artifact=ctx.layout.probe.artifact,
            )
        except ProbeError as error:
            raise InputError(str(error)) from None
        assert result is not None  # the main process gets the result
        ext = result.metrics.extraction
        tokens = sum(e.tokens for e in ext.values())
        truncated = sum(e.truncated for e in ext.values())
        ctx.manifests.log(
            f"probe: layer {result.layer} of {result.metrics.n_layers}, {tokens} tokens, "
            f"{truncated} conversations truncated to {ctx.config.max_tokens} tokens"
        )
        ctx.manifests.log(_where_the_time_went(result, tokens=tokens, probes=len(result.metrics.runs)))
        means = result.metrics.mean
        seeds = len(ctx.config.seeds)
        # Labelled apart from the summary's probe AUROC, which is on each seed's evaluation half.
        return StageResult(
            "; ".join(
                f"{arch} safety-probe AUROC {m.test_auroc:.3f} on the whole test split (mean over "
                f"{seeds} seeds)"
                for arch, m in means.items()
                if m.test_auroc
            )
        )

    def check_outputs(self) -> None:
        return None


def _where_the_time_went(result: ProbeStageResult, *, tokens: int, probes: int) -> str:
    """One log line: the stage's wall time by part (where a GPU run's time goes, among others)."""
    s = result.seconds
    extracted = sum(e.tokens for e in result.metrics.extraction.values() if e.extracted_batches)
    rate = f", {extracted / s['extraction']:,.0f} tokens/s" if extracted and s["extraction"] > 0 else ""
    return (
        f"probe: {s['model']:.1f} s loading the model, {s['extraction']:.1f} s extracting "
        f"({extracted} of {tokens} tokens run{rate}), {s['training']:.1f} s training {probes} "
        f"probe{'s' if probes != 1 else ''}, {s['scoring']:.1f} s scoring dev and test"
    )
