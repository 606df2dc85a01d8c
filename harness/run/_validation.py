"""The validation jobs of a run and their records as readers take them: the validate stage writes
them (harness.stages), the report reads them; both find the files through `ValidationLayout`.

validate/ARCH/JOB.json holds {"job", "headline_alpha", "headline_rule", "levels": [one
`ValidationResult.to_dict()` per level], "not_validated": [{"alpha", "why"}]} (or {"job", "error"}
when the job could not run); validate/ARCH/JOB.parquet holds every trial of every level (column
`alpha`).
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

__all__ = ["HEADLINE_RULES", "JOBS", "HeadlineRule", "JobRecord", "ValidationJob", "read_job"]

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
