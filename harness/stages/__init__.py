"""The stages, each a function from files to files that a notebook or a `ctd` command calls on its
own, and a `Stage` object that runs it inside a `ctd eval` run folder.

Imported on first use (PEP 562): the probe and DV stages bring torch, the query stage the expert
engine, and a command that needs neither should not pay for them.
"""

from __future__ import annotations

from .._lazy import lazy_exports

# Every public name and the module that defines it.
_EXPORTS: dict[str, str] = {
    "BatchInSummary": "._query_batch",
    "BatchOutSummary": "._query_batch",
    "CalibrateStage": "._calibrate",
    "CascadeStage": "._cascade_stage",
    "DVMetrics": "._dv_metrics",
    "DVStage": "._dv",
    "ProbeSettings": "._probe",
    "ProbeMetrics": "._probe_metrics",
    "ProbeStage": "._probe",
    "read_probe_metrics": "._probe_metrics",
    "QueryStage": "._query_stage",
    "QuerySummary": "._query",
    "ReportStage": "._report",
    "ValidateStage": "._validate",
    "batch_in": "._query_batch",
    "batch_out": "._query_batch",
    "calibrate_scores": "._calibrate",
    "calibrate_cascade_scores": "._cascade_calibrate",
    "check_budget_count": "._cascade_calibrate",
    "cascade_expert_scores": "._expert_calibration",
    "read_expert_calibration": "._expert_calibration",
    "dv_stage": "._dv",
    "preflight_cache": "._query",
    "refuse_uncounted_limit": "._query",
    "probe_stage": "._probe",
    "query_dataset": "._query",
    "query_items": "._query",
    "score_stoppable": "._query",
    "read_dv_metrics": "._dv_metrics",
    "expert_for_probe": "._dv",
    "read_expert_scores": "._dv",
    "resolve_scores": "._calibrate",
    "simulate": "._calibrate",
    "validate_joint_levels": "._calibrate",
    "validate_joint_scores": "._calibrate",
    "validate_scores": "._calibrate",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
