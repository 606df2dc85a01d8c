"""What `ctd report` reads from a finished run folder, and the cheap numbers it derives from it.

Everything here is file -> numbers: the sweep tables written by `calibrate_scores`, the
validation records, and a few millisecond-scale library calls on the scores table (group
table, DV quality, mean v at top-k). Nothing is re-run that takes longer than that.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

import calibrate
from calibrate import POLICIES, SweepConfig

from .._errors import InputError
from ..data._tables import RawTable, read_table

__all__ = [
    "BINARY_SUFFIX",
    "MEAN_V_FRACTIONS",
    "Curve",
    "GroupResult",
    "Sweep",
    "curves",
    "dv_quality_rows",
    "group_result",
    "mean_std",
    "mean_value_curves",
    "nearest_budget",
    "read_run_config",
    "read_sweep",
    "seed_mean",
]

SWEEP_FILES: tuple[str, ...] = ("sweep.csv", "baselines.csv", "summary.json")
# A scores-table arch "<arch>-binary" holds a DV probe trained on v_bin; it pairs with "<arch>".
BINARY_SUFFIX = "-binary"
MEAN_V_FRACTIONS: NDArray[np.float64] = np.round(np.linspace(0.01, 1.0, 100), 6)  # k/N = 0.01, ..., 1
_INTEGER_COLUMNS = ("seed", "batch_size", "n_certified", "n_eval", "trials")
_TRUE, _FALSE = ("true", "1"), ("false", "0")


def mean_std(values: NDArray[np.float64]) -> tuple[float, float]:
    """Mean and (population) standard deviation over the finite entries; NaN when none."""
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return float("nan"), float("nan")
    return float(finite.mean()), float(finite.std())


def seed_mean(values: NDArray[np.float64]) -> float:
    return mean_std(values)[0]


# ---------------------------------------------------------------- reading tables


def _cell_float(raw: RawTable, name: str, i: int, value: object) -> float:
    text = str(value).strip()
    if value is None or text == "":
        return float("nan")
    if text.lower() in _TRUE or text.lower() in _FALSE:
        return float(text.lower() in _TRUE)
    try:
        return float(text)
    except ValueError:
        raise InputError(f"{raw.path}: column '{name}', {raw.where(i)}: {value!r} is not a number") from None


def _columns(raw: RawTable, text: tuple[str, ...]) -> dict[str, NDArray]:
    """Parse a table read by `read_table`: `text` columns stay strings, the rest become floats
    (booleans 0/1, empty cells NaN), and known count columns integers."""
    out: dict[str, NDArray] = {}
    for name, values in raw.columns.items():
        if name in text:
            out[name] = values.astype(str)
            continue
        if values.dtype.kind in "fiub":
            numbers = values.astype(np.float64)
        else:
            numbers = np.array([_cell_float(raw, name, i, v) for i, v in enumerate(values)], np.float64)
        out[name] = numbers.astype(np.int64) if name in _INTEGER_COLUMNS else numbers
    return out


def _require(raw: RawTable, names: tuple[str, ...]) -> None:
    missing = [n for n in names if n not in raw.columns]
    if missing:
        raise InputError(f"{raw.path}: missing column {missing[0]!r}")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise InputError(f"{path}: no such file")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(value, dict):
        raise InputError(f"{path}: expected a JSON object")
    return value


def read_run_config(path: Path) -> tuple[str | None, dict[str, Any]]:
    """The run's config.toml as text and parsed (empty when absent or unparsable)."""
    if not path.exists():
        return None, {}
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return text, {}


# ---------------------------------------------------------------- the sweep


@dataclass(frozen=True)
class Sweep:
    """One `calibrate_scores` output folder: the tidy sweep, the baselines and the summary,
    plus the SweepConfig it ran with (settings absent from summary.json are read from the run
    config's [calibrate] table, else SweepConfig's defaults)."""

    folder: Path
    table: dict[str, NDArray]
    baselines: dict[str, NDArray]
    summary: dict[str, Any]
    config: SweepConfig

    @property
    def batch_sizes(self) -> list[int]:
        return sorted(int(b) for b in np.unique(self.table["batch_size"]))

    @property
    def budgets(self) -> NDArray[np.float64]:
        return np.unique(self.table["budget"])

    @property
    def policies(self) -> list[str]:
        present = set(self.table["policy"].tolist())
        return [p for p in POLICIES if p in present]

    @property
    def objectives(self) -> list[str]:
        present = set(self.table["objective"].tolist())
        return [o for o in calibrate.OBJECTIVES if o in present] + sorted(present - set(calibrate.OBJECTIVES))

    def objective_for(self, metric: str) -> str:
        """The Pareto objective shown with a metric: the metric itself when it was swept."""
        return metric if metric in self.objectives else self.objectives[0]

    def rows(self, **equal: object) -> NDArray[np.bool_]:
        mask = np.ones(self.table["seed"].size, bool)
        for name, value in equal.items():
            mask &= self.table[name] == value
        return mask

    def baseline(self, name: str) -> tuple[float, float]:
        return mean_std(self.baselines[name])


def _sweep_config(summary: dict[str, Any], run_config: dict[str, Any], source: Path) -> SweepConfig:
    section = run_config.get("calibrate", {})
    section = section if isinstance(section, dict) else {}
    values: dict[str, Any] = {}
    for f in fields(SweepConfig):
        value = summary.get(f.name, section.get(f.name))
        if value is not None:
            values[f.name] = tuple(value) if isinstance(value, list) else value
    try:
        return SweepConfig(**values)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{source}: settings do not form a sweep configuration ({exc})") from None


def read_sweep(folder: Path, run_config: dict[str, Any]) -> Sweep:
    """Read a `calibrate_scores` output folder; a missing or malformed file is an InputError."""
    for name in SWEEP_FILES:
        if not (folder / name).is_file():
            raise InputError(f"{folder / name}: no such file (run `ctd calibrate` for this run first)")
    raw = read_table(folder / "sweep.csv")
    _require(raw, calibrate.SWEEP_COLUMNS)
    table = _columns(raw, ("policy", "merge", "objective"))
    if table["seed"].size == 0:
        raise InputError(f"{raw.path}: the table has no rows")
    raw_baselines = read_table(folder / "baselines.csv")
    _require(raw_baselines, ("seed", "probe_auroc", "probe_accuracy", "expert_auroc", "expert_accuracy"))
    summary = _read_json(folder / "summary.json")
    return Sweep(
        folder=folder,
        table=table,
        baselines=_columns(raw_baselines, ()),
        summary=summary,
        config=_sweep_config(summary, run_config, folder / "summary.json"),
    )


def nearest_budget(sweep: Sweep, target: float) -> float:
    """The swept budget closest to `target` (the default grid has no 0.1, 0.2 or 0.3)."""
    budgets = sweep.budgets
    return float(budgets[np.argmin(np.abs(budgets - target))])


@dataclass(frozen=True)
class Curve:
    """One policy's metric against target budget: mean and std over seeds."""

    policy: str
    budgets: NDArray[np.float64]
    mean: NDArray[np.float64]
    std: NDArray[np.float64]
    seeds: int


def curves(sweep: Sweep, metric: str, *, objective: str, batch_size: int) -> list[Curve]:
    """Every policy's `metric` (auroc, accuracy, realised) at one batch size; calibrated policies
    are the rows selected with `objective` (top-k rows repeat across objectives)."""
    out = []
    for policy in sweep.policies:
        rows = sweep.rows(policy=policy, objective=objective, batch_size=batch_size)
        budgets = np.unique(sweep.table["budget"][rows])
        stats = [mean_std(sweep.table[metric][rows & (sweep.table["budget"] == b)]) for b in budgets]
        if not stats:
            continue
        mean, std = (np.array(s) for s in zip(*stats, strict=True))
        seeds = np.unique(sweep.table["seed"][rows]).size
        out.append(Curve(policy=policy, budgets=budgets, mean=mean, std=std, seeds=seeds))
    return out


def value_at(
    sweep: Sweep, metric: str, *, policy: str, objective: str, budget: float, batch_size: int
) -> float:
    """Mean over seeds of one sweep cell."""
    rows = sweep.rows(policy=policy, objective=objective, batch_size=batch_size, budget=budget)
    return seed_mean(sweep.table[metric][rows])


# ---------------------------------------------------------------- group table


@dataclass(frozen=True)
class GroupResult:
    """The group-conditional table at one budget, averaged over seeds, with how it was made."""

    budget: float
    objective: str
    batch_size: int
    rows: list[dict[str, Any]]
    # Whether the recomputed CTD and unc-topk delegation rates equal sweep.csv's realised rates
    # (None when the budget is not on the sweep's grid).
    matches_sweep: bool | None


def _group_masks(
    scores: calibrate.Scores,
    config: SweepConfig,
    seed: int,
    *,
    budget: float,
    objective: str,
    batch_size: int,
) -> tuple[NDArray[np.int64], dict[str, NDArray[np.bool_]]]:
    """The sweep's evaluation half of one seed and the CTD and unc-topk masks on it at `budget`,
    recomputed exactly as `calibrate.sweep` does (same split seed, grid and tests)."""
    splits = calibrate.random_splits(
        scores.n,
        1,
        [config.split_seed, seed],
        cal_fraction=config.cal_fraction,
        est_fraction=config.est_fraction,
    )
    evaluation = splits.evaluation[0]
    ctd = POLICIES["ctd"]
    signal = calibrate.policy_signal(scores, ctd, splits)
    (candidates,) = calibrate.threshold_candidates(
        scores,
        signal,
        splits,
        merge=config.merge_for(ctd),
        objective=objective if config.pareto else None,
        n_grid=config.n_grid,
    )
    result = calibrate.budget_control(
        candidates, alpha=budget, delta=config.delta, fwer=config.fwer, pareto=config.pareto
    )
    unc = calibrate.policy_signal(scores, POLICIES["unc-topk"], splits)[0][evaluation]
    return evaluation, {
        "ctd": signal[0][evaluation] > result.threshold,
        "unc-topk": calibrate.topk_mask(unc, [budget], batch_size)[0],
    }


def group_result(
    by_seed: dict[int, calibrate.Scores], sweep: Sweep, *, budget: float, batch_size: int
) -> GroupResult:
    """`calibrate.group_table` per seed on the sweep's evaluation half, averaged over seeds."""
    objective = sweep.objective_for("auroc")
    on_grid = sweep.budgets[np.isclose(sweep.budgets, budget, rtol=0, atol=1e-9)]
    per_seed: list[list[calibrate.GroupRow]] = []
    matches: list[bool] = []
    for seed, scores in sorted(by_seed.items()):
        if scores.group is None:
            continue
        evaluation, masks = _group_masks(
            scores, sweep.config, seed, budget=budget, objective=objective, batch_size=batch_size
        )
        per_seed.append(calibrate.group_table(scores.value[evaluation], scores.group[evaluation], masks))
        compared = [p for p in masks if p in sweep.policies] if on_grid.size else []
        for policy in compared:
            mask = masks[policy]
            rows = sweep.rows(
                policy=policy, seed=seed, objective=objective, batch_size=batch_size, budget=on_grid[0]
            )
            matches.append(bool(rows.any()) and bool(np.allclose(sweep.table["realised"][rows], mask.mean())))
    return GroupResult(
        budget=budget,
        objective=objective,
        batch_size=batch_size,
        rows=_average_groups(per_seed),
        matches_sweep=all(matches) if matches else None,
    )


def _average_groups(per_seed: list[list[calibrate.GroupRow]]) -> list[dict[str, Any]]:
    groups = sorted({row.group for rows in per_seed for row in rows})
    out = []
    for group in groups:
        rows = [row for seed_rows in per_seed for row in seed_rows if row.group == group]
        entry: dict[str, Any] = {
            "group": group,
            "n": int(sum(r.n for r in rows)),
            "seeds": len(rows),
            "mean_v_all": seed_mean(np.array([r.mean_v_all for r in rows])),
        }
        for policy in ("ctd", "unc-topk"):
            entry[f"rate_{policy}"] = seed_mean(np.array([r.delegation_rate[policy] for r in rows]))
            entry[f"mean_v_{policy}"] = seed_mean(np.array([r.mean_v_selected[policy] for r in rows]))
        out.append(entry)
    return out


# ---------------------------------------------------------------- DV-probe diagnostics


def dv_quality_rows(by_seed: dict[int, calibrate.Scores]) -> list[dict[str, Any]]:
    """`calibrate.dv_quality` of each seed's test rows."""
    rows = []
    for seed, scores in sorted(by_seed.items()):
        q = calibrate.dv_quality(scores.dv, scores.value)
        rows.append({"seed": seed, "n": q.n, "mse": q.mse, "spearman": q.spearman})
    return rows


MEAN_V_SIGNALS: tuple[str, ...] = ("dv", "uncertainty", "oracle")


def mean_value_curves(by_seed: dict[int, calibrate.Scores]) -> dict[str, NDArray[np.float64]]:
    """Mean v of the top-k test rows by each signal, k/N on MEAN_V_FRACTIONS: an array of
    shape (seeds, fractions) per signal, plus "all" (mean v of every row, shape (seeds,)).
    Uncertainty ranks by closeness to the median probe score of the seed's test rows."""
    out: dict[str, list] = {name: [] for name in (*MEAN_V_SIGNALS, "all")}
    for _, scores in sorted(by_seed.items()):
        value = scores.value
        signals = {
            "dv": scores.dv,
            "uncertainty": calibrate.uncertainty_signal(scores.probe, scores.probe),
            "oracle": value,
        }
        for name, signal in signals.items():
            out[name].append(calibrate.mean_value_at_k(signal, value, MEAN_V_FRACTIONS))
        out["all"].append(float(value.mean()))
    return {name: np.array(values, dtype=np.float64) for name, values in out.items()}
