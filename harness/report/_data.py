"""What `ctd report` reads from a finished run folder, and the cheap numbers it derives from it.

Everything here is file -> numbers: the sweep tables written by `calibrate_scores` (sweep.csv,
groups.csv, baselines.csv, summary.json with the SweepConfig) and the validation records; what
the report shows of the DV probe itself is in `_dv_data`. No stage is re-run: the report reads
the numbers the stages computed.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from numpy.typing import NDArray

import calibrate
from calibrate import POLICIES, SweepConfig

from .._errors import InputError
from ..data import BINARY_SUFFIX, RawTable, read_table
from ..run import SweepLayout

__all__ = [
    "BINARY_SUFFIX",
    "GAIN_BASELINES",
    "Curve",
    "GainCurve",
    "GroupResult",
    "Sweep",
    "curves",
    "gain_curves",
    "group_result",
    "mean_std",
    "paired_gain",
    "read_config_text",
    "read_sweep",
    "seed_mean",
]

# The policies of the report's group table.
GROUP_POLICIES: tuple[str, ...] = ("ctd", "unc-topk")
_INTEGER_COLUMNS = ("seed", "batch_size", "n_certified", "n_eval", "trials", "n", "n_delegated")
# A swept budget read back from a file matches a fixed budget up to float noise, never more.
_ON_GRID = 1e-9
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


def read_config_text(path: Path) -> str | None:
    """The run's config.toml as text (None when absent), shown in the report's header."""
    if not path.exists():
        return None
    return path.read_text(encoding="utf-8", errors="replace")


# ---------------------------------------------------------------- the sweep


@dataclass(frozen=True)
class Sweep:
    """One `calibrate_scores` output folder: the tidy sweep, the baselines, the summary and the
    SweepConfig it ran with (from summary.json), and the group table (None when the folder has
    no groups.csv)."""

    folder: Path
    table: dict[str, NDArray]
    baselines: dict[str, NDArray]
    summary: dict[str, Any]
    config: SweepConfig
    groups: dict[str, NDArray] | None

    @property
    def files(self) -> SweepLayout:
        return SweepLayout(self.folder)

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

    def grid_point(self, budget: float) -> float | None:
        """The swept budget that is `budget` (equal up to float noise), None when the grid lacks
        it: the report never reads another budget in its place."""
        found = self.budgets[np.abs(self.budgets - budget) <= _ON_GRID]
        return float(found[0]) if found.size else None

    def rows(self, **equal: object) -> NDArray[np.bool_]:
        mask = np.ones(self.table["seed"].size, bool)
        for name, value in equal.items():
            mask &= self.table[name] == value
        return mask

    def baseline(self, name: str) -> tuple[float, float]:
        return mean_std(self.baselines[name])


def _sweep_config(summary: dict[str, Any], source: Path) -> SweepConfig:
    """The SweepConfig from summary.json, which `calibrate_scores` writes with every field (a
    setting whose default is None, such as `accuracy`, only when it is set)."""
    missing = [f.name for f in fields(SweepConfig) if f.name not in summary and f.default is not None]
    if missing:
        raise InputError(f"{source}: no {missing[0]!r} setting (run `ctd calibrate` for this run again)")
    values = {f.name: summary[f.name] for f in fields(SweepConfig) if f.name in summary}
    try:
        return SweepConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
    except (TypeError, ValueError) as exc:
        raise InputError(f"{source}: settings do not form a sweep configuration ({exc})") from None


def _read_groups(path: Path) -> dict[str, NDArray] | None:
    if not path.is_file():
        return None
    raw = read_table(path)
    _require(raw, calibrate.GROUP_COLUMNS)
    return _columns(raw, ("policy", "objective", "group"))


@dataclass(frozen=True)
class Decisions:
    """Rows of a sweep's decisions.parquet (calibrate.DECISION_COLUMNS plus id)."""

    columns: dict[str, NDArray]

    def at(self, *, policy: str, budget: float, objective: str, batch_size: int) -> NDArray[np.bool_]:
        """The rows of one mask; calibrated policies are written per objective (any batch size),
        top-k ones per batch size (any objective)."""
        c = self.columns
        rows = (c["policy"] == policy) & (np.abs(c["budget"].astype(np.float64) - budget) <= 1e-9)
        if calibrate.POLICIES[policy].calibrated:
            return rows & (c["objective"] == objective)
        return rows & (c["batch_size"] == batch_size)


def read_decisions(sweep: Sweep, budgets: Sequence[float]) -> Decisions | None:
    """The rows of the sweep's decisions.parquet that show one example's decisions (the report's
    per-example table and case studies, `ctd export inspect`): calibrated policies as selected
    for AUROC, top-k at the largest batch size, at `budgets` (points of the sweep's grid). Read
    through a filter, a row group at a time: the whole file of a 100,000-row test split has 37
    million rows. None when the file is absent."""
    path = sweep.files.decisions
    if not path.is_file():
        return None
    try:  # an empty table written before its columns were typed has float `objective` values
        empty = pq.ParquetFile(path).metadata.num_rows == 0
    except (pa.ArrowException, OSError):
        empty = False  # read_table names the file
    field = pc.field
    near = [(field("budget") >= b - 1e-9) & (field("budget") <= b + 1e-9) for b in budgets]
    where = (
        field("objective").isin([sweep.objective_for("auroc"), calibrate.ANY_OBJECTIVE])
        & field("batch_size").isin([max(sweep.batch_sizes), calibrate.ANY_BATCH_SIZE])
        & functools.reduce(operator.or_, near, pc.scalar(False))
    )
    return Decisions(read_table(path, where=None if empty else where).columns)


def read_sweep(folder: Path) -> Sweep:
    """Read a `calibrate_scores` output folder; a missing or malformed file is an InputError
    (groups.csv may be absent, so that a run calibrated before it existed still gets a report
    whose group section says what is missing; it may not be malformed)."""
    files = SweepLayout(folder)
    for path in files.required:
        if not path.is_file():
            raise InputError(f"{path}: no such file (run `ctd calibrate` for this run first)")
    raw = read_table(files.table)
    _require(raw, calibrate.SWEEP_COLUMNS)
    table = _columns(raw, ("policy", "merge", "objective"))
    if table["seed"].size == 0:
        raise InputError(f"{raw.path}: the table has no rows")
    raw_baselines = read_table(files.baselines)
    _require(raw_baselines, ("seed", "probe_auroc", "probe_accuracy", "expert_auroc", "expert_accuracy"))
    summary = _read_json(files.summary)
    return Sweep(
        folder=folder,
        table=table,
        baselines=_columns(raw_baselines, ()),
        summary=summary,
        config=_sweep_config(summary, files.summary),
        groups=_read_groups(files.groups),
    )


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


# ---------------------------------------------------------------- paired per-seed gains

# What CTD's gain is measured against: the probe alone (baselines.csv) and a sweep policy.
GAIN_BASELINES: tuple[str, ...] = ("probe", "unc-topk")


def _by_seed(seeds: NDArray, values: NDArray) -> dict[int, float]:
    return {int(s): float(v) for s, v in zip(seeds, values, strict=True)}


def paired_gain(
    sweep: Sweep, metric: str, *, versus: str, budget: float, batch_size: int
) -> NDArray[np.float64]:
    """CTD minus `versus` (GAIN_BASELINES) in `metric` per seed, ascending seed, at one swept
    budget: each seed's CTD against the same seed's probe or policy on the same evaluation half
    (seeds missing on either side, or NaN, are left out). Rows selected for `metric`'s objective."""
    objective = sweep.objective_for(metric)

    def cells(policy: str) -> dict[int, float]:
        rows = sweep.rows(policy=policy, objective=objective, batch_size=batch_size, budget=budget)
        return _by_seed(sweep.table["seed"][rows], sweep.table[metric][rows])

    ctd = cells("ctd")
    if versus == "probe":
        other = _by_seed(sweep.baselines["seed"], sweep.baselines[f"probe_{metric}"])
    else:
        other = cells(versus)
    differences = np.array([ctd[s] - other[s] for s in sorted(ctd.keys() & other.keys())], np.float64)
    return differences[np.isfinite(differences)]


@dataclass(frozen=True)
class GainCurve:
    """CTD minus `versus` against target budget: the mean of the per-seed differences, and the
    smallest (low) and largest (high) of them; `seeds` paired at every budget."""

    versus: str
    budgets: NDArray[np.float64]
    mean: NDArray[np.float64]
    low: NDArray[np.float64]
    high: NDArray[np.float64]
    seeds: int


def gain_curves(sweep: Sweep, metric: str, *, batch_size: int) -> list[GainCurve]:
    """The paired gain of CTD over each of GAIN_BASELINES the sweep holds, at every budget."""
    out = []
    for versus in GAIN_BASELINES:
        if (versus != "probe" and versus not in sweep.policies) or "ctd" not in sweep.policies:
            continue
        found = [
            paired_gain(sweep, metric, versus=versus, budget=b, batch_size=batch_size) for b in sweep.budgets
        ]
        stats = [(d.mean(), d.min(), d.max()) if d.size else (np.nan,) * 3 for d in found]
        mean, low, high = (np.array(column, np.float64) for column in zip(*stats, strict=True))
        seeds = min((d.size for d in found), default=0)
        out.append(GainCurve(versus, sweep.budgets, mean, low, high, seeds))
    return out


# ---------------------------------------------------------------- group table


@dataclass(frozen=True)
class GroupResult:
    """The group-conditional table at one swept budget, averaged over seeds: per group, n (summed
    over the seeds' evaluation halves), the seeds it appears in, mean v of all its rows, and per
    policy of GROUP_POLICIES the delegation rate and the mean v of the delegated rows (NaN for a
    policy the sweep did not run)."""

    budget: float
    objective: str
    batch_size: int
    rows: list[dict[str, Any]]


def group_result(
    groups: dict[str, NDArray], *, budget: float, objective: str, batch_size: int
) -> GroupResult:
    """Read one budget (a grid point of the sweep) of a groups.csv table, averaged over seeds."""
    at = (
        (groups["budget"] == budget)
        & (groups["objective"] == objective)
        & (groups["batch_size"] == batch_size)
    )
    rows = []
    for name in sorted(set(groups["group"][at].tolist())):
        in_group = at & (groups["group"] == name)
        first = in_group & (groups["policy"] == groups["policy"][in_group][0])  # n, mean v all: any policy
        entry: dict[str, Any] = {
            "group": name,
            "n": int(groups["n"][first].sum()),
            "seeds": int(first.sum()),
            "mean_v_all": seed_mean(groups["mean_v_all"][first]),
        }
        for policy in GROUP_POLICIES:
            chosen = in_group & (groups["policy"] == policy)
            entry[f"rate_{policy}"] = seed_mean(groups["delegation_rate"][chosen])
            entry[f"mean_v_{policy}"] = seed_mean(groups["mean_v_selected"][chosen])
        rows.append(entry)
    return GroupResult(budget=budget, objective=objective, batch_size=batch_size, rows=rows)
