"""calibrate/ARCH/decisions.parquet written one mask group at a time: the same rows, ids and
types as the tidy table made whole; a reader's filtered read gives exactly the rows it asks for;
and a file written before the change (the tidy table in one piece) reads the same."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import calibrate
from harness import calibrate_scores, read_scores, simulate_scores, write_table
from harness.data import read_table, write_parquet_parts
from harness.report import read_decisions, read_sweep


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("decisions")
    scores = folder / "scores.parquet"
    write_table(scores, simulate_scores("strong", 600, 2, n_dev=300))
    calibrate_scores(scores, folder / "calibrate")
    return scores, folder / "calibrate"


def whole_table(scores: Path) -> dict[str, np.ndarray]:
    """The decisions as the sweep's tidy table, made whole, with each example's id."""
    table = read_scores(scores)
    result = calibrate.sweep(table.test_scores(None), calibrate.SweepConfig())
    columns = result.decisions
    ids = np.empty(columns["row"].size, dtype=object)
    for seed in np.unique(columns["seed"]):
        test_ids = table.id[(table.seed == seed) & (table.split == "test")]
        ids[columns["seed"] == seed] = test_ids[columns["row"][columns["seed"] == seed]]
    return {"id": ids.astype(str), **columns}


def test_the_file_written_in_parts_is_the_whole_table(swept: tuple[Path, Path]) -> None:
    scores, out = swept
    written = read_table(out / "decisions.parquet").columns
    expected = whole_table(scores)
    assert list(written) == list(expected)
    for name, values in expected.items():
        assert np.array_equal(written[name].astype(values.dtype), values), name
    assert written["delegated"].dtype == bool and written["seed"].dtype == np.int64


def test_a_readers_filtered_read_is_exactly_its_rows(swept: tuple[Path, Path]) -> None:
    _, out = swept
    sweep = read_sweep(out)
    budgets = [float(sweep.budgets[1]), float(sweep.budgets[3])]
    found = read_decisions(sweep, budgets)
    assert found is not None
    got = found.columns
    c = read_table(out / "decisions.parquet").columns
    keep = (
        np.isin(c["objective"], [sweep.objective_for("auroc"), calibrate.ANY_OBJECTIVE])
        & np.isin(c["batch_size"], [max(sweep.batch_sizes), calibrate.ANY_BATCH_SIZE])
        & np.isin(c["budget"], budgets)
    )
    assert keep.sum() < c["row"].size / 4  # a small part of the file
    for name in c:
        assert np.array_equal(got[name], c[name][keep]), name
    none = read_decisions(sweep, [])
    assert none is not None and none.columns["row"].size == 0


def with_decisions(out: Path, folder: Path, decisions: dict[str, np.ndarray]) -> Path:
    """A copy of the sweep folder `out` in `folder` whose decisions.parquet is `decisions`."""
    folder.mkdir()
    for path in out.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    write_table(folder / "decisions.parquet", decisions)
    return folder


def test_a_file_from_before_reads_the_same(swept: tuple[Path, Path], tmp_path: Path) -> None:
    scores, out = swept
    old = with_decisions(out, tmp_path / "calibrate", whole_table(scores))  # one piece, as before
    budgets = [float(b) for b in read_sweep(out).budgets[:2]]
    new_rows, old_rows = read_decisions(read_sweep(out), budgets), read_decisions(read_sweep(old), budgets)
    assert new_rows is not None and old_rows is not None
    for name in new_rows.columns:
        assert np.array_equal(new_rows.columns[name], old_rows.columns[name]), name


def test_an_empty_file_from_before_reads_as_empty(swept: tuple[Path, Path], tmp_path: Path) -> None:
    """Before the columns were typed, a sweep without masks wrote every column but id as float."""
    _, out = swept
    empty = {"id": np.array([], dtype=str), **{c: np.array([]) for c in calibrate.DECISION_COLUMNS}}
    old = with_decisions(out, tmp_path / "calibrate", empty)
    found = read_decisions(read_sweep(old), [0.2])
    assert found is not None and all(v.size == 0 for v in found.columns.values())


def test_parts_share_one_schema_and_none_writes_the_empty_table(tmp_path: Path) -> None:
    parts = [
        {"a": np.arange(3, dtype=np.int32), "b": np.array(["x", "y", "z"])},
        {"a": np.arange(2, dtype=np.int64), "b": pa.array(["long value", "w"])},  # Arrow strings too
    ]
    write_parquet_parts(tmp_path / "t.parquet", iter(parts), empty=lambda: pytest.fail("not needed"))
    c = read_table(tmp_path / "t.parquet").columns
    assert c["a"].tolist() == [0, 1, 2, 0, 1] and c["b"].tolist() == ["x", "y", "z", "long value", "w"]
    kept = read_table(tmp_path / "t.parquet", where=pc.field("a") >= 1).columns
    assert kept["b"].tolist() == ["y", "z", "w"]
    write_parquet_parts(tmp_path / "e.parquet", iter([]), empty=lambda: {"a": np.array([], dtype=np.int64)})
    assert read_table(tmp_path / "e.parquet").columns["a"].size == 0


def test_a_sweep_that_fails_while_writing_leaves_the_previous_one_whole(
    swept: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files are written into a staging folder and renamed in together: a sweep that dies
    after writing its new sweep.csv (here: its ltt.jsonl fails) leaves every file as it was."""
    # Private: the stage module's writer, made to fail half-way through a sweep's files.
    import harness.stages._calibrate as stage

    scores, previous = swept
    out = tmp_path / "calibrate"
    calibrate_scores(scores, out, calibrate.SweepConfig(budgets=(0.3, 0.5)))
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full_disk(path: Path, records: object) -> None:
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(stage, "write_jsonl", full_disk)
    with pytest.raises(OSError):
        calibrate_scores(scores, out, calibrate.SweepConfig(budgets=(0.2, 0.4)))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # and no staging folder left
    monkeypatch.undo()
    calibrate_scores(scores, out, calibrate.SweepConfig(budgets=(0.2, 0.4)))
    assert read_sweep(out).config.budgets == (0.2, 0.4)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in previous.iterdir())
