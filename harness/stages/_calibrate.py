"""Library API behind `ctd simulate`, `ctd calibrate` and `ctd validate`: files in, files out."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

import calibrate
from calibrate import MergeChoice, SweepConfig, ValidationConfig, ValidationResult

from .._errors import InputError
from ..data import (
    DEFAULT_RANDOM_STATE,
    Scenario,
    ScoresTable,
    check_writable,
    read_scores,
    simulate_scores,
    staging_folder,
    write_json,
    write_jsonl,
    write_parquet_parts,
    write_scores,
    write_table,
)
from ..run import Roots, RunContext, RunLayout, StageResult, SweepLayout, file_sha256, fingerprint

__all__ = [
    "CALIBRATE_SETTINGS",
    "CalibrateStage",
    "calibrate_scores",
    "check_calibration_size",
    "resolve_scores",
    "simulate",
    "validate_joint_levels",
    "validate_joint_scores",
    "validate_scores",
]


def resolve_scores(scores: Path | None, run: str | None, runs_root: Path | None = None) -> Path:
    """The scores table named by exactly one of --scores FILE and --run NAME."""
    if (scores is None) == (run is None):
        raise InputError("give exactly one of --scores FILE and --run NAME")
    if scores is not None:
        return Path(scores)
    layout = Roots.resolve(runs_root).run(str(run))
    folder = layout.root
    if not folder.is_dir():
        raise InputError(f"--run {run}: no run folder {folder}")
    path = layout.scores
    if not path.exists():
        raise InputError(f"--run {run}: {path} does not exist (has the run reached the dv stage?)")
    return path


def check_calibration_size(
    by_seed: dict[int, calibrate.Scores],
    source: str,
    alpha: float,
    delta: float,
    *,
    option: str,
    cal_fraction: float = calibrate.CAL_FRACTION,
    est_fraction: float = calibrate.EST_FRACTION,
    cal_size: int | None = None,
) -> None:
    """Fail early when a split is empty, or D_cal too small for any threshold to be certified:
    zero losses must reject H: R > alpha, i.e. (1 - alpha)^n_cal <= delta. Also require both
    labels per seed."""
    for seed, scores in by_seed.items():
        if cal_size is not None and cal_size >= scores.n:
            raise InputError(
                f"--cal-size {cal_size}: seed {seed} of {source} has {scores.n} test rows; a calibration "
                f"sample must leave at least one row to evaluate on"
            )
        n_est, n_cal, n_eval = calibrate.split_sizes(scores.n, cal_fraction, est_fraction, cal_size=cal_size)
        if min(n_est, n_eval) < 1:
            raise InputError(
                f"{source}: seed {seed} has {scores.n} test rows, too few for D_est "
                f"({n_est}), D_cal ({n_cal}) and the evaluation half ({n_eval})"
            )
        size = calibrate.calibration_size(n_cal, alpha, delta)
        if not size.enough:
            sample = "--cal-size " + str(cal_size) if cal_size is not None else f"{scores.n} test rows"
            low = size.lowest_level()  # what n_cal rows can certify, when there are any
            can = "" if low is None else f"; {n_cal} rows certify levels of {low:.3f} or more"
            raise InputError(
                f"{source}: seed {seed} has {sample}, so D_cal holds {n_cal}; "
                f"{option} {alpha:g} with --delta {delta:g} needs at least {size.need} for any threshold "
                f"to be certified{can}"
            )
        if np.unique(scores.label).size < 2:
            raise InputError(
                f"{source}: column 'label': the test split of seed {seed} has only label "
                f"{int(scores.label[0])}; AUROC and accuracy need both classes"
            )


def simulate(
    scenario: Scenario,
    n: int,
    seeds: int,
    out: Path,
    *,
    n_dev: int | None = None,
    random_state: int = DEFAULT_RANDOM_STATE,
    stages: int = 1,
) -> Path:
    """Write a synthetic scores table (see `harness.data._simulate`); `stages` > 1: a cascade's."""
    check_writable(out, "--out")
    columns = simulate_scores(scenario, n, seeds, n_dev=n_dev, random_state=random_state, stages=stages)
    return write_scores(out, columns)


def _mean_by(table: dict[str, np.ndarray], keys: tuple[str, ...], values: tuple[str, ...]) -> dict:
    """Nested {key1: {key2: {value: mean}}} over the rows of a tidy table."""
    out: dict = {}
    key_columns = [table[k] for k in keys]
    combos = sorted({tuple(str(c[i]) for c in key_columns) for i in range(len(key_columns[0]))})
    for combo in combos:
        rows = np.ones(len(key_columns[0]), bool)
        for column, value in zip(key_columns, combo, strict=True):
            rows &= column.astype(str) == value
        leaf = out
        for part in combo[:-1]:
            leaf = leaf.setdefault(part, {})
        leaf[combo[-1]] = {v: _finite_mean(table[v][rows]) for v in values}
    return out


def _finite_mean(values: np.ndarray) -> float:
    """The mean of the numbers that are not NaN (a budget without a policy has NaN metrics);
    NaN, without numpy's warning, when there are none."""
    kept = values[~np.isnan(values)]
    return float(kept.mean()) if kept.size else float("nan")


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def _settings(config: SweepConfig) -> dict[str, object]:
    """Every SweepConfig field, tuples as lists; a None setting added after the first release
    (`accuracy`) is left out, so that a budget-only sweep's summary is what it always was."""
    return {
        f.name: _plain(getattr(config, f.name))
        for f in fields(SweepConfig)
        if not (f.default is None and getattr(config, f.name) is None)
    }


def _joint_counts(config: SweepConfig, at_largest: dict[str, np.ndarray]) -> dict[str, object]:
    """With --accuracy, how many (budget, seed) rows of each calibrated curve have a policy:
    mean_over_budgets averages those rows only, and `policies_found` says over how many."""
    if config.accuracy is None:
        return {}
    found: dict[str, dict[str, dict[str, int]]] = {}
    for objective in config.objectives:
        for policy in config.policies:
            if not calibrate.POLICIES[policy].calibrated:
                continue
            rows = (at_largest["objective"] == objective) & (at_largest["policy"] == policy)
            found.setdefault(objective, {})[policy] = {
                "with_policy": int((~np.isnan(at_largest["threshold"][rows])).sum()),
                "rows": int(rows.sum()),
            }
    return {"error_level": config.error_level, "policies_found": found}


def _with_ids(
    masks: tuple[calibrate.DecisionMasks, ...], table: ScoresTable, arch: str
) -> Iterator[dict[str, np.ndarray | pa.Array]]:
    """Each mask group's tidy decision rows with each example's id, read through `row` (its
    index in the seed's test rows, in the order `ScoresTable.test_scores` takes them): one group
    at a time, so that a large sweep's table is never whole in memory."""
    test_ids: dict[int, pa.Array] = {}  # Arrow strings: a row's id costs its length, not the longest
    for group in masks:
        if group.seed not in test_ids:
            at = (table.seed == group.seed) & (table.split == "test") & (table.arch == arch)
            test_ids[group.seed] = pa.array(table.id[at].astype(str).tolist(), type=pa.string())
        columns = group.columns()
        yield {"id": test_ids[group.seed].take(columns["row"]), **columns}


def calibrate_scores(
    scores_path: Path, out: Path | RunLayout, config: SweepConfig | None = None, *, arch: str | None = None
) -> dict:
    """Run the policy sweep on a scores table and write it to the folder `out`, or for a run
    (`out` its RunLayout) to the run's sweep of the arch and merge rule, calibrate/ARCH[/merge-RULE]/,
    which its report reads: sweep.csv (tidy), groups.csv (the group-conditional table of the same
    masks, calibrate.GROUP_COLUMNS), decisions.parquet (the same masks per example, with its id),
    ltt.jsonl (one audit record per calibrated row), baselines.csv and summary.json (with every
    SweepConfig field, so that a reader can rebuild the config). Returns the summary. Checks
    everything before writing anything, and replaces a previous sweep's files together."""
    config = config or SweepConfig()
    started = time.perf_counter()
    if not isinstance(out, RunLayout):
        out = Path(out)
        if out.exists() and not out.is_dir():
            raise InputError(f"--out {out}: exists and is not a folder")
    table = read_scores(scores_path)
    if table.stages > 1:
        raise InputError(
            f"{scores_path}: a cascade of {table.stages} experts; sweep it with --budget B1,B2 (one each)"
        )
    arch = table.arch_name(arch)
    out_dir = out.sweep(arch, config.merge).root if isinstance(out, RunLayout) else out
    files = SweepLayout(out_dir)
    by_seed = table.test_scores(arch)
    check_calibration_size(
        by_seed,
        table.source,
        min(config.budgets),
        config.delta,
        option="--budgets",
        cal_fraction=config.cal_fraction,
        est_fraction=config.est_fraction,
    )
    if config.error_level is not None:
        check_calibration_size(
            by_seed,
            table.source,
            config.error_level,
            config.delta,
            option=f"--accuracy {config.accuracy:g}: the error level",
            cal_fraction=config.cal_fraction,
            est_fraction=config.est_fraction,
        )
    result = calibrate.sweep(by_seed, config)
    elapsed = time.perf_counter() - started
    largest = max(config.batch_sizes)
    at_largest = {k: v[result.table["batch_size"] == largest] for k, v in result.table.items()}
    summary = {
        "scores": str(scores_path),
        "arch": arch,
        "out": str(out_dir),
        "table": str(files.table),
        "rows": int(result.table["seed"].size),
        "groups_table": str(files.groups),
        "group_rows": int(result.groups["seed"].size),
        "seeds": table.seeds,
        # Every SweepConfig field (tuples as lists): the report rebuilds the config from these.
        **_settings(config),
        "baselines": {
            k: float(np.mean(v)) for k, v in result.baselines.items() if k not in ("seed", "n_eval")
        },
        # How well the DV score ranks the true delegation value, on each seed's test split.
        "dv_quality": {
            str(seed): {"n": q.n, "mse": q.mse, "spearman": q.spearman}
            for seed, scores in by_seed.items()
            for q in [calibrate.dv_quality(scores.dv, scores.value)]
        },
        # Means over budgets and seeds at the largest batch size: one number per curve.
        "mean_over_budgets": _mean_by(at_largest, ("objective", "policy"), ("auroc", "accuracy", "realised")),
        **_joint_counts(config, at_largest),
        "elapsed_s": round(elapsed, 3),
    }
    # Written into a staging folder inside, then renamed in: a sweep killed while writing leaves the
    # previous one whole (a run's report reads these files together), not a new sweep.csv over old
    # decisions; the next sweep removes what a killed one staged.
    with staging_folder(out_dir, ".sweep.") as staged:
        staging = SweepLayout(staged)
        write_table(staging.table, result.table)
        write_table(staging.groups, result.groups)
        write_parquet_parts(
            staging.decisions,
            _with_ids(result.decision_masks, table, arch),
            empty=lambda: {"id": np.array([], dtype=str), **result.decisions},  # no masks: no rows
        )
        write_table(staging.baselines, result.baselines)
        write_jsonl(staging.ltt, result.ltt)
        write_json(staging.summary, summary)
        for staged_file, final in zip(staging.files, files.files, strict=True):  # summary.json last
            os.replace(staged_file, final)
    return summary


def validate_scores(
    scores_path: Path,
    *,
    mode: calibrate.ValidationMode,
    alphas: tuple[float, ...],
    config: ValidationConfig,
    arch: str | None = None,
    eval_scores: Path | None = None,
    out: Path | None = None,
) -> tuple[ValidationResult, ...]:
    """Guarantee validation over random calibration samples at every level of `alphas` (one
    result each, on the same splits), measured on the evaluation rest, the population (split minus D_est)
    and, with `eval_scores`, an independent table; with `out`, also write the per-trial table
    (every level, column `alpha`). Checks everything before computing anything."""
    by_seed, fresh = _validation_tables(
        scores_path, {"--alpha": min(alphas)}, config, arch=arch, eval_scores=eval_scores, out=out
    )
    results = calibrate.validate_levels(by_seed, mode=mode, alphas=alphas, config=config, fresh=fresh)
    _write_trials(results, out)
    return results


def validate_joint_scores(
    scores_path: Path,
    *,
    level: calibrate.JointLevel,
    config: ValidationConfig,
    arch: str | None = None,
    eval_scores: Path | None = None,
    out: Path | None = None,
) -> ValidationResult:
    """`validate_scores` for joint control: every risk of `level` certified at one threshold
    (`calibrate.validate_joint`), `config.selection` choosing among the certified ones; with `out`,
    the per-trial table (columns `budget_level`, `error_level`, per-risk violations). Checks
    everything before computing anything: D_cal must be able to certify the budget and error
    levels (the false-negative level is tested on the positives, whose number varies)."""
    (result,) = validate_joint_levels(
        scores_path, levels=(level,), config=config, arch=arch, eval_scores=eval_scores, out=out
    )
    return result


def validate_joint_levels(
    scores_path: Path,
    *,
    levels: tuple[calibrate.JointLevel, ...],
    config: ValidationConfig,
    arch: str | None = None,
    eval_scores: Path | None = None,
    out: Path | None = None,
) -> tuple[ValidationResult, ...]:
    """`validate_joint_scores` at every joint level of `levels` (one result each, on the same
    splits; the per-trial table holds them all); the smallest budget and error level are checked."""
    named = {
        "--budget": [level.budget for level in levels if level.budget is not None],
        "--accuracy's error level": [level.error for level in levels if level.error is not None],
    }
    checked = {option: min(alphas) for option, alphas in named.items() if alphas}
    by_seed, fresh = _validation_tables(
        scores_path, checked, config, arch=arch, eval_scores=eval_scores, out=out
    )
    results = calibrate.validate_joint(by_seed, levels=levels, config=config, fresh=fresh)
    _write_trials(results, out)
    return results


def _validation_tables(
    scores_path: Path,
    levels: dict[str, float],
    config: ValidationConfig,
    *,
    arch: str | None,
    eval_scores: Path | None,
    out: Path | None,
) -> tuple[dict[int, calibrate.Scores], dict[int, calibrate.Scores] | None]:
    """The test splits to validate on and the fresh ones to measure on, checked: `out` is
    writable, and D_cal can certify each level of `levels` (by the option that set it)."""
    if out is not None:
        read = [("--scores", scores_path)] + ([("--eval-scores", eval_scores)] if eval_scores else [])
        check_writable(out, "--out", inputs=read)
    table = read_scores(scores_path)
    by_seed = table.test_scores(arch)
    for option, alpha in levels.items():
        check_calibration_size(
            by_seed,
            table.source,
            alpha,
            config.delta,
            option=option,
            est_fraction=config.est_fraction,
            cal_size=config.cal_size,
        )
    fresh = None
    if eval_scores is not None:
        fresh_table = read_scores(eval_scores, purpose="measure on")
        name = arch or table.archs[0]  # test_scores above made sure the choice is unambiguous
        if name not in fresh_table.archs:
            raise InputError(
                f"--eval-scores {eval_scores}: column 'arch' has no {name!r} (it has "
                f"{', '.join(fresh_table.archs)})"
            )
        fresh = fresh_table.test_scores(name)
        missing = [s for s in by_seed if s not in fresh]
        if missing:
            raise InputError(
                f"--eval-scores {eval_scores}: no test rows for probe seed {missing[0]} "
                f"(--scores has seeds {', '.join(map(str, sorted(by_seed)))})"
            )
    return by_seed, fresh


def _write_trials(results: tuple[ValidationResult, ...], out: Path | None) -> None:
    if out is not None:
        trials_table = {k: np.concatenate([r.per_trial[k] for r in results]) for k in results[0].per_trial}
        write_table(Path(out), trials_table)


CALIBRATE_SETTINGS: tuple[str, ...] = (
    "budgets",
    "batch_sizes",
    "delta",
    "objectives",
    "merge_controls",
    "pvalue",
)
"""The RunConfig fields the calibrate stage's outputs depend on (with the scores table)."""


@dataclass(frozen=True)
class CalibrateStage:
    """`ctd eval`'s calibrate stage: one `calibrate_scores` sweep per probe configuration into
    calibrate/ARCH/, and with merge controls one more per merge rule (calibrate/ARCH/merge-RULE/)."""

    ctx: RunContext
    name: ClassVar[str] = "calibrate"

    def fingerprint(self) -> tuple[str, dict[str, Any]]:
        inputs = {"scores": file_sha256(self.ctx.layout.scores)}
        return fingerprint(
            {"inputs": inputs, "settings": self.ctx.config.section(*CALIBRATE_SETTINGS)}
        ), inputs

    def reusable(self) -> bool:
        return True

    def outputs(self) -> list[Path]:
        return [self.ctx.layout.calibrate]

    def run(self) -> StageResult:
        ctx, config, layout = self.ctx, self.ctx.config, self.ctx.layout
        shutil.rmtree(layout.calibrate, ignore_errors=True)  # no stale merge controls or archs
        merges: list[MergeChoice] = (
            ["default", "overwrite", "average"] if config.merge_controls else ["default"]
        )
        archs = read_scores(layout.scores).archs
        total, done, parts = len(archs) * len(merges), 0, []
        for arch in archs:
            for merge in merges:
                ctx.progress("calibrate", done, total, unit="sweeps")
                sweep = config.sweep_config(merge)
                summary = calibrate_scores(layout.scores, layout, sweep, arch=arch)
                done += 1
                if merge == "default":
                    parts.append(f"{arch}: {summary['rows']} rows")
        ctx.progress("calibrate", total, total, unit="sweeps")
        return StageResult("; ".join(parts))

    def check_outputs(self) -> None:
        return None
