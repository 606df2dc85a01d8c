"""The harness: run configuration, stages from files to files, table I/O, the `ctd` CLI.

The CLI (`harness.cli`) is a thin layer over these functions, which a notebook can call too.
"""

from pathlib import Path

from ._errors import InputError, RunFailed
from .data._dataspec import DataSplits, Example, load_data
from .data._scores import SCORES_COLUMNS, ScoresTable, read_scores, scores_from_columns, write_scores
from .data._simulate import SCENARIOS, Scenario, simulate_scores
from .data._tables import read_table, write_table
from .run._config import RunConfig, load_run_config
from .run._runner import EvalResult, run_eval
from .stages._calibrate import (
    calibrate_scores,
    check_calibration_size,
    resolve_scores,
    simulate,
    validate_scores,
)
from .stages._dv import dv_stage
from .stages._probe import ProbeSettings, probe_stage


def build_report(run_dir: Path) -> Path:
    """Write run_dir/report/ for a finished run (imports matplotlib only when called)."""
    from .report._build import build_report as build

    return build(Path(run_dir))


__all__ = [
    "SCENARIOS",
    "SCORES_COLUMNS",
    "DataSplits",
    "EvalResult",
    "Example",
    "InputError",
    "ProbeSettings",
    "RunConfig",
    "RunFailed",
    "Scenario",
    "ScoresTable",
    "build_report",
    "calibrate_scores",
    "check_calibration_size",
    "dv_stage",
    "load_data",
    "load_run_config",
    "probe_stage",
    "read_scores",
    "read_table",
    "resolve_scores",
    "run_eval",
    "scores_from_columns",
    "simulate",
    "simulate_scores",
    "validate_scores",
    "write_scores",
    "write_table",
]
