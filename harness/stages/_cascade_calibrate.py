"""Library API behind `ctd calibrate --budget B1,B2[,...]` on a cascade of experts: the K-stage
sweep (`calibrate.cascade_sweep`) of a scores table with the expert_K and dv_K columns, files in,
files out (sweep.csv, baselines.csv, summary.json, in the folder `SweepLayout` names)."""

from __future__ import annotations

import time
from dataclasses import fields
from itertools import product
from pathlib import Path

import numpy as np

import calibrate

from .._errors import InputError
from ..data import read_scores, write_json, write_table
from ..run import SweepLayout
from ._calibrate import check_calibration_size

__all__ = ["calibrate_cascade_scores", "check_budget_count"]


def _settings(config: calibrate.CascadeSweepConfig) -> dict[str, object]:
    """The config's fields, each level as {risk name: level} (the policies only when not CTD alone)."""
    skip = ("levels",) if config.by_policy else ("levels", "policies")
    out: dict[str, object] = {f.name: getattr(config, f.name) for f in fields(config) if f.name not in skip}
    return {"levels": [dict(level.named()) for level in config.levels], **out}


def _option(risk: str) -> str:
    """The option that set a risk's level, as an error message names it."""
    if risk.startswith("budget-"):
        return f"--budget (expert {risk.removeprefix('budget-')})"
    return {"error": "--accuracy: the error level", "abstain": "--abstain"}[risk]


def check_budget_count(path: Path, stages: int, budgets: int) -> None:
    """One budget per expert: an InputError naming --budget when `budgets` is not `stages`."""
    if stages != budgets:
        raise InputError(
            f"--budget: {budgets} budget(s), one per expert, but {path} holds a cascade of "
            f"{stages} (columns expert, expert_2, ...)"
        )


def _finite_mean(values: np.ndarray) -> float | None:
    kept = values[~np.isnan(values)]
    return float(kept.mean()) if kept.size else None


def calibrate_cascade_scores(
    scores_path: Path,
    out_dir: Path,
    config: calibrate.CascadeSweepConfig,
    *,
    arch: str | None = None,
) -> tuple[dict, dict[str, np.ndarray]]:
    """Sweep the cascade of `scores_path` at every level of `config` and write sweep.csv (one
    row per seed and level, `calibrate.cascade_sweep_columns`), baselines.csv and summary.json
    (the settings, and per level, and policy when the config sweeps policies beyond CTD, the
    mean over seeds of every realised rate and how many seeds certified a configuration).
    Returns the summary and the sweep table; checks everything before writing."""
    started = time.perf_counter()
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out {out_dir}: exists and is not a folder")
    table = read_scores(scores_path)
    check_budget_count(scores_path, table.stages, config.stages)
    by_seed = table.cascade_scores(arch)
    for level in config.levels:
        for name, alpha in level.named():
            check_calibration_size(
                by_seed,  # type: ignore[arg-type]  # reads .n and .label, which a cascade has
                table.source,
                alpha,
                config.delta,
                option=_option(name),
                cal_fraction=config.cal_fraction,
                est_fraction=config.est_fraction,
            )
    result = calibrate.cascade_sweep(by_seed, config)
    files = SweepLayout(out_dir)
    rates = ["n_certified", *(f"calls_{k}" for k in range(1, config.stages + 1))]
    rates += ["error", "abstained", "accuracy"]
    levels = []
    for (a, level), policy in product(enumerate(config.levels), config.policies):
        rows = result.table["level"] == a
        if config.by_policy:
            rows &= result.table["policy"] == policy
        chosen = ~np.isnan(result.table["margin"][rows])
        levels.append(
            {
                "levels": dict(level.named()),
                **({"policy": policy} if config.by_policy else {}),
                "seeds_certified": int(chosen.sum()),
                "seeds": int(rows.sum()),
                "mean": {r: _finite_mean(result.table[r][rows].astype(np.float64)) for r in rates},
            }
        )
    summary = {
        "mode": "cascade",
        "scores": str(scores_path),
        "arch": arch or table.archs[0],
        "out": str(out_dir),
        "table": str(files.table),
        "rows": int(result.table["seed"].size),
        "stages": config.stages,
        "seeds": table.seeds,
        **_settings(config),
        "baselines": {
            k: float(np.mean(v)) for k, v in result.baselines.items() if k not in ("seed", "n_eval")
        },
        "by_level": levels,
        "elapsed_s": round(time.perf_counter() - started, 3),
    }
    write_table(files.table, result.table)
    write_table(files.baselines, result.baselines)
    write_json(files.summary, summary)
    return summary, result.table
