"""The harness: `ctd eval` and every stage as a library a notebook can call, and the `ctd` CLI.

Rooms: `harness.run` (configuration, run folder layout, run log, the runner), `harness.stages`
(probe, query, dv, calibrate, validate, report), `harness.data` (data sets, data specs, the scores
table, table I/O, simulation), `harness.report` (the report, from files), `harness.cli` (thin
Typer commands over this API).
"""

from ._errors import InputError, RunFailed
from ._eval import EvalResult, run_eval
from .data import (
    SCENARIOS,
    SCORES_COLUMNS,
    DataSplits,
    Example,
    Scenario,
    ScoresTable,
    load_data,
    read_scores,
    read_table,
    scores_from_columns,
    simulate_scores,
    write_scores,
    write_table,
)
from .report import build_report
from .run import Roots, RunConfig, RunLayout, RunLog, StageOutcome, load_run_config
from .stages import (
    ProbeSettings,
    calibrate_scores,
    dv_stage,
    pick_expert,
    probe_stage,
    query_dataset,
    query_items,
    simulate,
    validate_scores,
)

__all__ = [
    "SCENARIOS",
    "SCORES_COLUMNS",
    "DataSplits",
    "EvalResult",
    "Example",
    "InputError",
    "ProbeSettings",
    "Roots",
    "RunConfig",
    "RunFailed",
    "RunLayout",
    "RunLog",
    "Scenario",
    "ScoresTable",
    "StageOutcome",
    "build_report",
    "calibrate_scores",
    "dv_stage",
    "load_data",
    "load_run_config",
    "pick_expert",
    "probe_stage",
    "query_dataset",
    "query_items",
    "read_scores",
    "read_table",
    "run_eval",
    "scores_from_columns",
    "simulate",
    "simulate_scores",
    "validate_scores",
    "write_scores",
    "write_table",
]
