"""The harness: run configuration, stages from files to files, table I/O, the `ctd` CLI.

The CLI (`harness._cli`) is a thin layer over these functions, which a notebook can call too.
"""

from pathlib import Path

from ._calibration import calibrate_scores, check_calibration_size, resolve_scores, simulate, validate_scores
from ._config import RunConfig, load_run_config
from ._dataspec import DataSplits, Example, load_data
from ._dv import dv_stage
from ._errors import InputError, RunFailed
from ._eval import EvalResult, run_eval
from ._probe import ProbeSettings, probe_stage
from ._scores import SCORES_COLUMNS, ScoresTable, read_scores, scores_from_columns, write_scores
from ._simulate import SCENARIOS, Scenario, simulate_scores
from ._tables import read_table, write_table


def build_report(run_dir: Path) -> Path:
    """Write run_dir/report/ for a finished run (imports matplotlib only when called)."""
    from ._report import build_report as build

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
