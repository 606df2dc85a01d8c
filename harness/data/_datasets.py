"""Datasets in the format of McKenzie et al. (2025): JSONL or CSV rows with `inputs` (a plain
string, or a JSON-encoded list of {"role", "content"} messages), `ids` and `labels`
("high-stakes" = 1, "low-stakes" = 0, "ambiguous" dropped and counted; 1/0 also accepted)."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from experts import Conversation

from .._errors import InputError
from ._tables import not_utf8

if TYPE_CHECKING:
    from experts import Item

__all__ = ["Dataset", "read_dataset"]

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
    for i, message in enumerate(messages):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise InputError(f"{where}: message {i} of 'inputs' needs string 'role' and 'content'")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _rows(path: Path) -> list[tuple[str, dict[str, object]]]:
    """(where, row) pairs; `where` names the file and line."""
    if path.is_dir():
        raise InputError(f"{path}: is a folder, expected a dataset file (.jsonl or .csv)")
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        return _decoded_rows(path)
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except csv.Error as exc:  # a NUL byte, a field past the csv module's size limit
        raise InputError(f"{path}: malformed CSV ({exc})") from None


def _decoded_rows(path: Path) -> list[tuple[str, dict[str, object]]]:
    rows: list[tuple[str, dict[str, object]]] = []
    if path.suffix.lower() == ".csv":
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                return rows
            previous = reader.line_num
            for fields in reader:
                where = f"{path}:{previous + 1}"  # a quoted field may span lines: where the row starts
                previous = reader.line_num
                if not fields:
                    continue  # a blank line
                if len(fields) != len(header):
                    # csv.DictReader would fill the missing fields with None (id 'None', no label)
                    # or file the extra ones under a None key: a row like that was paid for.
                    raise InputError(
                        f"{where}: {len(fields)} fields where the header has {len(header)} "
                        f"({', '.join(header)})"
                    )
                rows.append((where, dict(zip(header, fields, strict=True))))
        return rows
    with path.open(encoding="utf-8-sig") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(
                    f"{path}:{number}: malformed JSON ({exc.msg} at column {exc.colno})"
                ) from None
            if not isinstance(row, dict):
                raise InputError(f"{path}:{number}: expected a JSON object per line")
            rows.append((f"{path}:{number}", row))
    return rows


def read_dataset(path: Path | str, *, require_labels: bool = False) -> Dataset:
    """Read a JSONL (or .csv) file of the McKenzie et al. format. Duplicate ids, unknown labels
    and malformed lines are errors naming the file and line."""
    # The expert client (aiohttp, sqlmodel) loads with the first data set, not on --help
    from experts import Item

    path = Path(path)
    items: list[Item] = []
    labels: list[int | None] = []
    dropped = 0
    seen: dict[str, str] = {}
    extra: dict[str, list[str]] = {name: [] for name in _EXTRA}
    for where, row in _rows(path):
        if "inputs" not in row:
            raise InputError(f"{where}: missing field 'inputs'")
        raw_label = row.get("labels")
        if raw_label is None and require_labels:
            raise InputError(f"{where}: missing field 'labels'")
        label: int | None = None
        if raw_label is not None:
            text = str(raw_label).strip().lower()
            if text in _DROPPED:
                dropped += 1
                continue
            if text not in _LABELS:
                raise InputError(f"{where}: label {raw_label!r} is not high-stakes, low-stakes or ambiguous")
            label = _LABELS[text]
        item_id = str(row.get("ids", row.get("id", ""))).strip() or f"{path.stem}-{len(items) + dropped}"
        if item_id in seen:
            raise InputError(f"{where}: id {item_id!r} repeats (first at {seen[item_id]})")
        seen[item_id] = where
        items.append(Item(item_id, _conversation(row["inputs"], where)))
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
