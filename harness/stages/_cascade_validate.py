"""The validate stage's job for a run's cascade of experts (`--expert small,large`): the K-stage
guarantee (`calibrate.validate_cascade`, what `ctd validate --budget B1,B2` computes) at the run's
budget level for every expert (`budget_alpha`), on cascade/scores.parquet, per probe
configuration into validate/cascade/ARCH.json and ARCH.parquet (the per-trial table) for the
report, and the same for the uncertainty cascade (each stage's threshold on the uncertainty of
the score held, `calibrate.uncertainty_signals`) in validate/cascade/uncertainty/. A run of one
expert has no such job, and its files are what they were."""

from __future__ import annotations

import zlib
from typing import Any

import calibrate

from .._errors import InputError
from ..data import BINARY_SUFFIX, read_scores, write_json, write_table
from ..run import RunConfig, RunContext, RunLayout, file_sha256

__all__ = ["cascade_inputs", "run_cascade_validation", "validate_run_cascade"]


def cascade_inputs(ctx: RunContext) -> dict[str, str]:
    """The cascade table's hash, an input of the validate stage (nothing for one expert)."""
    if not ctx.config.cascade:
        return {}
    return {"cascade": file_sha256(ctx.layout.cascade.scores)}


def run_cascade_validation(layout: RunLayout, config: RunConfig) -> list[dict[str, Any]]:
    """Validate the run's cascade at budget_alpha per expert, with the run's trials, delta and
    p-value, one record per probe configuration (binary-DV twins left out) and cascade policy
    (`calibrate.CASCADE_RUN_POLICIES`: CTD's in validate/cascade/, another's in its subfolder,
    on the same trials); a table that cannot be validated is recorded as {"arch", "error"}.
    Returns the records, each with its "policy"."""
    path = layout.cascade.scores
    table = read_scores(path)
    levels = calibrate.CascadeLevels((config.budget_alpha,) * table.stages)
    control = calibrate.ControlConfig(delta=config.delta, pvalue=config.pvalue)
    records = []
    for policy in calibrate.CASCADE_RUN_POLICIES:
        files = layout.cascade_policy_validation(policy)
        files.root.mkdir(parents=True, exist_ok=True)
        for arch in (a for a in table.archs if not a.endswith(BINARY_SUFFIX)):
            record: dict[str, Any] = {"arch": arch, "experts": [config.expert, *config.cascade]}
            try:
                (result,) = calibrate.validate_cascade(
                    table.cascade_scores(arch),
                    levels=[levels],
                    trials=config.trials,
                    control=control,
                    seed=zlib.crc32(f"{arch}/cascade".encode()),
                    policy=policy,
                )
            except (InputError, ValueError) as error:  # e.g. too few rows: say so, keep the run going
                record["error"] = str(error)
            else:
                write_table(files.trials(arch), result.per_trial)
                record |= result.to_dict()
            write_json(files.record(arch), record)
            records.append({"policy": policy, **record})
    return records


def validate_run_cascade(ctx: RunContext) -> list[str]:
    """The validate stage's cascade job: the parts of its summary line (none for one expert)."""
    if not ctx.config.cascade:
        return []
    parts = []
    for record in run_cascade_validation(ctx.layout, ctx.config):
        name = "cascade" if record["policy"] == "ctd" else f"cascade ({record['policy']})"
        if "error" in record:
            ctx.manifests.log(f"validate {name} {record['arch']}: not run: {record['error']}")
            parts.append(f"{record['arch']} {name}: not run")
        else:
            worst = record["ltt"]["population"]["violation_rate"]
            parts.append(f"{record['arch']} {name}: population violations {worst:.1%}")
    return parts
