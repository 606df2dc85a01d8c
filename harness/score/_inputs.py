"""The rows `ctd score` reads: a JSONL, CSV or Parquet file of the McKenzie et al. format, or a
folder of them (sorted by name), in file order, streamed. Planning walks each file once and keeps
only where each shard starts (a byte offset, or a Parquet row number); a shard then reads only
its own rows. The per-row conversion (ids, inputs, labels) is the data room's
(`harness.data.row_item`), so a row reads as `ctd eval` reads it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import InputError
from ..data import row_item, row_label, stream_rows

if TYPE_CHECKING:
    from experts import Item

__all__ = ["SUFFIXES", "InputRow", "input_files", "read_rows", "walk_rows"]

SUFFIXES = (".jsonl", ".csv", ".parquet")
PARQUET_BATCH = 4096  # rows per Parquet batch while planning (bounds memory, not results)


@dataclass(frozen=True)
class InputRow:
    item: Item
    label: int | None  # None: no label (production traffic), or an ambiguous one
    where: str  # file and line (or Parquet row), for messages
    start: int  # JSONL/CSV: the byte offset where the row starts; Parquet: its row number


def input_files(data: Path) -> list[Path]:
    """The file `data`, or the data files of the folder `data` sorted by name; one InputError
    line naming --data otherwise."""
    if data.is_dir():
        files = sorted(p for p in data.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES)
        if not files:
            raise InputError(f"--data {data}: the folder holds no {', '.join(SUFFIXES)} files")
        return files
    if not data.is_file():
        raise InputError(f"--data {data}: no such file or folder")
    if data.suffix.lower() not in SUFFIXES:
        raise InputError(f"--data {data}: expected a {', '.join(SUFFIXES)} file or a folder of them")
    return [data]


def walk_rows(path: Path, *, start: int = 0, line: int = 1, first_index: int = 0) -> Iterator[InputRow]:
    """The rows of `path` from `start` on (a byte offset of a row that is line `line`, or a Parquet
    row number), each converted and checked; `first_index` is the first one's index among the
    file's rows (it names a row that has no id)."""
    if path.suffix.lower() == ".parquet":
        rows = _parquet_rows(path, start)
    else:
        rows = stream_rows(path, byte_offset=start, line=line)
    for index, (where, row, offset) in enumerate(rows, start=first_index):
        item = row_item(row, where, f"{path.stem}-{index}")
        yield InputRow(item, row_label(row, where), where, offset)


def read_rows(path: Path, *, start: int, line: int, first_index: int, count: int) -> list[InputRow]:
    """`count` rows of `path` from `start` on (see `walk_rows`); fewer is an InputError (the file
    changed since the job was planned)."""
    rows: list[InputRow] = []
    if count > 0:
        for row in walk_rows(path, start=start, line=line, first_index=first_index):
            rows.append(row)
            if len(rows) == count:
                break
    if len(rows) < count:
        raise InputError(f"{path}: has fewer rows than when the job was planned; the file changed")
    return rows


def _parquet_rows(path: Path, first: int) -> Iterator[tuple[str, dict[str, object], int]]:
    """(where, row, row number) from row `first` on, reading only the row groups from there."""
    import pyarrow.parquet as pq
    from pyarrow import ArrowException

    try:
        handle = pq.ParquetFile(path)
    except Exception as error:  # pyarrow's ArrowInvalid: not Parquet, a damaged footer
        raise InputError(f"{path}: not a readable Parquet file ({error})") from None
    columns = [c for c in handle.schema_arrow.names if c in ("inputs", "ids", "id", "labels")]
    if "inputs" not in columns:
        raise InputError(f"{path}: missing column 'inputs'")
    number = 0
    for group in range(handle.num_row_groups):
        size = handle.metadata.row_group(group).num_rows
        if number + size <= first:
            number += size
            continue
        batches = handle.iter_batches(batch_size=PARQUET_BATCH, row_groups=[group], columns=columns)
        while True:
            try:  # a damaged page is met here: pyarrow's error (OSError, ValueError) names no file
                batch = next(batches, None)
                rows = batch.to_pylist() if batch is not None else None
            except (OSError, ValueError, ArrowException) as error:
                raise InputError(f"{path}: row group {group + 1} is not readable ({error})") from None
            if rows is None:
                break
            for row in rows:
                if number >= first:
                    yield f"{path}: row {number + 1}", row, number
                number += 1
