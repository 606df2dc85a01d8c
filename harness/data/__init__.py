"""Data: labelled data sets and the data spec that makes train/dev/test of them, the scores table
(the contract between stages), column tables as Parquet or CSV, and synthetic scores tables."""

from ._datasets import Dataset, read_dataset
from ._dataspec import DataSplits, Example, load_data, parse_data_spec
from ._scores import SCORES_COLUMNS, ScoresTable, binary_twin, read_scores, scores_from_columns, write_scores
from ._simulate import SCENARIOS, Scenario, simulate_scores
from ._tables import read_table, write_table

__all__ = [
    "SCENARIOS",
    "SCORES_COLUMNS",
    "DataSplits",
    "Dataset",
    "Example",
    "Scenario",
    "ScoresTable",
    "binary_twin",
    "load_data",
    "parse_data_spec",
    "read_dataset",
    "read_scores",
    "read_table",
    "scores_from_columns",
    "simulate_scores",
    "write_scores",
    "write_table",
]
