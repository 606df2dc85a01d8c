"""Library API behind `ctd simulate`, `ctd calibrate` and `ctd validate`: files in, files out."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

import calibrate
from calibrate import SweepConfig, ValidationResult

from ._errors import InputError
from ._scores import read_scores, write_scores
from ._simulate import Scenario, simulate_scores
from ._tables import write_json, write_jsonl, write_table

__all__ = [
    "calibrate_scores",
    "check_calibration_size",
    "default_runs_root",
    "resolve_scores",
    "simulate",
    "validate_scores",
]


def default_runs_root() -> Path:
    """Where runs live: $CTD_RUNS_DIR, else ./runs."""
    return Path(os.environ.get("CTD_RUNS_DIR", "runs"))


def resolve_scores(scores: Path | None, run: str | None, runs_root: Path | None = None) -> Path:
    """The scores table named by exactly one of --scores FILE and --run NAME."""
    if (scores is None) == (run is None):
        raise InputError("give exactly one of --scores FILE and --run NAME")
    if scores is not None:
        return Path(scores)
    folder = (runs_root or default_runs_root()) / str(run)
    if not folder.is_dir():
        raise InputError(f"--run {run}: no run folder {folder}")
    path = folder / "scores.parquet"
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
    cal_fraction: float = 0.5,
    est_fraction: float = 0.3,
) -> None:
    """Fail early when a split is empty, or D_cal too small for any threshold to be certified:
    zero losses must reject H: R > alpha, i.e. (1 - alpha)^n_cal <= delta. Also require both
    labels per seed."""
    need = calibrate.min_calibration_size(alpha, delta)
    for seed, scores in by_seed.items():
        n_est, n_cal, n_eval = calibrate.split_sizes(scores.n, cal_fraction, est_fraction)
        if min(n_est, n_eval) < 1:
            raise InputError(
                f"{source}: seed {seed} has {scores.n} test rows, too few for D_est "
                f"({n_est}), D_cal ({n_cal}) and the evaluation half ({n_eval})"
            )
        if n_cal < need:
            raise InputError(
                f"{source}: seed {seed} has {scores.n} test rows, so D_cal holds {n_cal}; "
                f"{option} {alpha:g} with --delta {delta:g} needs at least {need} for any threshold "
                f"to be certified"
            )
        if np.unique(scores.label).size < 2:
            raise InputError(
                f"{source}: column 'label': the test split of seed {seed} has only label "
                f"{int(scores.label[0])}; AUROC and accuracy need both classes"
            )


def simulate(
    scenario: Scenario, n: int, seeds: int, out: Path, *, n_dev: int | None = None, random_state: int = 0
) -> Path:
    """Write a synthetic scores table (see `harness._simulate`)."""
    if Path(out).is_dir():
        raise InputError(f"--out {out}: is a folder, expected a file name (.parquet or .csv)")
    return write_scores(out, simulate_scores(scenario, n, seeds, n_dev=n_dev, random_state=random_state))


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
        leaf[combo[-1]] = {v: float(np.nanmean(table[v][rows])) for v in values}
    return out


def calibrate_scores(
    scores_path: Path, out_dir: Path, config: SweepConfig | None = None, *, arch: str | None = None
) -> dict:
    """Run the policy sweep on a scores table and write it to `out_dir`:
    sweep.csv (tidy), ltt.jsonl (one audit record per calibrated row), baselines.csv and
    summary.json. Returns the summary. Checks everything before writing anything."""
    config = config or SweepConfig()
    started = time.perf_counter()
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out {out_dir}: exists and is not a folder")
    table = read_scores(scores_path)
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
    result = calibrate.sweep(by_seed, config)
    elapsed = time.perf_counter() - started
    largest = max(config.batch_sizes)
    at_largest = {k: v[result.table["batch_size"] == largest] for k, v in result.table.items()}
    summary = {
        "scores": str(scores_path),
        "arch": arch or table.archs[0],
        "out": str(out_dir),
        "table": str(out_dir / "sweep.csv"),
        "rows": int(result.table["seed"].size),
        "seeds": table.seeds,
        "policies": list(config.policies),
        "objectives": list(config.objectives),
        "budgets": list(config.budgets),
        "batch_sizes": list(config.batch_sizes),
        "delta": config.delta,
        "merge": config.merge,
        "fwer": config.fwer,
        "pareto": config.pareto,
        "n_grid": config.n_grid,
        "cal_fraction": config.cal_fraction,
        "est_fraction": config.est_fraction,
        "split_seed": config.split_seed,
        "baselines": {
            k: float(np.mean(v)) for k, v in result.baselines.items() if k not in ("seed", "n_eval")
        },
        # How well the DV score ranks the true delegation value, on each seed's test split.
        "dv_quality": {
            str(seed): {"mse": q.mse, "spearman": q.spearman}
            for seed, scores in by_seed.items()
            for q in [calibrate.dv_quality(scores.dv, scores.value)]
        },
        # Means over budgets and seeds at the largest batch size: one number per curve.
        "mean_over_budgets": _mean_by(at_largest, ("objective", "policy"), ("auroc", "accuracy", "realised")),
        "elapsed_s": round(elapsed, 3),
    }
    write_table(out_dir / "sweep.csv", result.table)
    write_table(out_dir / "baselines.csv", result.baselines)
    write_jsonl(out_dir / "ltt.jsonl", result.ltt)
    write_json(out_dir / "summary.json", summary)
    return summary


def validate_scores(
    scores_path: Path,
    *,
    mode: calibrate.ValidationMode,
    alpha: float,
    delta: float,
    trials: int = 500,
    policy: str = "ctd",
    objective: calibrate.Objective = "auroc",
    pareto: bool = True,
    fwer: calibrate.FWERMethod = "fixed-sequence",
    merge: calibrate.MergeRule | None = None,
    seed: int = 0,
    arch: str | None = None,
    out: Path | None = None,
) -> ValidationResult:
    """Guarantee validation over random splits; with `out`, also write the per-trial table."""
    if out is not None and Path(out).is_dir():
        raise InputError(f"--out {out}: is a folder, expected a file name (.csv or .parquet)")
    table = read_scores(scores_path)
    by_seed = table.test_scores(arch)
    check_calibration_size(by_seed, table.source, alpha, delta, option="--alpha")
    result = calibrate.validate(
        by_seed,
        mode=mode,
        fwer=fwer,
        merge=merge,
        alpha=alpha,
        delta=delta,
        trials=trials,
        policy=policy,
        objective=objective,
        pareto=pareto,
        seed=seed,
    )
    if out is not None:
        write_table(Path(out), result.per_trial)
    return result
