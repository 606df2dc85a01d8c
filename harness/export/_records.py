"""A finished run read for export, one record per (test example, probe seed) of each probe
configuration: its scores, v, each policy's decision at the exported budgets (from the sweep's
own masks, calibrate/ARCH/decisions.parquet) and the cascade's score that follows from it, and
the run's headline numbers. Every file is found through the run's layout objects and read with
the report's readers; nothing is recomputed but v, the merged cascade score and means over seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

import calibrate

from .._errors import InputError
from ..data import ScoresTable, read_scores
from ..report import Sweep, read_decisions, read_sweep
from ..run import JOBS, JOINT_JOB, RunLayout, RunLog, StageStatus, read_job, read_joint_job

__all__ = ["ArchRecords", "ExampleRecord", "Outcome", "check_finished", "read_arch"]

# Stage states that leave a run finished: what `ctd eval` records for a stage it ran or skipped.
_FINISHED = (StageStatus.RAN, StageStatus.SKIPPED)


@dataclass(frozen=True)
class Outcome:
    """One policy's treatment of one example at one budget, on the seed's evaluation half."""

    policy: str
    budget: float
    delegated: bool
    score: float  # the cascade's score: the merged score where delegated, the probe's elsewhere
    correct: bool  # the cascade's score on the label's side of calibrate.DECISION_THRESHOLD
    threshold: float  # calibrated policies: the certified threshold on the signal; top-k: NaN
    signal: float  # the policy's delegation signal for this example
    rank: int | None  # top-k: 1-based rank in its batch
    batch: int | None  # top-k: the batch size it was ranked in


@dataclass(frozen=True)
class ExampleRecord:
    """One test example under one probe seed."""

    id: str
    seed: int
    group: str
    label: int
    probe: float
    dv: float
    expert: float
    v: float
    evaluation: bool  # on the seed's evaluation half (else its calibration half: no decisions)
    outcomes: tuple[Outcome, ...]


@dataclass(frozen=True)
class ArchRecords:
    """Everything exported for one probe configuration."""

    arch: str
    records: list[ExampleRecord]
    seeds: tuple[int, ...]  # every probe seed with test rows (an epoch each), ascending
    budgets: tuple[float, ...]
    policies: tuple[str, ...]
    objective: str  # the objective the calibrated policies' rows were selected for
    batch_size: int  # the batch size of the top-k policies' rows
    headline: dict[str, dict[str, float]]  # score name -> metric -> value (means over seeds)
    sweep: Sweep


def check_finished(run_dir: Path, budgets: tuple[float, ...] | None = None) -> ScoresTable:
    """The run's scores table, once the run is known to be finished: a run folder whose run.json
    records no stage running, failed or interrupted, with a scores table and a sweep per probe
    configuration (with its decisions, and each of `budgets` on its grid). One InputError line
    otherwise, naming the file, the stage or the option."""
    layout = RunLayout(run_dir)
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such run folder")
    if not layout.run_log.is_file() and not layout.scores.is_file():
        raise InputError(f"{run_dir}: not a run folder (no {layout.run_log.name}, no {layout.scores.name})")
    for stage, record in RunLog.read(layout.run_log).stages.items():
        if record.status not in _FINISHED:
            raise InputError(
                f"{layout.run_log}: stage {stage} {record.status.value}; the run is not finished "
                "(finish it with `ctd eval`)"
            )
    if not layout.scores.is_file():
        raise InputError(
            f"{layout.scores}: no such file; the run is not finished (finish it with `ctd eval`)"
        )
    table = read_scores(layout.scores)
    if not np.any(table.split == "test"):
        raise InputError(f"{layout.scores}: no test rows to export")
    for arch in table.archs:
        _on_grid(read_sweep(layout.sweep(arch).root), budgets)  # an InputError naming the file
        if not layout.sweep(arch).decisions.is_file():
            raise InputError(f"{layout.sweep(arch).decisions}: no such file (run `ctd eval` again)")
    return table


def _on_grid(sweep: Sweep, budgets: tuple[float, ...] | None) -> tuple[float, ...]:
    if budgets is None:
        return tuple(float(b) for b in sweep.budgets)
    points = []
    for budget in budgets:
        point = sweep.grid_point(budget)
        if point is None:
            grid = ",".join(f"{b:g}" for b in sweep.budgets)
            raise InputError(f"--budgets {budget:g}: not a budget of the run's sweep ({grid})")
        points.append(point)
    return tuple(points)


def read_arch(
    run_dir: Path, table: ScoresTable, arch: str, *, budgets: tuple[float, ...] | None = None
) -> ArchRecords:
    """The records of one probe configuration: calibrated policies as selected for AUROC, top-k
    ones at the sweep's largest batch size (as the report's per-example table has them), at
    `budgets` (default: every budget of the sweep)."""
    layout = RunLayout(run_dir)
    sweep = read_sweep(layout.sweep(arch).root)
    points = _on_grid(sweep, budgets)
    objective, batch = sweep.objective_for("auroc"), max(sweep.batch_sizes)
    decisions = read_decisions(sweep, points)
    assert decisions is not None  # checked before any reading (`check_finished`)
    policies = tuple(sweep.policies)
    records: list[ExampleRecord] = []
    for seed in table.seeds:
        index = np.flatnonzero((table.seed == seed) & (table.split == "test") & (table.arch == arch))
        label, probe, expert = table.label[index], table.probe[index], table.expert[index]
        outcomes: list[list[Outcome]] = [[] for _ in index]
        evaluated = np.zeros(index.size, bool)
        for policy in policies:
            rule = sweep.config.merge_for(calibrate.POLICIES[policy])
            for budget in points:
                at = decisions.at(policy=policy, budget=budget, objective=objective, batch_size=batch)
                at &= decisions.columns["seed"] == seed
                rows = decisions.columns["row"][at].astype(np.int64)
                delegated = decisions.columns["delegated"][at].astype(bool)
                evaluated[rows] = True
                score = calibrate.cascade_scores(probe[rows], expert[rows], delegated, rule)
                correct = (score >= calibrate.DECISION_THRESHOLD) == (label[rows] == 1)
                threshold = _threshold(sweep, policy, objective, seed, batch, budget)
                topk = not calibrate.POLICIES[policy].calibrated
                signals, ranks = decisions.columns["signal"][at], decisions.columns["batch_rank"][at]
                for j, row in enumerate(rows):
                    outcomes[row].append(
                        Outcome(
                            policy=policy,
                            budget=budget,
                            delegated=bool(delegated[j]),
                            score=float(score[j]),
                            correct=bool(correct[j]),
                            threshold=threshold,
                            signal=float(signals[j]),
                            rank=int(ranks[j]) + 1 if topk else None,
                            batch=batch if topk else None,
                        )
                    )
        v = calibrate.delegation_value(label, probe, expert)
        for j, i in enumerate(index):
            records.append(
                ExampleRecord(
                    id=str(table.id[i]),
                    seed=int(seed),
                    group=str(table.group[i]),
                    label=int(label[j]),
                    probe=float(probe[j]),
                    dv=float(table.dv[i]),
                    expert=float(expert[j]),
                    v=float(v[j]),
                    evaluation=bool(evaluated[j]),
                    outcomes=tuple(outcomes[j]),
                )
            )
    return ArchRecords(
        arch=arch,
        records=records,
        seeds=tuple(sorted({r.seed for r in records})),
        budgets=points,
        policies=policies,
        objective=objective,
        batch_size=batch,
        headline=_headline(layout, sweep, arch, points, objective, batch),
        sweep=sweep,
    )


def _threshold(sweep: Sweep, policy: str, objective: str, seed: int, batch: int, budget: float) -> float:
    """A calibrated policy's threshold for one seed and budget (the sweep's row); NaN for top-k."""
    if not calibrate.POLICIES[policy].calibrated:
        return math.nan
    rows = sweep.rows(policy=policy, objective=objective, seed=seed, batch_size=batch, budget=budget)
    found = sweep.table["threshold"][rows]
    return float(found[0]) if found.size else math.nan


def score_name(policy: str, budget: float) -> str:
    """A cascade's score name in the log: POLICY@BUDGET, as the report's per-example table names
    its decision columns."""
    return f"{policy}@{budget:g}"


def _headline(
    layout: RunLayout, sweep: Sweep, arch: str, budgets: tuple[float, ...], objective: str, batch: int
) -> dict[str, dict[str, float]]:
    """The run's headline numbers, means over seeds on their evaluation halves: the probe's and
    the expert's AUROC and accuracy, each cascade's AUROC, accuracy and realised delegation rate
    at each budget, and each validation job's violation and selection rates at its headline level
    (its population measurement and the paper's protocol), where the run validated."""
    out: dict[str, dict[str, float]] = {}
    for scorer in ("probe", "expert"):
        out[scorer] = {m: sweep.baseline(f"{scorer}_{m}")[0] for m in ("auroc", "accuracy")}
    for policy in sweep.policies:
        for budget in budgets:
            rows = sweep.rows(policy=policy, objective=objective, batch_size=batch, budget=budget)
            out[score_name(policy, budget)] = {
                m: _mean(sweep.table[m][rows]) for m in ("auroc", "accuracy", "realised")
            }
    folder = layout.validation(arch).root
    for job in JOBS if folder.is_dir() else ():
        try:
            headline = read_job(folder, job).headline
        except InputError:
            continue  # a job that did not run: the report says why; the log leaves it out
        if headline is None:
            continue
        out[f"validation/{job.name}"] = {
            "alpha": float(headline["alpha"]),
            "violation_rate": _number(headline["population"]["violation_rate"]),
            "violation_rate_paper": _number(headline["violation_rate"]),
            "selection_rate": _number(headline["population"].get("selection_rate")),
        }
    try:
        joint = read_joint_job(folder) if folder.is_dir() else None
    except InputError:
        joint = None  # not run: the report says why
    record = joint.headline_record if joint is not None else None
    if record is not None:  # budget and error certified together, at the headline pair of levels
        out[f"validation/{JOINT_JOB}"] = {
            **{f"{risk}_level": float(level) for risk, level in record["levels"].items()},
            "violation_rate": _number(record["population"]["violation_rate"]),
            "violation_rate_paper": _number(record["violation_rate"]),
            "selection_rate": _number(record["population"].get("selection_rate")),
        }
    return out


def _mean(values: NDArray) -> float:
    finite = np.asarray(values, np.float64)
    finite = finite[np.isfinite(finite)]
    return float(finite.mean()) if finite.size else math.nan


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)  # JSON writes NaN as null
