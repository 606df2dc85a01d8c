"""Bad scores tables (missing columns, out-of-range, missing and non-numeric cells, duplicate
ids, bad CSV rows): one clean error line naming the file, column and line or row, nothing written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_checks import (
    FAST_VALIDATE,
    ROW,
    assert_clean_error,
    bad_input_commands,
    check_summary,
    copy,
    ctd,
    one_json_object,
    where,
)

from harness import SCORES_COLUMNS, write_table


def _drop(name: str) -> Callable[[dict], tuple[dict, int | None, tuple[str, ...]]]:
    def make(c):
        del c[name]
        return c, None, (f"'{name}'",)

    return make


def _set(name: str, value: object, *fragments: str) -> Callable[[dict], tuple[dict, int | None, tuple]]:
    def make(c):
        c[name][ROW] = value
        return c, ROW, (f"column '{name}'", *fragments)

    return make


def _duplicate_id(c):
    c["id"][ROW] = c["id"][ROW - 100]
    return c, ROW, ("column 'id'", str(c["id"][ROW]))


def _text_in_probe(c):
    c["probe"] = np.array([repr(float(v)) for v in c["probe"]], dtype=object)  # a string column
    c["probe"][ROW] = "abc"
    return c, ROW, ("column 'probe'", "'abc' is not a number")


def _no_test_rows(c):
    dev = c["split"] == "dev"
    return {k: v[dev] for k, v in c.items()}, None, ("'test'",)


def _one_label(c):
    c["label"][(c["seed"] == 1) & (c["split"] == "test")] = 0
    return c, None, ("column 'label'", "seed 1")


BAD_TABLES = {
    "missing-expert-column": _drop("expert"),
    "missing-id-column": _drop("id"),
    "label-2": _set("label", 2, "2 is not 0 or 1"),
    "label-minus-1": _set("label", -1, "-1 is not 0 or 1"),
    "probe-above-1": _set("probe", 1.5, "1.5 is outside [0, 1]"),
    "expert-below-0": _set("expert", -0.25, "-0.25 is outside [0, 1]"),
    "nan-probe": _set("probe", np.nan, "missing value"),
    "nan-expert": _set("expert", np.nan, "missing value"),
    "nan-dv-on-a-test-row": _set("dv", np.nan, "missing value"),
    "inf-dv": _set("dv", np.inf, "infinite value"),
    "bad-split": _set("split", "train", "'train'"),
    "text-in-probe": _text_in_probe,
    "duplicate-id": _duplicate_id,
    "no-test-rows": _no_test_rows,
    "one-label-only": _one_label,
}


@pytest.mark.parametrize("command", ["validate", "calibrate"])
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("case", list(BAD_TABLES))
def test_bad_table(tmp_path: Path, base, case: str, fmt: str, command: str):
    columns, row, fragments = BAD_TABLES[case](copy(base))
    path = write_table(tmp_path / f"bad.{fmt}", columns)
    args, unwritten = bad_input_commands(tmp_path, path)[command]
    located = (where(fmt, row),) if row is not None else ()
    message = assert_clean_error(ctd(*args), str(path), *fragments, *located, unwritten=unwritten)
    if case == "duplicate-id":
        assert f"first at {where(fmt, ROW - 100)}" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.parametrize("column", ["label", "probe", "seed", "group"])
def test_parquet_null_cell(tmp_path: Path, base, column: str):
    columns = copy(base)
    arrays = {k: pa.array(v.tolist() if v.dtype == object else v) for k, v in columns.items()}
    mask = np.zeros(len(columns[column]), bool)
    mask[ROW] = True
    arrays[column] = pa.array(columns[column].tolist(), mask=mask)
    path = tmp_path / "nulls.parquet"
    pq.write_table(pa.table(arrays), path)
    args, unwritten = bad_input_commands(tmp_path, path)["validate"]
    fragment = "empty value" if column == "group" else "missing value"
    assert_clean_error(
        ctd(*args), str(path), f"column '{column}'", f"row {ROW + 1}", fragment, unwritten=unwritten
    )


def test_same_id_in_other_split_or_seed_is_fine(tmp_path: Path, base):
    columns = copy(base)
    test0 = np.flatnonzero((columns["split"] == "test") & (columns["seed"] == 0))
    dev0 = np.flatnonzero((columns["split"] == "dev") & (columns["seed"] == 0))
    columns["id"][dev0[:50]] = columns["id"][test0[:50]]  # same ids in dev and test of seed 0
    seed0 = columns["id"][columns["seed"] == 0].tolist()
    assert len(set(seed0)) == len(seed0) - 50  # 50 ids repeat across the splits of seed 0
    path = write_table(tmp_path / "ok.csv", columns)
    record = one_json_object(ctd("validate", "--scores", path, *FAST_VALIDATE, "--json"))
    check_summary(record, 20)


def _edit_csv(path: Path, index: int, column: str, text: str) -> None:
    """Replace one cell of data row `index` (0-based) in a CSV without quoted fields."""
    lines = path.read_bytes().decode("utf-8").splitlines(keepends=True)
    fields = lines[index + 1].rstrip("\r\n").split(",")
    fields[SCORES_COLUMNS.index(column)] = text
    lines[index + 1] = ",".join(fields) + "\r\n"
    path.write_bytes("".join(lines).encode("utf-8"))


CSV_CELLS = [
    ("probe", "abc", "'abc' is not a number"),
    ("expert", "0.5x", "'0.5x' is not a number"),
    ("label", "yes", "'yes' is not a number"),
    ("label", "0.5", "0.5 is not 0 or 1"),
    ("seed", "1.5", "1.5 is not an integer"),
    ("seed", "x1", "'x1' is not a number"),
    ("probe", "nan", "missing value"),
    ("expert", "NaN", "missing value"),
    ("probe", "", "missing value"),
    ("probe", "inf", "outside [0, 1]"),
    ("id", "", "empty value"),
]


@pytest.mark.parametrize("command", ["validate", "calibrate"])
@pytest.mark.parametrize(("column", "text", "fragment"), CSV_CELLS)
def test_bad_csv_cell(tmp_path: Path, base, column: str, text: str, fragment: str, command: str):
    path = write_table(tmp_path / "bad.csv", base)
    _edit_csv(path, ROW, column, text)
    args, unwritten = bad_input_commands(tmp_path, path)[command]
    assert_clean_error(
        ctd(*args), str(path), f"column '{column}'", fragment, f"line {ROW + 2}", unwritten=unwritten
    )


def test_csv_line_numbers_count_blank_lines(tmp_path: Path, base):
    path = write_table(tmp_path / "bad.csv", base)
    _edit_csv(path, ROW, "probe", "oops")
    lines = path.read_bytes().decode("utf-8").splitlines(keepends=True)
    lines[5:5] = ["\r\n"] * 3  # three blank lines before the bad row
    path.write_bytes("".join(lines).encode("utf-8"))
    assert path.read_text(encoding="utf-8").splitlines()[ROW + 4].startswith(str(base["id"][ROW]))
    args, unwritten = bad_input_commands(tmp_path, path)["validate"]
    assert_clean_error(ctd(*args), str(path), "column 'probe'", f"line {ROW + 5}", unwritten=unwritten)


def test_csv_row_with_wrong_field_count(tmp_path: Path, base):
    path = write_table(tmp_path / "bad.csv", base)
    lines = path.read_bytes().decode("utf-8").splitlines(keepends=True)
    lines[ROW + 1] = lines[ROW + 1].rstrip("\r\n") + ",extra\r\n"
    path.write_bytes("".join(lines).encode("utf-8"))
    args, unwritten = bad_input_commands(tmp_path, path)["calibrate"]
    assert_clean_error(ctd(*args), str(path), f"line {ROW + 2}", "10 fields", unwritten=unwritten)
