"""Reading and writing column tables as Parquet or CSV (chosen by the file name).

Tables are plain `dict[str, numpy array]`. Writes are atomic: a temporary file in the target
folder is renamed into place, so an interrupted write never leaves a half-written table.
"""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from numpy.typing import NDArray

from .._errors import ENVIRONMENT_ERRNOS, EnvironmentFailure, InputError, named

__all__ = [
    "TABLE_SUFFIXES",
    "RawTable",
    "atomic_path",
    "check_writable",
    "check_writable_folder",
    "dumps",
    "not_utf8",
    "read_json",
    "read_table",
    "write_json",
    "write_jsonl",
    "write_parquet_parts",
    "write_table",
]


class RawTable:
    """Columns as read from disk, with a way to name a row in error messages.

    CSV cells are strings (an empty cell is ""); Parquet columns keep their types.
    `where(i)` names data row i: "line L" for CSV (the header is line 1), "row R" for Parquet.
    """

    def __init__(self, path: Path, columns: dict[str, NDArray], where: Callable[[int], str]):
        self.path = path
        self.columns = columns
        self.where = where

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0


TABLE_SUFFIXES = (".parquet", ".csv")

MIN_FREE_BYTES = 64 * 1024
"""Less than this free where an output goes is a full disk, refused before the work is paid."""


def _is_csv(path: Path) -> bool:
    return path.suffix.lower() == ".csv"


def check_writable(
    path: Path,
    option: str,
    suffixes: tuple[str, ...] = TABLE_SUFFIXES,
    *,
    inputs: Iterable[tuple[str, Path]] = (),
) -> Path:
    """Check, before any work is done or paid for, that a file can be written at `path`: a
    known suffix, not a folder, none of the command's `inputs` ((option, file) pairs: the data
    it reads would be replaced by what it writes), and a folder (or the nearest existing ancestor)
    that accepts a new file and has room. Nothing is left behind; the problem is one line naming
    the option: an InputError, or an EnvironmentFailure (exit code 3) when the machine refuses
    (a full disk, a read-only mount, no permission)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{option} {path}: is a folder, expected a file name ({' or '.join(suffixes)})")
    for name, source in inputs:
        if _same_file(path, Path(source)):
            raise InputError(f"{option} {path}: is the {name} file, which it would replace; use another file")
    if path.suffix.lower() not in suffixes:
        raise InputError(
            f"{option} {path}: unknown file type {path.suffix or '(none)'!r}; use {' or '.join(suffixes)}"
        )
    _check_room(path, path.parent, option)
    return path


def _same_file(a: Path, b: Path) -> bool:
    """Whether two names are one file: the same file when both exist (links, other spellings),
    else the same absolute path (a cache the command is about to create, say)."""
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def check_writable_folder(path: Path, option: str) -> Path:
    """`check_writable` for an output folder: not an existing file, and the folder (or the nearest
    existing ancestor) accepts a new file and has room. Checked before any work is paid for, so
    that a run does not fail at its end for want of a place to write."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{option} {path}: exists and is not a folder")
    _check_room(path, path, option)
    return path


def _check_room(path: Path, folder: Path, option: str) -> None:
    """`folder`, or its nearest existing ancestor, is a folder that accepts a new file (nothing is
    left behind) and has room for the output `path` the user named in `option`."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise InputError(f"{option} {path}: {folder} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
    except OSError as exc:
        problem = f"{option} {path}: cannot write in {folder} ({exc.strerror or exc})"
        raise (EnvironmentFailure if exc.errno in ENVIRONMENT_ERRNOS else InputError)(problem) from None
    os.close(fd)
    os.unlink(probe)
    free = _free_bytes(folder)
    if free < MIN_FREE_BYTES:
        raise EnvironmentFailure(
            f"{option} {path}: no space left on the device of {folder} ({free} bytes free)"
        )


def _free_bytes(folder: Path) -> int:
    """Bytes this process may still write on the device of `folder` (root may use the blocks
    a file system reserves for it)."""
    stats = os.statvfs(folder)
    return (stats.f_bfree if os.geteuid() == 0 else stats.f_bavail) * stats.f_frsize


def read_table(path: Path, *, where: pc.Expression | None = None) -> RawTable:
    """Read a Parquet or CSV table; any failure becomes one InputError line naming the file.
    `where` (Parquet only): read only the rows it keeps, a row group at a time, so that a few
    rows of a large file cost memory for those rows alone."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a folder, expected a .parquet or .csv file")
    if _is_csv(path):
        if where is not None:
            raise ValueError("read_table: `where` reads Parquet files only")
        return _read_csv(path)
    try:
        table = pq.read_table(path, filters=where)
    except (pa.ArrowException, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{path}: not a readable Parquet file ({first})") from None
    columns = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
    return RawTable(path, columns, lambda i: f"row {i + 1}")


def _read_csv(path: Path) -> RawTable:
    try:
        # utf-8-sig: spreadsheets often start CSV files with a byte-order mark.
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                raise InputError(f"{path}: empty file, expected a header line")
            repeated = sorted({name for name in header if header.count(name) > 1})
            if repeated:
                raise InputError(f"{path}: line 1: column {repeated[0]!r} appears more than once")
            lines: list[int] = []
            rows: list[list[str]] = []
            while True:
                first_line = reader.line_num + 1  # a quoted field may span several lines
                row = next(reader, None)
                if row is None:
                    break
                if not row:
                    continue
                if len(row) != len(header):
                    raise InputError(
                        f"{path}: line {first_line}: {len(row)} fields, the header has {len(header)}"
                    )
                rows.append(row)
                lines.append(first_line)
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except csv.Error as exc:
        raise InputError(f"{path}: malformed CSV ({exc})") from None
    columns = {name: np.array([r[j] for r in rows], dtype=object) for j, name in enumerate(header)}
    line_of = np.asarray(lines)
    return RawTable(path, columns, lambda i: f"line {line_of[i]}")


def not_utf8(path: Path) -> InputError:
    """The error for a text file that is not UTF-8, naming the line of the first bad byte (a text
    reader's offsets are relative to its read buffer, so the whole file is decoded once more)."""
    raw = path.read_bytes()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        return InputError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); save it as UTF-8")
    return InputError(f"{path}: not UTF-8 text; save it as UTF-8")


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success rename it to `path`, else delete it.
    An OSError that names no file (a full disk met by the writer's write, flush or close:
    pyarrow, json, matplotlib) is raised naming `path`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise named(exc, path.parent) from None
    os.close(fd)
    try:
        yield Path(tmp)
        # mkstemp creates the file owner-only; give it the mode a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        # The temporary's name means nothing to the user: the file being written is `path`.
        raise named(exc, path, unless_named=tmp) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _cell(value: object) -> str:
    if isinstance(value, float | np.floating):
        return "" if math.isnan(value) else repr(float(value))
    if isinstance(value, np.generic):
        return str(value.item())
    return str(value)


def write_table(path: Path, columns: Mapping[str, NDArray]) -> Path:
    """Write columns to `path` (.csv or .parquet), atomically. NaN becomes an empty CSV cell."""
    path = Path(path)
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise InputError(f"{path}: unknown table type {path.suffix or '(none)'!r}; use .parquet or .csv")
    with atomic_path(path) as tmp:
        if _is_csv(path):
            names = list(columns)
            with tmp.open("w", newline="", encoding="utf-8") as handle:
                writer = csv.writer(handle)
                writer.writerow(names)
                arrays = [np.asarray(columns[n]) for n in names]
                for i in range(len(arrays[0]) if arrays else 0):
                    writer.writerow([_cell(a[i]) for a in arrays])
        else:
            pq.write_table(pa.table({k: np.asarray(v) for k, v in columns.items()}), tmp)
    return path


def write_parquet_parts(
    path: Path,
    parts: Iterable[Mapping[str, NDArray | pa.Array]],
    *,
    empty: Callable[[], Mapping[str, NDArray]],
) -> Path:
    """Write `parts` (columns as numpy or Arrow arrays, one schema: the first part's) one after
    another as one Parquet file, atomically, holding one part in memory at a time; `empty()` when
    there is none."""
    path = Path(path)
    with atomic_path(path) as tmp:
        writer: pq.ParquetWriter | None = None
        try:
            for part in parts:
                table = pa.table({k: _arrow(v) for k, v in part.items()})
                if writer is None:
                    writer = pq.ParquetWriter(tmp, table.schema)
                writer.write_table(table.cast(writer.schema))
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            pq.write_table(pa.table({k: np.asarray(v) for k, v in empty().items()}), tmp)
    return path


def _arrow(values: NDArray | pa.Array) -> pa.Array | NDArray:
    return values if isinstance(values, pa.Array) else np.asarray(values)


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _finite(value: object) -> object:
    """JSON has no NaN or Infinity: write them as null and "inf"."""
    if isinstance(value, float | np.floating):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return float(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, np.ndarray):
        return [_finite(v) for v in value.tolist()]
    return value


def dumps(value: object, **kwargs: object) -> str:
    """Strict JSON (no NaN) of dicts, lists, numpy scalars and arrays."""
    return json.dumps(_finite(value), default=_json_default, allow_nan=False, **kwargs)


def write_json(path: Path, value: object) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(dumps(value, indent=2) + "\n", encoding="utf-8")
    return Path(path)


def write_jsonl(path: Path, records: list[dict[str, object]]) -> Path:
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(dumps(record) + "\n")
    return Path(path)


def read_json(path: Path) -> dict:
    """A JSON object the harness wrote; a missing or unreadable file is one InputError line."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise InputError(f"{path}: expected a JSON object")
    return value
