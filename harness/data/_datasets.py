"""Datasets in the format of McKenzie et al. (2025): JSONL or CSV rows with `inputs` (a plain
string, or a JSON-encoded list of {"role", "content"} messages), `ids` and `labels`
("high-stakes" = 1, "low-stakes" = 0, "ambiguous" dropped and counted; 1/0 also accepted)."""

from __future__ import annotations

import contextlib
import csv
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from experts import Conversation, chat_message

from .._errors import InputError
from ._tables import not_utf8

if TYPE_CHECKING:
    from experts import Item

__all__ = ["Dataset", "is_dropped", "read_dataset", "row_item", "row_label", "stream_rows"]

_LABELS = {"high-stakes": 1, "low-stakes": 0, "1": 1, "0": 0, "high": 1, "low": 0}
_DROPPED = {"ambiguous"}
_EXTRA = ("group",)  # optional per-row columns kept in `Dataset.extra` ("" where a row lacks one)


@dataclass(frozen=True)
class Dataset:
    """Examples of one file, in file order. `labels[i]` is None for an unlabelled row (a file
    without a `labels` column); `dropped` counts the ambiguous rows left out. `extra` holds the
    optional columns of `_EXTRA` that some row has (e.g. `group`), and `where[i]` names the file
    and line of item i, for error messages about several files."""

    path: Path
    items: list[Item]
    labels: list[int | None]
    dropped: int = 0
    extra: dict[str, list[str]] = field(default_factory=dict)
    where: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.items)


def _conversation(value: object, where: str) -> Conversation:
    """A plain string, or messages (given as a list or as JSON text of a list)."""
    if isinstance(value, list):
        messages = value
    elif isinstance(value, str):
        text = value.strip()
        if not (text.startswith("[") and text.endswith("]")):
            return value
        try:
            messages = json.loads(text)
        except json.JSONDecodeError:
            return value  # a string that merely looks like a list
    else:
        raise InputError(
            f"{where}: 'inputs' must be a string or a list of messages, got {type(value).__name__}"
        )
    if not messages:
        # it would be extracted as a lone pad token and asked of the expert as nothing
        raise InputError(f"{where}: 'inputs' is an empty list of messages")
    conversation: list[dict[str, str]] = []
    for i, message in enumerate(messages):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)):
            raise InputError(f"{where}: message {i} of 'inputs' needs string 'role' and 'content'")
        try:
            conversation.append(chat_message(message))
        except ValueError as error:
            raise InputError(f"{where}: message {i} of 'inputs': {error}") from None
    return conversation


def row_item(row: Mapping[str, object], where: str, fallback_id: str) -> Item:
    """One row's item: its `ids` (or `id`) field, else `fallback_id` (the file stem and the row's
    index among the file's rows), and its `inputs` as a conversation."""
    from experts import Item

    if "inputs" not in row:
        raise InputError(f"{where}: missing field 'inputs'")
    raw_id = row.get("ids", row.get("id"))
    item_id = ("" if raw_id is None else str(raw_id)).strip() or fallback_id  # a null id is no id
    return Item(item_id, _conversation(row["inputs"], where))


def is_dropped(row: Mapping[str, object]) -> bool:
    """Whether the row's label is one a labelled data set leaves out ("ambiguous")."""
    raw = row.get("labels")
    return raw is not None and str(raw).strip().lower() in _DROPPED


def row_label(row: Mapping[str, object], where: str) -> int | None:
    """The row's label as 1/0, None when it has none (or an ambiguous one); an unknown label is
    an InputError naming `where`."""
    raw = row.get("labels")
    if raw is None or is_dropped(row):
        return None
    text = str(raw).strip().lower()
    if not text:  # an empty cell: how a CSV leaves a row unlabelled (JSONL and Parquet give null)
        return None
    if text not in _LABELS:
        raise InputError(f"{where}: label {raw!r} is not high-stakes, low-stakes or ambiguous")
    return _LABELS[text]


def _rows(path: Path) -> list[tuple[str, dict[str, object]]]:
    """(where, row) pairs; `where` names the file and line."""
    return [(where, row) for where, row, _ in stream_rows(path)]


def stream_rows(
    path: Path, *, byte_offset: int = 0, line: int = 1
) -> Iterator[tuple[str, dict[str, object], int]]:
    """(where, row, the byte offset where the row starts) of a JSONL or CSV file, one at a time,
    from `byte_offset` (the start of a row that is line `line` of the file) on: a reader of a
    file's far end reads only its own lines. Blank lines are skipped; `where` names the file and
    line."""
    if path.is_dir():
        raise InputError(f"{path}: is a folder, expected a dataset file (.jsonl or .csv)")
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        if path.suffix.lower() == ".csv":
            yield from _csv_rows(path, byte_offset, line)
        else:
            yield from _jsonl_rows(path, byte_offset, line)
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except csv.Error as exc:  # a NUL byte, a field past the csv module's size limit
        raise InputError(f"{path}: malformed CSV ({exc})") from None


def _lines(path: Path, byte_offset: int, ends: list[int]) -> Iterator[str]:
    """The decoded lines from `byte_offset` on (line endings kept, a leading BOM dropped);
    `ends[0]` is kept at the byte offset after the last line handed out."""
    with path.open("rb") as handle:
        handle.seek(byte_offset)
        ends[0] = byte_offset
        for raw in handle:
            text = raw.decode("utf-8")
            if ends[0] == 0:
                text = text.removeprefix("\ufeff")
            ends[0] += len(raw)
            yield text


def _csv_rows(path: Path, byte_offset: int, line: int) -> Iterator[tuple[str, dict[str, object], int]]:
    with contextlib.closing(_lines(path, 0, [0])) as lines:
        header = next(csv.reader(lines), None)
    if header is None:
        return
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:  # a dict of the row would keep the last of them without a word
        raise InputError(f"{path}:1: column {repeated[0]!r} appears more than once")
    ends = [byte_offset]  # set again once the first line is read; a row's start is known before
    reader = csv.reader(_lines(path, byte_offset, ends))
    if byte_offset == 0:
        next(reader)  # the header, read above
    start, previous = ends[0], reader.line_num
    for fields in reader:
        where = f"{path}:{line + previous}"  # a quoted field may span lines: where the row starts
        row_start, start, previous = start, ends[0], reader.line_num
        if not fields:
            continue  # a blank line
        if len(fields) != len(header):
            # csv.DictReader would fill the missing fields with None (id 'None', no label)
            # or file the extra ones under a None key: a row like that was paid for.
            raise InputError(
                f"{where}: {len(fields)} fields where the header has {len(header)} ({', '.join(header)})"
            )
        yield where, dict(zip(header, fields, strict=True)), row_start


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # \ud800-\udfff, as JSON escapes them


def _jsonl_rows(path: Path, byte_offset: int, line: int) -> Iterator[tuple[str, dict[str, object], int]]:
    ends = [0]
    start = byte_offset
    for number, text in enumerate(_lines(path, byte_offset, ends), start=line):
        row_start, start = start, ends[0]
        if not text.strip():
            continue
        try:
            row = json.loads(text.rstrip("\r\n"))  # its newline would move the error to "line 2"
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{number}: malformed JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise InputError(f"{path}:{number}: malformed JSON (nested too deeply)") from None
        if not isinstance(row, dict):
            raise InputError(f"{path}:{number}: expected a JSON object per line")
        try:
            # JSON's \ud800 escape decodes to a lone surrogate, which no UTF-8 text (a hash of the
            # data, the cache, a request) can hold: refused here rather than at its first use.
            # Only a line with a surrogate's escape can hold one (the file itself decoded as UTF-8).
            if _SURROGATE_ESCAPE.search(text):
                json.dumps(row, ensure_ascii=False).encode()
        except UnicodeEncodeError as exc:
            raise InputError(
                f"{path}:{number}: a lone surrogate escape (\\u{ord(exc.object[exc.start]):04x}) is not text"
            ) from None
        yield f"{path}:{number}", row, row_start


def read_dataset(path: Path | str, *, require_labels: bool = False) -> Dataset:
    """Read a JSONL (or .csv) file of the McKenzie et al. format. Duplicate ids, unknown labels
    and malformed lines are errors naming the file and line."""
    path = Path(path)
    items: list[Item] = []
    labels: list[int | None] = []
    dropped = 0
    seen: dict[str, str] = {}
    extra: dict[str, list[str]] = {name: [] for name in _EXTRA}
    for where, row in _rows(path):
        if "inputs" not in row:
            raise InputError(f"{where}: missing field 'inputs'")
        if row.get("labels") is None and require_labels:
            raise InputError(f"{where}: missing field 'labels'")
        if is_dropped(row):
            dropped += 1
            continue
        label = row_label(row, where)
        item = row_item(row, where, f"{path.stem}-{len(items) + dropped}")
        if item.id in seen:
            raise InputError(f"{where}: id {item.id!r} repeats (first at {seen[item.id]})")
        seen[item.id] = where
        items.append(item)
        labels.append(label)
        for name in _EXTRA:
            value = row.get(name)
            extra[name].append("" if value is None else str(value).strip())
    if not items:
        raise InputError(f"{path}: no examples (after dropping {dropped} ambiguous rows)")
    extra = {name: values for name, values in extra.items() if any(values)}
    return Dataset(
        path=path, items=items, labels=labels, dropped=dropped, extra=extra, where=list(seen.values())
    )
