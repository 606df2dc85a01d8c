"""File I/O of the scores table (SPEC section 2): simulate -> write -> read round trips, the
properties of the simulated table, and atomic writes."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Private: the table writer's atomic writes and JSON encoding, unit-tested.
import harness.data._tables as tables
from harness import (
    SCORES_COLUMNS,
    InputError,
    read_scores,
    read_table,
    simulate,
    simulate_scores,
    write_scores,
    write_table,
)
from harness.data import write_json, write_jsonl

GROUPS = {"anthropic", "mt", "mts", "toolace"}
N, N_DEV, SEEDS = 300, 200, 2


def _leftovers(folder: Path) -> list[str]:
    """Temporary files that an atomic write may leave behind."""
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp") or p.name.startswith("."))


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    return simulate_scores("weak", N, SEEDS, n_dev=N_DEV, random_state=7)


@pytest.fixture(scope="module", params=["parquet", "csv"])
def written(request, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp(f"sim-{request.param}")
    path = simulate("weak", N, SEEDS, folder / f"scores.{request.param}", n_dev=N_DEV, random_state=7)
    assert path == folder / f"scores.{request.param}"
    return path


# --- round trips -------------------------------------------------------------------------------


def test_simulate_writes_the_format_named_by_the_suffix(written: Path):
    if written.suffix == ".csv":
        with written.open(newline="", encoding="utf-8") as handle:
            header = next(csv.reader(handle))
        assert header == list(SCORES_COLUMNS)
    else:
        assert pq.read_schema(written).names == list(SCORES_COLUMNS)


def test_round_trip_is_exact(written: Path, expected: dict[str, np.ndarray]):
    table = read_scores(written)
    assert table.source == str(written)
    for name in ("id", "group", "split", "arch"):
        assert getattr(table, name).tolist() == [str(v) for v in expected[name]], name
    for name in ("label", "seed"):
        got = getattr(table, name)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, expected[name])
    for name in ("probe", "expert", "dv"):
        got = getattr(table, name)
        assert got.dtype == np.float64
        # Bit-exact, not approximately equal: CSV cells carry repr(float).
        assert np.array_equal(got, expected[name], equal_nan=True), name
        assert got.tobytes() == np.asarray(expected[name], dtype=np.float64).tobytes(), name


def test_dv_is_nan_exactly_on_dev_rows(written: Path):
    table = read_scores(written)
    np.testing.assert_array_equal(np.isnan(table.dv), table.split == "dev")
    assert np.isfinite(table.dv[table.split == "test"]).all()


def test_parquet_and_csv_read_back_identically(tmp_path: Path, expected: dict[str, np.ndarray]):
    a = read_scores(write_scores(tmp_path / "t.parquet", expected))
    b = read_scores(write_scores(tmp_path / "t.csv", expected))
    for name in SCORES_COLUMNS:
        x, y = getattr(a, name), getattr(b, name)
        if x.dtype.kind == "f":
            assert np.array_equal(x, y, equal_nan=True), name
        else:
            assert x.tolist() == y.tolist(), name


def test_csv_writes_nan_as_an_empty_cell(tmp_path: Path, expected: dict[str, np.ndarray]):
    path = write_scores(tmp_path / "t.csv", expected)
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == SEEDS * (N + N_DEV)
    assert {r["dv"] for r in rows if r["split"] == "dev"} == {""}
    assert all(r["dv"] != "" for r in rows if r["split"] == "test")
    assert {r["label"] for r in rows} == {"0", "1"}
    assert {r["seed"] for r in rows} == {"0", "1"}


def test_rewriting_a_read_table_gives_the_same_table(tmp_path: Path, written: Path):
    first = read_scores(written)
    again = read_scores(write_scores(tmp_path / f"again{written.suffix}", first.columns()))
    for name in SCORES_COLUMNS:
        assert np.array_equal(getattr(first, name), getattr(again, name), equal_nan=name == "dv"), name


# --- properties of the simulated table ---------------------------------------------------------


def test_simulated_shape_seeds_and_splits(written: Path):
    table = read_scores(written)
    assert len(table.id) == SEEDS * (N + N_DEV)
    assert table.seeds == list(range(SEEDS))
    for seed in table.seeds:
        rows = table.seed == seed
        assert (table.split[rows] == "test").sum() == N
        assert (table.split[rows] == "dev").sum() == N_DEV
    assert set(table.arch) == {"simulated"}
    assert sorted(table.test_scores()) == list(range(SEEDS))
    assert all(s.n == N for s in table.test_scores().values())


def test_ids_unique_within_split_and_seed(written: Path):
    table = read_scores(written)
    keys = list(zip(table.split.tolist(), table.seed.tolist(), table.id.tolist(), strict=True))
    assert len(set(keys)) == len(keys)
    # The same example appears once under every probe seed.
    for split in ("dev", "test"):
        per_seed = [set(table.id[(table.split == split) & (table.seed == s)]) for s in table.seeds]
        assert all(ids == per_seed[0] for ids in per_seed)


def test_four_groups_each_present_in_both_splits(written: Path):
    table = read_scores(written)
    assert set(table.group) == GROUPS
    for split in ("dev", "test"):
        assert set(table.group[table.split == split]) == GROUPS


def test_labels_balanced_and_scores_in_range(written: Path):
    table = read_scores(written)
    assert set(np.unique(table.label)) == {0, 1}
    for seed in table.seeds:
        for split in ("dev", "test"):
            rows = (table.seed == seed) & (table.split == split)
            assert abs(table.label[rows].mean() - 0.5) <= 0.05, (seed, split)
    for name in ("probe", "expert"):
        values = getattr(table, name)
        assert ((values >= 0) & (values <= 1)).all()
        assert values.std() > 0.1  # informative scores, not a constant


def test_expert_does_not_depend_on_probe_seed_but_probe_does(expected: dict[str, np.ndarray]):
    seed0, seed1 = expected["seed"] == 0, expected["seed"] == 1
    np.testing.assert_array_equal(expected["expert"][seed0], expected["expert"][seed1])
    np.testing.assert_array_equal(expected["label"][seed0], expected["label"][seed1])
    assert not np.array_equal(expected["probe"][seed0], expected["probe"][seed1])


def test_simulation_is_deterministic_in_random_state():
    a = simulate_scores("strong", 50, 1, random_state=3)
    b = simulate_scores("strong", 50, 1, random_state=3)
    c = simulate_scores("strong", 50, 1, random_state=4)
    for name in SCORES_COLUMNS:
        assert np.array_equal(a[name], b[name], equal_nan=name == "dv")
    assert not np.array_equal(a["probe"], c["probe"])


# --- property-based round trip ---------------------------------------------------------------

_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\x00"),
    min_size=1,
    max_size=12,
)
_unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
_real = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def _tables(draw) -> dict[str, np.ndarray]:
    n = draw(st.integers(min_value=1, max_value=12))
    ids = draw(st.lists(_text, min_size=n, max_size=n, unique=True))
    split = draw(st.lists(st.sampled_from(["dev", "test"]), min_size=n, max_size=n))
    split[0] = "test"
    dv = [
        draw(st.one_of(st.just(math.nan), _real)) if s == "dev" else draw(_real)
        for s in split  # NaN only allowed on dev rows
    ]
    return {
        "id": np.array(ids, dtype=object),
        "group": np.array(draw(st.lists(_text, min_size=n, max_size=n)), dtype=object),
        "split": np.array(split, dtype=object),
        "label": np.array(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)), dtype=np.int64),
        "probe": np.array(draw(st.lists(_unit, min_size=n, max_size=n)), dtype=np.float64),
        "expert": np.array(draw(st.lists(_unit, min_size=n, max_size=n)), dtype=np.float64),
        "dv": np.array(dv, dtype=np.float64),
        "seed": np.full(n, draw(st.integers(0, 10**6)), dtype=np.int64),
        "arch": np.array(draw(st.lists(_text, min_size=n, max_size=n)), dtype=object),
    }


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(columns=_tables())
def test_any_valid_table_round_trips_exactly(tmp_path: Path, suffix: str, columns):
    path = write_scores(tmp_path / f"t{suffix}", columns)
    table = read_scores(path)
    for name in ("id", "group", "split", "arch"):
        assert getattr(table, name).tolist() == columns[name].tolist(), name
    for name in ("label", "seed"):
        assert getattr(table, name).tolist() == columns[name].tolist(), name
    for name in ("probe", "expert", "dv"):
        assert np.array_equal(getattr(table, name), columns[name], equal_nan=True), name
    assert not _leftovers(tmp_path)


# --- atomic writes ---------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_write_table_leaves_no_temporary_file(tmp_path: Path, suffix: str):
    path = tmp_path / "nested" / "deeper" / f"t{suffix}"  # missing folders are created
    write_table(path, {"a": np.arange(5), "b": np.linspace(0, 1, 5)})
    assert path.is_file()
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    raw = read_table(path)
    assert len(raw) == 5 and list(raw.columns) == ["a", "b"]


def test_write_table_replaces_an_existing_file(tmp_path: Path):
    path = tmp_path / "t.csv"
    write_table(path, {"a": np.arange(3)})
    write_table(path, {"b": np.arange(2)})
    assert path.read_text(encoding="utf-8").splitlines() == ["b", "0", "1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_failed_csv_write_keeps_the_old_file(tmp_path: Path, monkeypatch, error):
    path = tmp_path / "t.csv"
    write_table(path, {"x": np.arange(4)})
    before = path.read_bytes()
    real_cell, calls = tables._cell, []

    def cell(value):
        calls.append(value)
        if len(calls) > 50:  # well into the data rows: part of the new table is on disk
            raise error("disk on fire")
        return real_cell(value)

    monkeypatch.setattr(tables, "_cell", cell)
    with pytest.raises(error, match="disk on fire"):
        write_table(path, {"x": np.arange(1000), "y": np.arange(1000) / 7})
    assert len(calls) == 51
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]
    assert not _leftovers(tmp_path)


def test_failed_parquet_write_keeps_the_old_file(tmp_path: Path, monkeypatch):
    path = tmp_path / "t.parquet"
    write_table(path, {"x": np.arange(4)})
    before = path.read_bytes()
    targets: list[Path] = []

    def half_write(table, where, *args, **kwargs):
        targets.append(Path(where))
        Path(where).write_bytes(b"PAR1 half a file")  # something partial reaches the disk
        raise OSError("no space left on device")

    monkeypatch.setattr(tables.pq, "write_table", half_write)
    with pytest.raises(OSError, match="no space left"):
        write_table(path, {"x": np.arange(10)})
    # It wrote to a temporary file next to the target, never to the target itself.
    assert len(targets) == 1 and targets[0] != path and targets[0].parent == tmp_path
    assert not targets[0].exists()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet"]
    monkeypatch.undo()
    assert read_table(path).columns["x"].tolist() == [0, 1, 2, 3]


def test_failed_first_write_leaves_nothing(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(tables, "_cell", lambda value: (_ for _ in ()).throw(ValueError("bad cell")))
    with pytest.raises(ValueError, match="bad cell"):
        write_table(tmp_path / "t.csv", {"x": np.arange(3)})
    assert list(tmp_path.iterdir()) == []


def test_json_writers_are_atomic_and_strict(tmp_path: Path, monkeypatch):
    path = write_json(tmp_path / "s.json", {"a": np.float64(0.5), "nan": math.nan, "inf": math.inf})
    assert path.read_text(encoding="utf-8") == '{\n  "a": 0.5,\n  "nan": null,\n  "inf": "inf"\n}\n'
    lines = write_jsonl(tmp_path / "l.jsonl", [{"k": np.int64(1)}, {"k": [1, 2]}])
    assert lines.read_text(encoding="utf-8") == '{"k": 1}\n{"k": [1, 2]}\n'
    before = path.read_bytes()
    with pytest.raises(TypeError):
        write_json(path, {"bad": object()})
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.jsonl", "s.json"]


# --- where errors point ----------------------------------------------------------------------


def test_csv_rows_are_named_by_physical_line(tmp_path: Path, expected: dict[str, np.ndarray]):
    path = write_scores(tmp_path / "t.csv", expected)
    # csv.writer ends lines with CRLF; work on LF lines (line i+1 of the file is lines[i]).
    lines = path.read_bytes().decode("utf-8").replace("\r\n", "\n").splitlines(keepends=True)
    # Blank lines and a quoted id spanning two lines come before the bad row.
    lines.insert(3, "\n")
    lines.insert(3, "\n")
    lines[6] = '"multi\nline id"' + lines[6][lines[6].index(",") :]
    bad = 10  # physical line of the row whose label we break (after 2 blank lines and 1 extra line)
    data_line = lines[bad - 2]
    fields = data_line.rstrip("\n").split(",")
    fields[SCORES_COLUMNS.index("label")] = "7"
    lines[bad - 2] = ",".join(fields) + "\n"
    path.write_text("".join(lines), encoding="utf-8")
    assert path.read_text(encoding="utf-8").splitlines()[bad - 1].split(",")[3] == "7"
    expected = rf"^{re.escape(str(path))}: column 'label', line {bad}: 7 is not 0 or 1$"
    with pytest.raises(InputError, match=expected):
        read_scores(path)


def test_crlf_csv_reads_like_lf(tmp_path: Path, expected: dict[str, np.ndarray]):
    lf = write_scores(tmp_path / "lf.csv", expected)
    crlf = tmp_path / "crlf.csv"
    crlf.write_bytes(lf.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    a, b = read_scores(lf), read_scores(crlf)
    for name in SCORES_COLUMNS:
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=name == "dv"), name


def test_parquet_rows_are_numbered_from_one(tmp_path: Path, expected: dict[str, np.ndarray]):
    columns = {k: v.copy() for k, v in expected.items()}
    columns["expert"][41] = 3.0
    path = write_scores(tmp_path / "t.parquet", columns)
    message = rf"^{re.escape(str(path))}: column 'expert', row 42: 3 is outside \[0, 1\]$"
    with pytest.raises(InputError, match=message):
        read_scores(path)
