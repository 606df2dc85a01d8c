"""The validate stage of `ctd eval`, and the files it leaves for the report.

Per probe configuration, four jobs, each over every level of its grid on one set of random
calibration samples (a split seed of its own, so no two jobs reuse the same trials):

    budget-pareto   budget control with Pareto filtering, at every budget of the run
    budget-ltt      budget-only LTT (no Pareto filter), at every budget of the run
    performance     performance control against the empirical selector, at every error level
    joint           the run's budget level and each error level certified together, against the
                    empirical selector (harness.stages._validate_joint)

validate/<arch>/ holds per job its record and its per-trial table (what each holds:
harness.run._validation, which reads them; where: `ValidationLayout`). The headline
level is the one whose per-trial histogram the report draws and whose performance control the
summary shows (the paper validated one level; every level is in the table): the level given
(`headline_rule` "given"), or, when none is given, the smallest level at which the tested
selector returned a policy in at least MIN_SELECTION of the trials ("smallest-certifiable";
"most-selected" when no level reached that: the level where it returned one most often).
"""

from __future__ import annotations

import shutil
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import calibrate

from .._errors import InputError
from ..data import BINARY_SUFFIX, read_scores, write_json
from ..run import (
    JOBS,
    JOINT_JOB,
    MIN_SELECTION,
    HeadlineRule,
    RunContext,
    StageResult,
    ValidationJob,
    ValidationLayout,
    file_sha256,
    fingerprint,
)
from ._calibrate import validate_scores
from ._cascade_validate import cascade_inputs, validate_run_cascade

__all__ = ["VALIDATE_SETTINGS", "ValidateStage", "certifiable", "headline_level", "run_job", "split_seed"]

VALIDATE_SETTINGS: tuple[str, ...] = (
    "trials",
    "budgets",
    "budget_alpha",
    "performance_alphas",
    "performance_alpha",
    "delta",
    "pvalue",
)
"""The RunConfig fields the validate stage's outputs depend on (with the scores table)."""


def split_seed(arch: str, job: ValidationJob | str) -> tuple[int, int]:
    """Seed words of a job's random samples: distinct per (probe configuration, job name)."""
    name = job if isinstance(job, str) else job.name
    return 0, zlib.crc32(f"{arch}/{name}".encode())


def certifiable(
    by_seed: dict[int, calibrate.Scores], alphas: tuple[float, ...], delta: float
) -> tuple[tuple[float, ...], list[dict[str, Any]]]:
    """The levels at which some threshold can be certified on every seed's D_cal, and why the
    others cannot (too few calibration rows: (1 - alpha)^n_cal > delta)."""
    n_cal = min(calibrate.split_sizes(s.n)[1] for s in by_seed.values())
    kept, dropped = [], []
    for alpha in alphas:
        size = calibrate.calibration_size(n_cal, alpha, delta)
        if size.enough:
            kept.append(alpha)
        else:
            why = f"D_cal holds {n_cal} rows; alpha {alpha:g} needs {size.need}"
            dropped.append({"alpha": alpha, "why": why})
    return tuple(kept), dropped


def headline_level(levels: list[dict[str, Any]]) -> tuple[float, HeadlineRule]:
    """The smallest level (records in ascending alpha) at which the tested selector returned a
    policy in at least MIN_SELECTION of its trials; when none did, the level where it returned one
    most often (the smallest of those tied)."""
    rates = [float(level["selection_rate"]) for level in levels]
    for level, rate in zip(levels, rates, strict=True):
        if rate >= MIN_SELECTION:
            return float(level["alpha"]), "smallest-certifiable"
    return float(levels[rates.index(max(rates))]["alpha"]), "most-selected"


def run_job(
    scores_path: Path,
    folder: Path,
    job: ValidationJob,
    *,
    arch: str,
    alphas: tuple[float, ...],
    headline_alpha: float | None,
    config: calibrate.ValidationConfig,
) -> dict[str, Any]:
    """Validate one job at `alphas` plus `headline_alpha` and write its two files; returns the
    JSON record. `config` holds the run's testing settings (`RunConfig.validation_config`); the
    job sets its Pareto filter and its own split seed. `headline_alpha` None: chosen from the
    results by `headline_level`. A table that cannot be validated at all (one class in a seed's
    test split) is recorded as {"job", "error"} and raises nothing."""
    levels = tuple(sorted({*alphas, headline_alpha} - {None}))
    if not levels:
        raise ValueError("run_job: no level to validate (no alphas and no headline level)")
    record: dict[str, Any] = {"job": job.name, "headline_alpha": headline_alpha, "headline_rule": "given"}
    files = ValidationLayout(Path(folder))
    trials_path = files.trials(job.name)
    trials_path.unlink(missing_ok=True)
    try:
        by_seed = read_scores(scores_path).test_scores(arch)
        kept, dropped = certifiable(by_seed, levels, config.delta)
        if not kept:
            raise InputError(f"no level can be certified: {dropped[0]['why']}")
        results = validate_scores(
            scores_path,
            mode=job.mode,
            alphas=kept,
            config=replace(config, pareto=job.pareto, seed=split_seed(arch, job)),
            arch=arch,
            out=trials_path,
        )
    except InputError as error:  # e.g. one class in a split: say so, keep the run going
        record["error"] = str(error)
        write_json(files.record(job.name), record)
        return record
    record |= {"levels": [r.to_dict() for r in results], "not_validated": dropped}
    if headline_alpha is None:
        record["headline_alpha"], record["headline_rule"] = headline_level(record["levels"])
    write_json(files.record(job.name), record)
    return record


def _said(ctx: RunContext, arch: str, job: str, record: dict[str, Any]) -> str:
    """A job's line in the stage's result (a job not run is also logged, with why)."""
    if "error" in record:
        ctx.manifests.log(f"validate {arch} {job}: not run: {record['error']}")
        return f"{arch} {job}: not run"
    worst = max(level["population"]["violation_rate"] for level in record["levels"])
    return f"{arch} {job}: {len(record['levels'])} levels, population violations <= {worst:.1%}"


@dataclass(frozen=True)
class ValidateStage:
    """`ctd eval`'s validate stage: every job of `JOBS` and the joint job per probe configuration
    into validate/ARCH/ (binary-target DV twins are left out: the guarantee does not depend on the
    DV target)."""

    ctx: RunContext
    name: ClassVar[str] = "validate"

    def fingerprint(self) -> tuple[str, dict[str, Any]]:
        inputs = {"scores": file_sha256(self.ctx.layout.scores), **cascade_inputs(self.ctx)}
        # The jobs named: a run validated before a job existed validates again and gains it.
        jobs = [job.name for job in JOBS] + [JOINT_JOB]
        return fingerprint(
            {"inputs": inputs, "settings": self.ctx.config.section(*VALIDATE_SETTINGS), "jobs": jobs}
        ), inputs

    def reusable(self) -> bool:
        return True

    def outputs(self) -> list[Path]:
        return [self.ctx.layout.validate]

    def run(self) -> StageResult:
        from ._validate_joint import run_joint_job  # it reads this module's level rules

        ctx, config, layout = self.ctx, self.ctx.config, self.ctx.layout
        levels = {"budget": config.budgets, "performance": config.performance_alphas}
        headline = {"budget": config.budget_alpha, "performance": config.performance_alpha}
        validation = config.validation_config
        archs = [a for a in read_scores(layout.scores).archs if not a.endswith(BINARY_SUFFIX)]
        shutil.rmtree(layout.validate, ignore_errors=True)
        total, done, parts = len(archs) * (len(JOBS) + 1), 0, []
        for arch in archs:
            folder = layout.validation(arch).root
            folder.mkdir(parents=True, exist_ok=True)
            for job in JOBS:
                ctx.progress("validate", done, total, unit="guarantees")
                record = run_job(
                    layout.scores,
                    folder,
                    job,
                    arch=arch,
                    alphas=levels[job.mode],
                    headline_alpha=headline[job.mode],
                    config=validation,
                )
                parts.append(_said(ctx, arch, job.name, record))
                done += 1
            ctx.progress("validate", done, total, unit="guarantees")
            record = run_joint_job(
                layout.scores,
                folder,
                arch=arch,
                budget=config.budget_alpha,
                errors=config.performance_alphas,
                headline_error=config.performance_alpha,
                config=validation,
            )
            parts.append(_said(ctx, arch, JOINT_JOB, record))
            done += 1
        parts += validate_run_cascade(ctx)  # a cascade of experts: its guarantee too
        ctx.progress("validate", total, total, unit="guarantees")
        return StageResult("; ".join(parts))

    def check_outputs(self) -> None:
        return None
