"""The validation jobs of a run and their records as readers take them: the validate stage writes
them (harness.stages), the report reads them; both find the files through `ValidationLayout`.

validate/ARCH/JOB.json holds {"job", "headline_alpha", "headline_rule", "levels": [one
`ValidationResult.to_dict()` per level], "not_validated": [{"alpha", "why"}]} (or {"job", "error"}
when the job could not run); validate/ARCH/JOB.parquet holds every trial of every level (column
`alpha`).

The joint job (`JOINT_JOB`) certifies the budget and the error at once: validate/ARCH/joint.json
holds {"job", "headline": {"budget", "error"}, "headline_rule", "levels": [one joint
`ValidationResult.to_dict()` per level, its risk levels under "levels"], "not_validated":
[{"budget", "error", "why"}]}; joint.parquet every trial (columns `budget_level`, `error_level`).
Runs from before the job have neither file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
from numpy.typing import NDArray

import calibrate

from .._errors import InputError
from ..data import read_json, read_table
from ._layout import ValidationLayout

__all__ = [
    "HEADLINE_RULES",
    "JOBS",
    "JOINT_JOB",
    "HeadlineRule",
    "JobRecord",
    "JointJobRecord",
    "ValidationJob",
    "read_job",
    "read_joint_job",
]

HeadlineRule = Literal["given", "smallest-certifiable", "most-selected"]
HEADLINE_RULES: tuple[str, ...] = get_args(HeadlineRule)


@dataclass(frozen=True)
class ValidationJob:
    name: str
    label: str  # as the report names it
    mode: calibrate.ValidationMode
    pareto: bool


JOBS: tuple[ValidationJob, ...] = (
    ValidationJob("budget-pareto", "Pareto LTT", "budget", True),
    ValidationJob("budget-ltt", "budget-only LTT", "budget", False),
    ValidationJob("performance", "CTD (LTT)", "performance", True),
)

JOINT_JOB = "joint"
"""The joint-control job: the run's budget level and each error level, certified together."""


@dataclass(frozen=True)
class JobRecord:
    """A job's record as the report reads it: the per-level records (ascending alpha), the
    headline level, and the per-trial table when it was written."""

    job: ValidationJob
    path: Path
    levels: list[dict[str, Any]]
    headline_alpha: float
    headline_rule: HeadlineRule
    not_validated: list[dict[str, Any]]
    per_trial: dict[str, NDArray] | None

    @property
    def headline(self) -> dict[str, Any] | None:
        return next((r for r in self.levels if np.isclose(r["alpha"], self.headline_alpha)), None)

    def trials_at(self, alpha: float) -> dict[str, NDArray] | None:
        if self.per_trial is None:
            return None
        rows = np.isclose(self.per_trial["alpha"], alpha)
        return {k: v[rows] for k, v in self.per_trial.items()}


def read_job(folder: Path, job: ValidationJob) -> JobRecord:
    """Read a job's files in `folder` (validate/ARCH/); a missing, malformed or not-run record is
    an InputError saying why."""
    files = ValidationLayout(Path(folder))
    path = files.record(job.name)
    record = read_json(path)
    if "error" in record:
        raise InputError(f"{path}: not run: {record['error']}")
    levels = record.get("levels")
    keys = {"alpha", "delta", "violation_rate", "population"} | (
        {"empirical"} if job.mode == "performance" else set()
    )
    if (
        not isinstance(levels, list)
        or not levels
        or not all(isinstance(r, dict) and keys <= r.keys() for r in levels)
    ):
        raise InputError(f"{path}: no per-level records; rerun `ctd eval` to validate at every level")
    rule = record.get("headline_rule", "given")  # records written before the rule: a given level
    if rule not in HEADLINE_RULES:
        raise InputError(f"{path}: headline_rule {rule!r}: expected one of {', '.join(HEADLINE_RULES)}")
    per_trial = None
    if files.trials(job.name).is_file():
        per_trial = {k: np.asarray(v) for k, v in read_table(files.trials(job.name)).columns.items()}
    return JobRecord(
        job=job,
        path=path,
        levels=sorted(levels, key=lambda r: r["alpha"]),
        headline_alpha=float(record.get("headline_alpha") or levels[0]["alpha"]),
        headline_rule=rule,
        not_validated=list(record.get("not_validated", [])),
        per_trial=per_trial,
    )


@dataclass(frozen=True)
class JointJobRecord:
    """The joint job's record as the report reads it: per joint level its record (ascending
    error, then budget), the headline level, and the per-trial table when it was written."""

    path: Path
    levels: list[dict[str, Any]]
    headline: dict[str, float]
    headline_rule: HeadlineRule
    not_validated: list[dict[str, Any]]
    per_trial: dict[str, NDArray] | None

    @property
    def headline_record(self) -> dict[str, Any] | None:
        return next((r for r in self.levels if _same(r["levels"], self.headline)), None)

    def trials_at(self, levels: dict[str, float]) -> dict[str, NDArray] | None:
        """The per-trial rows of one joint level (None: no table, or it lacks a level column)."""
        if self.per_trial is None or not all(f"{risk}_level" in self.per_trial for risk in levels):
            return None
        rows = np.logical_and.reduce([np.isclose(self.per_trial[f"{r}_level"], a) for r, a in levels.items()])
        return {k: v[rows] for k, v in self.per_trial.items()}


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(np.isclose(a[k], b[k]) for k in a)


def read_joint_job(folder: Path) -> JointJobRecord | None:
    """Read the joint job's files in `folder` (validate/ARCH/); None when the run has no joint
    job (runs from before it); a malformed or not-run record is an InputError saying why."""
    files = ValidationLayout(Path(folder))
    path = files.record(JOINT_JOB)
    if not path.is_file():
        return None
    record = read_json(path)
    if "error" in record:
        raise InputError(f"{path}: not run: {record['error']}")
    levels, headline = record.get("levels"), record.get("headline")
    keys = {"levels", "delta", "violation_rate", "population", "empirical"}
    if (
        not isinstance(levels, list)
        or not levels
        or not all(isinstance(r, dict) and keys <= r.keys() and isinstance(r["levels"], dict) for r in levels)
        or not isinstance(headline, dict)
    ):
        raise InputError(f"{path}: no per-level joint records; rerun `ctd eval` to validate joint control")
    rule = record.get("headline_rule", "given")
    if rule not in HEADLINE_RULES:
        raise InputError(f"{path}: headline_rule {rule!r}: expected one of {', '.join(HEADLINE_RULES)}")
    per_trial = None
    if files.trials(JOINT_JOB).is_file():
        per_trial = {k: np.asarray(v) for k, v in read_table(files.trials(JOINT_JOB)).columns.items()}
    return JointJobRecord(
        path=path,
        levels=sorted(levels, key=lambda r: (r["levels"].get("error", 0.0), r["levels"].get("budget", 0.0))),
        headline={k: float(v) for k, v in headline.items()},
        headline_rule=rule,
        not_validated=list(record.get("not_validated", [])),
        per_trial=per_trial,
    )
