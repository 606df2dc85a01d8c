"""`ctd cache forget` as a user of a cache with answers of the old `choice` rung uses it: a cache
built by a real `ctd query`, some of its answers marked as an older version of the project would
have stored them; counted without --yes (nothing changes), then forgotten, with a copy that `ctd
cache import` puts back row for row; the next `ctd query` asks those items and no other. A copy
that cannot be written (a full disk) removes nothing, and a removal stopped part way (another
process holding the cache's lock) leaves every answer in the cache or the copy; bad options are
one line and exit code 2."""

from __future__ import annotations

import json
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from ctd_cli import assert_one_line_error, run_ctd
from fault_server import RunningServer
from full_disk import fill

import experts
from experts import ScoreCache, StorageError

# Private: the columns of an answer as the copy writes them.
from experts._merge import ANSWER_COLUMNS

N = 12
OLD = (1, 4, 5, 9)  # the items whose answers an older version got by the first `choice` rung


def query(folder: Path, url: str) -> dict:
    registry = folder / "experts.toml"
    registry.write_text(f'[experts.fault]\nbase_url = "{url}"\nmodel = "fault-model"\n')
    env = {"CTD_CACHE": str(folder / "cache.sqlite"), "CTD_EXPERTS_FILE": str(registry)}
    options = ("--data", "data.jsonl", "--out", "out.csv", "--expert", "fault", "--json")
    result = run_ctd("query", *options, cwd=folder, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def forget(cache: Path, *options: str):
    """`ctd cache forget` on `cache`, run in its folder."""
    return run_ctd("cache", "forget", "--cache", str(cache), *options, cwd=cache.parent)


def answers(path: Path) -> list[tuple]:
    """Every stored answer, every column, in key order."""
    with closing(sqlite3.connect(path)) as connection:
        return connection.execute("SELECT * FROM scores ORDER BY key").fetchall()


def answer_set(path: Path) -> set[tuple]:
    """Every stored answer as the copy writes its columns."""
    with closing(sqlite3.connect(path)) as connection:
        listed = ", ".join(f'"{c}"' for c in ANSWER_COLUMNS)
        return set(connection.execute(f"SELECT {listed} FROM scores").fetchall())


def item_requests(server: RunningServer) -> int:
    return sum(n for item, n in server.server.counts.requests.items() if item >= 0)


@pytest.fixture()
def built(tmp_path: Path):
    """A cache of N answers from a real `ctd query`, OLD of them marked `choice`, and the server."""
    rows = [
        {"ids": f"ex{i}", "inputs": f"item-{i}: is this risky?", "labels": "low-stakes"} for i in range(N)
    ]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with RunningServer() as server:
        assert query(tmp_path, server.url)["scored"] == N
        with closing(sqlite3.connect(tmp_path / "cache.sqlite")) as connection:
            ids = [f"ex{i}" for i in OLD]
            connection.execute(
                f"UPDATE scores SET how = 'choice' WHERE item_id IN ({','.join('?' * len(ids))})", ids
            )
            connection.commit()
        yield tmp_path, server


def test_forget_counts_copies_removes_and_the_next_run_asks_those_alone(built) -> None:
    folder, server = built
    cache = folder / "cache.sqlite"
    before = answers(cache)

    counted = forget(cache, "--how", "choice", "--json")
    assert counted.returncode == 0, counted.stderr
    assert json.loads(counted.stdout) == {
        "cache": str(cache), "how": "choice", "answers": {"fault": len(OLD)}, "forgotten": 0, "backup": None,
    }  # fmt: skip
    assert answers(cache) == before  # without --yes nothing changes
    assert not [p for p in folder.iterdir() if "forgotten" in p.name]

    done = forget(cache, "--how", "choice", "--yes")
    assert done.returncode == 0, done.stderr
    assert f"forgot {len(OLD)} answers got as choice" in done.stdout
    (backup,) = folder.glob("cache.forgotten-choice-*.jsonl")  # the default: beside the cache
    assert str(backup) in done.stdout
    left = answers(cache)
    assert len(left) == N - len(OLD) and set(left) <= set(before)
    copied = {json.loads(line)["item_id"] for line in backup.read_text().splitlines()}
    assert copied == {f"ex{i}" for i in OLD}
    assert not [p for p in folder.iterdir() if p.name.endswith(".partial")]

    # The copy puts them back, every column as it was (on a copy of the cache: the run below needs them gone).
    restored = folder / "restored.sqlite"
    shutil.copy(cache, restored)
    back = run_ctd("cache", "import", str(backup), "--cache", str(restored), cwd=folder)
    assert back.returncode == 0, back.stderr
    assert answers(restored) == before

    # The next run pays for the forgotten items and for no other.
    asked = item_requests(server)
    rerun = query(folder, server.url)
    assert rerun["scored"] == len(OLD) and rerun["cached"] == N - len(OLD)
    assert item_requests(server) - asked == len(OLD)
    again = forget(cache, "--how", "choice", "--yes")
    assert again.returncode == 0 and "nothing to forget" in again.stdout


def test_a_copy_that_cannot_be_written_removes_nothing(built, small_disk: Path) -> None:
    """The copy goes to a disk that fills: a StorageError naming the copy, every answer still
    stored, and no file left on that disk but the filler."""
    folder, _ = built
    cache_path = folder / "cache.sqlite"
    before = answers(cache_path)
    fill(small_disk)
    cache = ScoreCache(cache_path)
    try:
        with pytest.raises(StorageError, match=r"old-choice\.jsonl"):
            experts.forget_answers(cache, small_disk / "old-choice.jsonl", how="choice")
    finally:
        cache.close()
    assert answers(cache_path) == before
    assert [p.name for p in small_disk.iterdir()] == ["filler"]


def test_a_removal_stopped_part_way_loses_no_answer(built) -> None:
    """Another process holds the cache's write lock once the copy is named: the removal fails
    (a StorageError: locked), and every answer is in the cache or in the copy."""
    folder, _ = built
    cache_path = folder / "cache.sqlite"
    before = answer_set(cache_path)
    cache = ScoreCache(cache_path, busy_timeout=0.2)
    holder = sqlite3.connect(cache_path, isolation_level=None)
    backup = folder / "copy" / "old.jsonl"  # its folder is made

    def copied_then_locked(folder_: Path) -> None:
        holder.execute("BEGIN IMMEDIATE")  # after the copy's name is synced, before any removal

    try:
        with pytest.MonkeyPatch.context() as patch:
            # Private: the step between the copy and the removal.
            patch.setattr("experts._answers._sync_folder", copied_then_locked)
            with pytest.raises(StorageError, match="locked"):
                experts.forget_answers(cache, backup, how="choice")
    finally:
        holder.close()
        cache.close()
    lines = backup.read_text().splitlines()
    copied = {tuple(json.loads(line)[c] for c in ANSWER_COLUMNS) for line in lines}
    assert len(copied) == len(OLD)
    assert answer_set(cache_path) | copied == before


def test_expert_keeps_to_its_answers_and_a_run_with_none_is_zero(built) -> None:
    folder, _ = built
    cache = folder / "cache.sqlite"
    with closing(sqlite3.connect(cache)) as connection:  # two of the old answers, another expert's
        connection.execute("UPDATE scores SET expert = 'other' WHERE item_id IN ('ex1', 'ex4')")
        connection.commit()
    done = forget(
        cache, "--how", "choice", "--expert", "other", "--backup", "sub/other.jsonl", "--yes", "--json"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["answers"] == {"other": 2} and result["forgotten"] == 2
    assert {json.loads(line)["item_id"] for line in (folder / "sub" / "other.jsonl").open()} == {"ex1", "ex4"}
    none = forget(cache, "--how", "named-labels", "--expert", "fault", "--yes", "--json")
    assert none.returncode == 0, none.stderr
    assert json.loads(none.stdout) == {
        "cache": str(cache), "how": "named-labels", "answers": {}, "forgotten": 0, "backup": None,
    }  # fmt: skip
    left = forget(cache, "--how", "choice", "--json")
    assert json.loads(left.stdout)["answers"] == {"fault": len(OLD) - 2}


def test_a_full_disk_for_the_copy_is_one_line(built, small_disk: Path) -> None:
    folder, _ = built
    cache = folder / "cache.sqlite"
    before = answers(cache)
    fill(small_disk)
    refused = forget(cache, "--how", "choice", "--backup", str(small_disk / "old.jsonl"), "--yes")
    assert refused.returncode == 3, refused.stderr
    assert refused.stderr.count("\n") == 1 and f"--backup {small_disk / 'old.jsonl'}" in refused.stderr
    assert answers(cache) == before


def test_bad_options_are_one_line_and_change_nothing(built) -> None:
    folder, _ = built
    cache = folder / "cache.sqlite"
    before = answers(cache)

    assert_one_line_error(forget(cache, "--how", "chioce", "--yes"), "--how chioce", "choice-spellings")
    assert_one_line_error(
        forget(cache, "--how", "choice", "--expert", "nope", "--yes"), "--expert nope", "fault"
    )
    (folder / "taken.jsonl").write_text("mine\n")
    assert_one_line_error(
        forget(cache, "--how", "choice", "--backup", "taken.jsonl", "--yes"),
        "--backup taken.jsonl",
        "already exists",
    )
    assert_one_line_error(forget(cache, "--how", "choice", "--backup", "x.csv", "--yes"), "--backup x.csv")
    assert_one_line_error(forget(folder / "none.sqlite", "--how", "choice"), "none.sqlite")
    assert answers(cache) == before
    assert (folder / "taken.jsonl").read_text() == "mine\n"
