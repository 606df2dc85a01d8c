"""The harness: run configuration, stages from files to files, table I/O, the `ctd` CLI.

The CLI (`harness._cli`) is a thin layer over these functions, which a notebook can call too.
"""

from ._calibration import calibrate_scores, check_calibration_size, resolve_scores, simulate, validate_scores
from ._errors import InputError
from ._scores import SCORES_COLUMNS, ScoresTable, read_scores, scores_from_columns, write_scores
from ._simulate import SCENARIOS, Scenario, simulate_scores
from ._tables import read_table, write_table

__all__ = [
    "SCENARIOS",
    "SCORES_COLUMNS",
    "InputError",
    "Scenario",
    "ScoresTable",
    "calibrate_scores",
    "check_calibration_size",
    "read_scores",
    "read_table",
    "resolve_scores",
    "scores_from_columns",
    "simulate",
    "simulate_scores",
    "validate_scores",
    "write_scores",
    "write_table",
]
