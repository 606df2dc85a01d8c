"""The stages, each a function from files to files that a notebook or a `ctd` command calls on its
own, and a `Stage` object that runs it inside a `ctd eval` run folder."""

from ._calibrate import CalibrateStage, calibrate_scores, simulate, validate_scores
from ._dv import DVStage, dv_stage
from ._probe import ProbeSettings, ProbeStage, probe_stage
from ._query import QueryStage, QuerySummary, check_expert, pick_expert, query_dataset, query_items
from ._report import ReportStage
from ._validate import ValidateStage

__all__ = [
    "CalibrateStage",
    "DVStage",
    "ProbeSettings",
    "ProbeStage",
    "QueryStage",
    "QuerySummary",
    "ReportStage",
    "ValidateStage",
    "calibrate_scores",
    "check_expert",
    "dv_stage",
    "pick_expert",
    "probe_stage",
    "query_dataset",
    "query_items",
    "simulate",
    "validate_scores",
]
