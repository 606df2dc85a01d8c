"""The harness: `ctd eval` and every stage as a library a notebook can call, and the `ctd` CLI.

Rooms: `harness.run` (configuration, run folder layout, run log, the runner), `harness.stages`
(probe, query, dv, calibrate, validate, report), `harness.expert` (the expert of a run or a command,
resolved once from --expert), `harness.data` (data sets, data specs, the scores
table, table I/O, simulation), `harness.report` (the report, from files), `harness.cli` (thin
Typer commands over this API).

The names below are imported on first use (PEP 562): `from harness import RunConfig` or the `ctd`
command line load neither torch nor matplotlib; `run_eval` and `probe_stage` load torch
(`run_eval` then freezes what the process holds, `gc.freeze`), the report's worker processes
matplotlib.
"""

from __future__ import annotations

from ._lazy import lazy_exports

# Every public name and the room that defines it: the one list of the library's API.
_EXPORTS: dict[str, str] = {
    "SCENARIOS": ".data",
    "SCORES_COLUMNS": ".data",
    "DataSplits": ".data",
    "EvalResult": "._eval",
    "ExpertSettings": ".run",
    "Example": ".data",
    "InputError": "._errors",
    "ProbeSettings": ".run",
    "ResolvedExpert": ".expert",
    "Roots": ".run",
    "RunConfig": ".run",
    "RunFailed": "._errors",
    "RunLayout": ".run",
    "RunLog": ".run",
    "Scenario": ".data",
    "ScoresTable": ".data",
    "StageOutcome": ".run",
    "build_report": ".report",
    "calibrate_cascade_scores": ".stages",
    "calibrate_scores": ".stages",
    "dv_stage": ".stages",
    "load_data": ".data",
    "load_run_config": ".run",
    "pick_expert": ".expert",
    "probe_stage": ".stages",
    "query_dataset": ".stages",
    "query_items": ".stages",
    "read_scores": ".data",
    "read_summary": "._eval",
    "read_table": ".data",
    "resolve_expert": ".expert",
    "run_eval": "._eval",
    "scores_from_columns": ".data",
    "simulate": ".stages",
    "simulate_scores": ".data",
    "validate_scores": ".stages",
    "write_scores": ".data",
    "write_table": ".data",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
