"""Data: labelled data sets and the data spec that makes train/dev/test of them, the scores table
(the contract between stages), column tables as Parquet or CSV, synthetic scores tables, and the
hidden staging folders that multi-file writes are renamed in from."""

from ._datasets import Dataset, read_dataset, row_item, row_label, stream_rows
from ._dataspec import SPLITS, DataSplits, Example, SplitName, load_data, parse_data_spec
from ._scores import (
    BINARY_SUFFIX,
    SCORES_COLUMNS,
    ScoresTable,
    binary_twin,
    read_scores,
    scores_from_columns,
    stage_columns,
    write_scores,
)
from ._simulate import DEFAULT_RANDOM_STATE, SCENARIOS, Scenario, simulate_scores
from ._staging import cleaning_lock, exchange_folders, folder_writer, staging_folder
from ._tables import (
    RawTable,
    atomic_path,
    check_writable,
    check_writable_folder,
    dumps,
    read_json,
    read_table,
    write_json,
    write_jsonl,
    write_parquet_parts,
    write_table,
)

__all__ = [
    "BINARY_SUFFIX",
    "DEFAULT_RANDOM_STATE",
    "SCENARIOS",
    "SCORES_COLUMNS",
    "SPLITS",
    "DataSplits",
    "Dataset",
    "Example",
    "RawTable",
    "Scenario",
    "ScoresTable",
    "SplitName",
    "atomic_path",
    "binary_twin",
    "check_writable",
    "check_writable_folder",
    "cleaning_lock",
    "dumps",
    "exchange_folders",
    "folder_writer",
    "load_data",
    "parse_data_spec",
    "read_dataset",
    "read_json",
    "read_scores",
    "read_table",
    "row_item",
    "row_label",
    "scores_from_columns",
    "simulate_scores",
    "stage_columns",
    "staging_folder",
    "stream_rows",
    "write_json",
    "write_jsonl",
    "write_parquet_parts",
    "write_scores",
    "write_table",
]
