"""The DV stage, files to files: join probe and expert scores, train the delegation-value probe on
dev (target v = P_e(y|x) - P_p(y|x), or the binary variant), score test, write the scores table.

The probe scores on dev come from safety probes trained on train only, so the DV targets are
out-of-sample, as they will be at deployment.

Outputs: the scores table of SPEC section 2 (`dv` filled on test rows, empty on dev rows) and
`dv_metrics.json` (per arch and seed: MSE and Spearman of d against v on test; `DVMetrics`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

import calibrate
from calibrate import DV_TARGETS, DVTarget
from probes import ProbeConfig, ProbeError

from .._errors import InputError
from ..data import (
    binary_twin,
    check_writable,
    read_scores,
    read_table,
    scores_from_columns,
    write_json,
    write_scores,
)
from ..run import DVLayout, ProbeLayout, ProgressFn, RunContext, StageResult, file_sha256, fingerprint
from ._dv_metrics import DVMetrics, DVRun, dv_metrics_json
from ._expert_calibration import cascade_expert_scores
from ._probe import open_stores

__all__ = ["DVStage", "DVStageResult", "dv_stage", "expert_for_probe", "read_expert_scores"]


@dataclass(frozen=True)
class DVStageResult:
    scores: Path
    metrics: DVMetrics  # dv_metrics.json beside the scores table
    missing_expert: int  # dev/test examples left out because the expert failed on them


def read_expert_scores(paths: Sequence[Path], groups: Sequence[str | None] = ()) -> dict[str, float]:
    """id -> expert P(y=1) from `ctd query` tables (columns `id`, `expert`; NaN where the expert
    failed). A table with a group (`groups[i]`, from --expert-scores GROUP:PATH) gives its ids as
    "GROUP/ID", the form `ctd probe` gives them where an id repeats across a split's groups. An
    id scored differently in two tables is an error: it would be ambiguous."""
    out: dict[str, float] = {}
    for path, group in zip(paths, [*groups, *[None] * (len(paths) - len(groups))], strict=True):
        table = read_table(Path(path))
        for column in ("id", "expert"):
            if column not in table.columns:
                raise InputError(f"{path}: missing column {column!r} (an expert scores table has id, expert)")
        for row, (raw_key, raw_value) in enumerate(
            zip(table.columns["id"], table.columns["expert"], strict=True)
        ):
            value = _expert_score(raw_value, path, table.where(row))
            # Compared as stored: a Parquet id 5 and a CSV id "5" name the same example.
            key = str(raw_key) if group is None else f"{group}/{raw_key}"
            if key in out and not (out[key] == value or (np.isnan(out[key]) and np.isnan(value))):
                raise InputError(
                    f"{path}: {table.where(row)}: id {key!r} has two different expert scores (tables of "
                    "different groups whose ids repeat: give each as --expert-scores GROUP:PATH)"
                )
            out[key] = value
    return out


def expert_for_probe(probe_dir: Path, by_id: dict[str, float]) -> dict[tuple[str, str], float]:
    """(split, id) -> expert score for the dev and test examples of `ctd probe`'s scores table,
    from `read_expert_scores`. `ctd probe` qualifies a split's ids by group ("da/0") when an id
    repeats across its groups, which `ctd query`, reading one file, cannot know: an example is
    found under its probe id, as "GROUP/ID", or under its id within the group. An example found
    under none is left out, for `dv_stage` to name."""
    table = read_table(ProbeLayout(probe_dir).scores).columns
    out: dict[tuple[str, str], float] = {}
    for split, group, example_id in zip(
        np.asarray(table["split"]).astype(str).tolist(),
        np.asarray(table["group"]).astype(str).tolist(),
        np.asarray(table["id"]).astype(str).tolist(),
        strict=True,
    ):
        plain = example_id.removeprefix(f"{group}/")
        for candidate in (example_id, f"{group}/{example_id}", plain):
            if candidate in by_id:
                out[(split, example_id)] = by_id[candidate]
                break
    return out


def _expert_score(value: object, path: Path, where: str) -> float:
    """One `expert` cell as a float: an empty cell (a CSV's NaN) is an expert that failed, NaN."""
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return float("nan")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(f"{path}: column 'expert', {where}: {value!r} is not a number") from None


def dv_stage(
    probe_dir: Path,
    expert: dict[tuple[str, str], float],
    out: Path,
    *,
    target: DVTarget = "continuous",
    training: ProbeConfig | None = None,
    progress: ProgressFn | None = None,
    artifacts: tuple[Callable[[str, int], Path], Callable[[str, int], Path]] | None = None,
    baseline: dict[tuple[str, str], float] | None = None,
) -> DVStageResult:
    """Train one DV probe per (arch, seed) of the probe stage in `probe_dir` and write the scores
    table to `out` (and `dv_metrics.json` beside it). `expert` maps (split, id) to the expert's
    P(y=1), NaN where it failed: ids are unique within a split only. With `artifacts` (where the
    safety probe of (arch, seed) was saved, where to save its DV probe) every DV probe is saved,
    with the safety probe's record of what it reads (model, layer, template, token limit).
    `baseline` maps (split, id) to the score the expert would replace (a cascade's stage before;
    None: the probe's), against which the delegation value is counted; an example without it
    (NaN) is left out as one the expert failed on."""
    # torch loads when the stage runs, not when a rerun skips it
    from probes import predict, read_artifact, save_probe, train_probe

    if target not in DV_TARGETS:
        raise InputError(f"--dv-target {target}: choose from {', '.join(DV_TARGETS)}")
    check_writable(out, "--out", inputs=[("--probe-dir's scores", ProbeLayout(probe_dir).scores)])
    training = training or ProbeConfig()
    table = read_table(ProbeLayout(probe_dir).scores).columns
    acts = open_stores(probe_dir)
    ids = np.asarray(table["id"]).astype(str)
    split = np.asarray(table["split"]).astype(str)
    keys = list(zip(split.tolist(), ids.tolist(), strict=True))  # plain strings, as messages show them
    unknown = [k for k in keys if k not in expert]
    if unknown:
        (where, first), count = unknown[0], len(set(unknown))
        raise InputError(f"expert scores: no score for {where} example {first!r} ({count} missing)")
    expert_col = np.array([expert[k] for k in keys], dtype=np.float64)
    # Row of each example within its split's activations (the probe stage wrote splits in data order).
    position: dict[tuple[str, str], int] = {}
    for name in ("dev", "test"):
        first_seed = (
            (split == name) & (table["seed"] == table["seed"][0]) & (table["arch"] == table["arch"][0])
        )
        for row, example_id in enumerate(ids[first_seed]):
            position[(name, example_id)] = row
    label = np.asarray(table["label"]).astype(np.int64)
    probe = np.asarray(table["probe"]).astype(np.float64)
    if baseline is None:
        replaced = probe
    else:
        lacking = [k for k in keys if k not in baseline]
        if lacking:
            raise InputError(f"the stage before: no score for {lacking[0][0]} example {lacking[0][1]!r}")
        replaced = np.array([baseline[k] for k in keys], dtype=np.float64)
    dv = np.full(len(ids), np.nan)
    runs: list[DVRun] = []
    pairs = list(dict.fromkeys(zip(table["arch"], table["seed"], strict=True)))
    value_fn = calibrate.delegation_value if target == "continuous" else calibrate.binary_delegation_value
    for number, (arch, seed) in enumerate(pairs):
        if progress is not None:
            progress("DV probes", number, len(pairs), unit="trained")
        rows = (
            (table["arch"] == arch)
            & (table["seed"] == seed)
            & np.isfinite(expert_col)
            & np.isfinite(replaced)
        )
        dev_rows, test_rows = (
            np.flatnonzero(rows & (split == "dev")),
            np.flatnonzero(rows & (split == "test")),
        )
        dev_index = np.array([position[("dev", i)] for i in ids[dev_rows]], dtype=np.int64)
        test_index = np.array([position[("test", i)] for i in ids[test_rows]], dtype=np.int64)
        v_dev = value_fn(label[dev_rows], replaced[dev_rows], expert_col[dev_rows])
        config = replace(training, arch=str(arch))
        if len(dev_rows) < 2:
            raise InputError(
                f"the dev split has {len(dev_rows)} examples with an expert score; the DV probe needs more"
            )
        try:
            result = train_probe(
                acts["dev"].subset(dev_index), v_dev, task="dv", config=config, seed=int(seed)
            )
        except (ValueError, FloatingPointError) as error:
            raise InputError(f"DV probe {arch} seed {seed} on the dev split: {error}") from None
        d_test = predict(result.probe, acts["test"].subset(test_index), task="dv")
        dv[test_rows] = d_test
        v_test = calibrate.delegation_value(label[test_rows], replaced[test_rows], expert_col[test_rows])
        quality = calibrate.dv_quality(d_test, v_test)
        runs.append(
            DVRun(
                arch=str(arch),
                seed=int(seed),
                target=target,
                best_epoch=result.best_epoch,
                n_train=result.n_train,
                n_val=result.n_val,
                test_mse=quality.mse,
                test_spearman=quality.spearman,
                dev_mean_v=float(v_dev.mean()),
                test_mean_v=float(v_test.mean()),
            )
        )
        if artifacts is not None:
            safety_stem, dv_stem = artifacts
            try:
                reads = read_artifact(safety_stem(str(arch), int(seed)))
            except ProbeError as error:
                raise InputError(f"{error}; rerun the probe stage") from None
            save_probe(
                dv_stem(str(arch), int(seed)),
                result.probe,
                replace(reads, task="dv", config=config, metrics=asdict(runs[-1])),
            )
    if progress is not None:
        progress("DV probes", len(pairs), len(pairs), unit="trained")
    keep = np.isfinite(expert_col) & np.isfinite(replaced)
    columns = {
        "id": ids[keep],
        "group": np.asarray(table["group"]).astype(str)[keep],
        "split": split[keep],
        "label": label[keep],
        "probe": probe[keep],
        "expert": expert_col[keep],
        "dv": dv[keep],
        "seed": np.asarray(table["seed"]).astype(np.int64)[keep],
        "arch": np.asarray(table["arch"]).astype(str)[keep],
    }
    scores_from_columns(columns, str(out))  # the contract, checked before anything is written
    missing = len(set(ids[~keep]))
    metrics = DVMetrics(target, missing, tuple(runs), DVMetrics.means(runs))
    write_json(DVLayout(Path(out).parent).metrics, metrics.to_json())
    write_scores(out, columns)
    return DVStageResult(Path(out), metrics, missing)


@dataclass(frozen=True)
class DVStage:
    """`ctd eval`'s DV stage: one `dv_stage` per DV target into dv/, merged into the run's scores
    table (with `--dv-target both`, the binary variant's rows carry the arch `binary_twin(arch)`)."""

    ctx: RunContext
    name: ClassVar[str] = "dv"

    @property
    def targets(self) -> list[DVTarget]:
        chosen = self.ctx.config.dv_target
        return [target for target in DV_TARGETS if chosen in (target, "both")]

    def fingerprint(self) -> tuple[str, dict[str, Any]]:
        layout = self.ctx.layout
        inputs = {
            "probe_scores": file_sha256(layout.probe.scores),
            "stores": file_sha256(layout.probe.stores),
            # What this stage reads from the query table (split, id, expert): a rerun answered from
            # the cache (its `source` column says "cache") must not look like new input.
            "expert_scores": fingerprint(sorted((s, i, repr(v)) for (s, i), v in self._expert().items())),
        }
        return fingerprint(
            {"inputs": inputs, "settings": self.ctx.config.section("dv_target", "epochs")}
        ), inputs

    def _expert(self) -> dict[tuple[str, str], float]:
        """(split, id) -> expert P(y=1), calibrated as the run asked (NaN where it failed): ids are
        unique within a split only."""
        return cascade_expert_scores(self.ctx.layout.query)

    def reusable(self) -> bool:
        """A run from before DV probes were saved trains them again."""
        layout, config = self.ctx.layout, self.ctx.config
        return all(
            layout.dv.artifact(target, arch, seed).with_suffix(".json").is_file()
            for target in self.targets
            for arch in config.archs
            for seed in config.seeds
        )

    def outputs(self) -> list[Path]:
        return [self.ctx.layout.scores, self.ctx.layout.dv.root]

    def run(self) -> StageResult:
        ctx, layout = self.ctx, self.ctx.layout
        expert = self._expert()
        training = ProbeConfig(epochs=ctx.config.epochs)
        parts: list[dict[str, np.ndarray]] = []
        metrics: dict[DVTarget, DVMetrics] = {}
        for target in self.targets:
            path = layout.dv.scores(target)
            path.parent.mkdir(parents=True, exist_ok=True)
            result = dv_stage(
                layout.probe.root,
                expert,
                path,
                target=target,
                training=training,
                progress=ctx.progress,
                artifacts=(layout.probe.artifact, partial(layout.dv.artifact, target)),
            )
            metrics[target] = result.metrics
            columns = read_table(path).columns
            if target == "binary" and len(self.targets) == 2:
                columns["arch"] = np.array([binary_twin(str(a)) for a in columns["arch"]])
            parts.append(columns)
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        write_json(layout.dv.metrics, dv_metrics_json(metrics))
        write_scores(layout.scores, merged)
        read_scores(layout.scores)  # the contract holds
        first = metrics[self.targets[0]]
        detail = "; ".join(
            f"{arch} DV Spearman {means.test_spearman:.3f}, MSE {means.test_mse:.4f}"
            for arch, means in first.mean.items()
        )
        if first.missing_expert:
            detail += f"; {first.missing_expert} left out (expert failed)"
        return StageResult(detail)

    def check_outputs(self) -> None:
        return None
