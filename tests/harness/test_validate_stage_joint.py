"""The validate stage's joint job: run by `ValidateStage` inside a run folder, at the run's budget
level and every error level it validates; its record and per-trial table hold exactly what a direct
`calibrate.validate_joint` call on the same table, levels and seed returns."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

import calibrate
import harness
from harness.data import load_data, read_json, read_scores, read_table, write_json
from harness.expert import resolve_expert
from harness.run import JOINT_JOB, Manifests, Roots, RunConfig, RunContext, StageProgress, read_joint_job
from harness.stages import ValidateStage

# Private: the seed the stage gives each job.
from harness.stages._validate import split_seed
from probes import ModelInfo

ARCH = "simulated"
CONFIG = RunConfig(
    name="joint", trials=40, budgets=(0.3,), budget_alpha=0.3, performance_alphas=(0.15, 0.25, 0.35)
)


def _context(tmp: Path) -> RunContext:
    roots = Roots(runs=tmp / "runs", store=tmp / "store", cache=tmp / "cache.sqlite")
    layout = roots.run(CONFIG.name)
    layout.root.mkdir(parents=True)
    return RunContext(
        config=CONFIG,
        roots=roots,
        layout=layout,
        manifests=Manifests(layout),
        data=load_data(None, limit=4),
        expert=resolve_expert("smollm2", named="the default expert smollm2"),
        model=ModelInfo(identity="unused by the validate stage", n_layers=1, config=None),
        progress=StageProgress(enabled=False),
    )


def test_the_joint_job_is_a_direct_validate_joint_call(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    harness.simulate("strong", 400, 2, ctx.layout.scores)
    result = ValidateStage(ctx).run()
    assert f"{ARCH} {JOINT_JOB}: 3 levels" in result.detail
    folder = ctx.layout.validation(ARCH).root
    levels = [calibrate.JointLevel(budget=0.3, error=e) for e in CONFIG.performance_alphas]
    direct = calibrate.validate_joint(
        read_scores(ctx.layout.scores).test_scores(ARCH),
        levels=levels,
        config=replace(CONFIG.validation_config, pareto=True, seed=split_seed(ARCH, JOINT_JOB)),
    )
    written = read_json(folder / f"{JOINT_JOB}.json")
    # The same numbers, through the same JSON writer the stage uses.
    expected = read_json(write_json(tmp_path / "direct.json", {"levels": [r.to_dict() for r in direct]}))
    assert written["levels"] == expected["levels"]
    assert written["not_validated"] == []
    trials = read_table(folder / f"{JOINT_JOB}.parquet").columns
    for column in direct[0].per_trial:
        np.testing.assert_array_equal(
            np.asarray(trials[column]), np.concatenate([r.per_trial[column] for r in direct]), err_msg=column
        )
    # No --performance-alpha: the headline error is the smallest at which LTT selected often enough.
    record = read_joint_job(folder)
    assert record is not None and record.headline["budget"] == 0.3
    rates = {r.levels["error"]: r.tested.paper.selection_rate for r in direct}  # type: ignore[index]
    first = min(e for e, rate in rates.items() if rate >= 0.1)
    assert (
        record.headline == {"budget": 0.3, "error": first} and record.headline_rule == "smallest-certifiable"
    )
