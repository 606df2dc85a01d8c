"""The validate stage's joint job: the run's budget level and every error level it validates,
certified together (`calibrate.validate_joint`, Pareto testing on), written beside the other jobs.

validate/ARCH/joint.json and joint.parquet (what each holds: harness.run._validation; where:
`ValidationLayout`). The headline joint level, the one the report draws, has the run's budget and
the error level given (`headline_rule` "given"), or, when none is given or D_cal cannot certify
it, the smallest error level at which LTT returned a policy in at least MIN_SELECTION of the
trials, as the other jobs pick.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import calibrate

from .._errors import InputError
from ..data import read_scores, write_json
from ..run import JOINT_JOB, ValidationLayout
from ._calibrate import validate_joint_levels
from ._validate import certifiable, headline_level, split_seed

__all__ = ["run_joint_job"]


def run_joint_job(
    scores_path: Path,
    folder: Path,
    *,
    arch: str,
    budget: float,
    errors: tuple[float, ...],
    headline_error: float | None,
    config: calibrate.ValidationConfig,
) -> dict[str, Any]:
    """Validate joint control at (`budget`, error) for each error of `errors` plus `headline_error`
    and write the job's two files; returns the JSON record. `config` holds the run's testing
    settings; the job turns Pareto testing on and draws its own split seed. A table that cannot
    be validated at all is recorded as {"job", "error"} and raises nothing."""
    levels = tuple(sorted({*errors, headline_error} - {None}))
    if not levels:
        raise ValueError("run_joint_job: no error level to validate")
    record: dict[str, Any] = {"job": JOINT_JOB, "headline": None, "headline_rule": "given"}
    files = ValidationLayout(Path(folder))
    trials_path = files.trials(JOINT_JOB)
    trials_path.unlink(missing_ok=True)
    try:
        by_seed = read_scores(scores_path).test_scores(arch)
        budget_kept, budget_dropped = certifiable(by_seed, (budget,), config.delta)
        if not budget_kept:
            raise InputError(f"budget {budget:g} cannot be certified: {budget_dropped[0]['why']}")
        kept, dropped = certifiable(by_seed, levels, config.delta)
        if not kept:
            raise InputError(f"no error level can be certified: {dropped[0]['why']}")
        results = validate_joint_levels(
            scores_path,
            levels=tuple(calibrate.JointLevel(budget=budget, error=error) for error in kept),
            config=replace(config, pareto=True, seed=split_seed(arch, JOINT_JOB)),
            arch=arch,
            out=trials_path,
        )
    except InputError as error:  # e.g. one class in a split: say so, keep the run going
        record["error"] = str(error)
        write_json(files.record(JOINT_JOB), record)
        return record
    record |= {
        "levels": [r.to_dict() for r in results],
        "not_validated": [{"budget": budget, "error": d["alpha"], "why": d["why"]} for d in dropped],
    }
    if headline_error is not None and headline_error in kept:
        record["headline"] = {"budget": budget, "error": headline_error}
    else:
        by_error = [
            {"alpha": error, "selection_rate": r.tested.paper.selection_rate}
            for error, r in zip(kept, results, strict=True)
        ]
        error, record["headline_rule"] = headline_level(by_error)
        record["headline"] = {"budget": budget, "error": error}
    write_json(files.record(JOINT_JOB), record)
    return record
