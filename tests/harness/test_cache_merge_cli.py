"""`ctd cache merge`, `ctd cache export --out FILE.jsonl` and `ctd cache import` as a team moving
answers between machines uses them: two caches built by real `ctd query` runs on the two halves
of a data set, merged, answer the whole set without one request; an export imported into an
empty cache gives back every row, every column; a bad source or a malformed line is one line,
exit code 2, and nothing merged."""

from __future__ import annotations

import csv
import json
import sqlite3
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from ctd_cli import assert_one_line_error, run_ctd
from fault_server import RunningServer

from experts import ConfigError, ScoreCache, import_answers

N = 20


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    rows = [
        {"ids": f"ex{i}", "inputs": f"item-{i}: is this risky?", "labels": "low-stakes"} for i in range(N)
    ]
    for name, part in (("whole", rows), ("first", rows[: N // 2]), ("second", rows[N // 2 :])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return tmp_path


def query(folder: Path, url: str, data: str, cache: str, out: str) -> dict[str, Any]:
    """`ctd query --json` on `data` into the cache file `cache`, with an expert at `url`."""
    registry = folder / "experts.toml"
    registry.write_text(f'[experts.fault]\nbase_url = "{url}"\nmodel = "fault-model"\n')
    env = {"CTD_CACHE": str(folder / cache), "CTD_EXPERTS_FILE": str(registry)}
    result = run_ctd(
        "query", "--data", data, "--out", out, "--expert", "fault", "--json", cwd=folder, env=env
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def item_requests(server: RunningServer) -> int:
    """Requests that named an item (the pre-flight check's probes name none)."""
    return sum(n for item, n in server.server.counts.requests.items() if item >= 0)


def scores_of(path: Path) -> list[dict[str, str]]:
    """The answers of a `ctd query` table, without where each came from (source, attempts)."""
    with path.open() as handle:
        return [
            {k: v for k, v in row.items() if k not in ("source", "attempts")}
            for row in csv.DictReader(handle)
        ]


def rows_of(path: Path) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT * FROM scores ORDER BY key").fetchall()


def test_caches_built_on_two_halves_merge_into_one_that_answers_the_whole_set(workdir: Path) -> None:
    with RunningServer() as running:
        direct = query(workdir, running.url, "whole.jsonl", "direct.sqlite", "direct.csv")
        assert direct["scored"] == N
        assert query(workdir, running.url, "first.jsonl", "a.sqlite", "a.csv")["scored"] == N // 2
        assert query(workdir, running.url, "second.jsonl", "b.sqlite", "b.csv")["scored"] == N // 2
        merged = run_ctd("cache", "merge", "a.sqlite", "b.sqlite", "--cache", "c.sqlite", cwd=workdir)
        assert merged.returncode == 0, merged.stderr
        assert merged.stdout.splitlines() == [
            f"a.sqlite: {N // 2} answers: {N // 2} new, 0 already here, 0 in conflict (this cache's answer "
            "kept); 0 recorded failures not merged",
            f"b.sqlite: {N // 2} answers: {N // 2} new, 0 already here, 0 in conflict (this cache's answer "
            "kept); 0 recorded failures not merged",
            "merged into c.sqlite",
        ]
        paid = item_requests(running)
        whole = query(workdir, running.url, "whole.jsonl", "c.sqlite", "whole.csv")
        assert item_requests(running) == paid  # nothing sent: every item was in the merged cache
    assert (whole["cached"], whole["scored"], whole["failed"]) == (N, 0, 0)
    assert scores_of(workdir / "whole.csv") == scores_of(workdir / "direct.csv")
    with (workdir / "whole.csv").open() as handle:
        assert {row["source"] for row in csv.DictReader(handle)} == {"cache"}
    assert rows_of(workdir / "c.sqlite") == sorted(
        rows_of(workdir / "a.sqlite") + rows_of(workdir / "b.sqlite")
    )
    rerun = run_ctd("cache", "merge", "a.sqlite", "b.sqlite", "--cache", "c.sqlite", "--json", cwd=workdir)
    assert [(s["added"], s["duplicates"]) for s in json.loads(rerun.stdout)["sources"]] == [(0, 10), (0, 10)]


def test_an_export_imported_into_an_empty_cache_gives_back_every_row(workdir: Path) -> None:
    with RunningServer() as running:
        query(workdir, running.url, "whole.jsonl", "here.sqlite", "o.csv")
    exported = run_ctd(
        "cache", "export", "--format", "jsonl", "--out", "answers.jsonl", "--cache", "here.sqlite",
        cwd=workdir,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    fields = json.loads((workdir / "answers.jsonl").read_text().splitlines()[0])
    assert list(fields) == [
        "key", "expert", "item_id", "endpoint", "model", "method", "template_sha256", "schema_version",
        "score", "label_mass", "how", "response", "prompt_tokens", "completion_tokens", "latency_ms",
        "created",
    ]  # fmt: skip
    imported = run_ctd("cache", "import", "answers.jsonl", "--cache", "there.sqlite", "--json", cwd=workdir)
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout)["sources"][0]["added"] == N
    assert rows_of(workdir / "there.sqlite") == rows_of(workdir / "here.sqlite")


def test_an_export_whose_format_contradicts_its_suffix_is_one_line(workdir: Path) -> None:
    ScoreCache(workdir / "here.sqlite").close()
    result = run_ctd(
        "cache", "export", "--format", "jsonl", "--out", "a.csv", "--cache", "here.sqlite", cwd=workdir
    )
    assert_one_line_error(result, "--format jsonl", "--out a.csv is csv")
    assert not (workdir / "a.csv").exists()


def test_an_export_of_an_expert_the_cache_does_not_hold_is_one_line(workdir: Path) -> None:
    """A typo, or the URL an expert was asked at (stored as url:MODEL): one line naming the
    experts the cache holds, no file, where it wrote an empty export and exited 0."""
    with RunningServer() as running:
        query(workdir, running.url, "whole.jsonl", "here.sqlite", "o.csv")
        for given in ("url:fault-modle", running.url):
            result = run_ctd(
                "cache", "export", "--expert", given, "--out", "a.csv", "--cache", "here.sqlite", cwd=workdir
            )
            assert_one_line_error(result, f"--expert {given}: no answers of it", "its experts: ")
    assert not (workdir / "a.csv").exists()


GOOD_LINE = {
    "key": "f" * 64,
    "expert": "judge",
    "item_id": "ex1",
    "endpoint": "http://127.0.0.1:9/v1",
    "model": "m",
    "method": "next-token",
    "template_sha256": "0" * 64,
    "schema_version": 1,
    "score": 0.25,
    "label_mass": None,
    "response": "{}",
    "prompt_tokens": 3,
    "completion_tokens": 1,
    "latency_ms": 2.0,
    "created": "2026-11-25 10:00:00.000000",
}


def _line(**changes: Any) -> str:
    return json.dumps({**GOOD_LINE, **changes}) + "\n"


@pytest.mark.parametrize(
    ("third_line", "said"),
    [
        ("{not json\n", "answers.jsonl:3: malformed JSON"),
        (b"\xff\xfe\n", "answers.jsonl:3: not UTF-8"),
        ("[1, 2]\n", "answers.jsonl:3: expected a JSON object"),
        (_line(key="a" * 64, score="high"), "answers.jsonl:3: field 'score' must be a finite number"),
        (_line(key="a" * 64, score=float("nan")), "answers.jsonl:3: field 'score' must be a finite number"),
        (_line(key="a" * 64, schema_version=2), "answers.jsonl:3: an answer of cache schema 2"),
        (_line(key="a" * 64, created="yesterday"), "answers.jsonl:3: field 'created' must be a date"),
        (_line(key="a" * 64, prompt_tokens=-1), "answers.jsonl:3: field 'prompt_tokens' must be a count"),
        (_line(key="a" * 64, colour="red"), "answers.jsonl:3: unknown field 'colour'"),
        (_line(key="a" * 64, how=3), "answers.jsonl:3: field 'how' must be a string"),
        (_line(key="a" * 64, score=7.5), "answers.jsonl:3: field 'score' must be a probability in [0, 1]"),
        (
            _line(key="a" * 64, label_mass=-3.0),
            "answers.jsonl:3: field 'label_mass' must be a probability mass",
        ),
        (_line(key="a" * 64, how="made-up"), "answers.jsonl:3: field 'how' must be one of top-k"),
        (
            json.dumps({k: v for k, v in GOOD_LINE.items() if k != "response"}) + "\n",
            "missing field 'response'",
        ),
        (_line(), f"answers.jsonl:3: key {'f' * 64} repeats an earlier line"),
    ],
    ids=[
        "json",
        "utf-8",
        "not-object",
        "score-text",
        "score-nan",
        "schema",
        "created",
        "tokens",
        "unknown",
        "how",
        "score-range",
        "mass-range",
        "how-unknown",
        "missing",
        "repeat",
    ],
)
def test_a_malformed_import_line_is_file_line_and_nothing_is_imported(
    workdir: Path, third_line: str | bytes, said: str
) -> None:
    """Two good lines before the bad one, and a good file before this one: nothing of either is
    imported, and no cache is created (the library here; the command's line is checked below)."""
    (workdir / "fine.jsonl").write_text(_line(key="c" * 64))
    bad = third_line if isinstance(third_line, bytes) else third_line.encode()
    (workdir / "answers.jsonl").write_bytes((_line() + "\n").encode() + bad)
    with pytest.raises(ConfigError) as raised:
        import_answers(workdir / "c.sqlite", [workdir / "fine.jsonl", workdir / "answers.jsonl"])
    assert said in str(raised.value) and "\n" not in str(raised.value)
    assert not (workdir / "c.sqlite").exists()
    assert [p.name for p in workdir.iterdir() if p.name.startswith(".ctd-import-")] == []


def test_ctd_cache_import_of_a_malformed_line_is_one_line_exit_2(workdir: Path) -> None:
    (workdir / "answers.jsonl").write_text(_line() + _line(key="a" * 64, score="high"))
    result = run_ctd("cache", "import", "answers.jsonl", "--cache", "c.sqlite", cwd=workdir)
    assert_one_line_error(result, "answers.jsonl:2: field 'score' must be a finite number")
    assert not (workdir / "c.sqlite").exists()


def _damage_middle_leaf(path: Path) -> None:
    """Overwrite the header of the table leaf page in the middle of the file (not page 1)."""
    raw = path.read_bytes()
    size = int.from_bytes(raw[16:18], "big")
    leaves = [page for page in range(2, len(raw) // size + 1) if raw[(page - 1) * size] == 0x0D]
    with path.open("r+b") as handle:
        handle.seek((leaves[len(leaves) // 2] - 1) * size)
        handle.write(b"\xff" * 64)


def _cache_of(path: Path, keys: range, **changes: Any) -> Path:
    cache = ScoreCache(path)
    created = datetime(2026, 11, 25, 10, tzinfo=UTC)
    cache.put_many([{**GOOD_LINE, "created": created, **changes, "key": f"{i:064x}"} for i in keys])
    cache.close()
    return path


def _other_schema(folder: Path) -> str:
    _cache_of(folder / "old.sqlite", range(3), schema_version=2)
    return "old.sqlite"


def _damaged(folder: Path) -> str:
    path = _cache_of(folder / "bad.sqlite", range(200), response="x" * 1000)
    _damage_middle_leaf(path)
    return "bad.sqlite"


def _not_a_cache(folder: Path) -> str:
    with closing(sqlite3.connect(folder / "other.sqlite")) as db:
        db.execute("CREATE TABLE things (x)")
    return "other.sqlite"


def _text(folder: Path) -> str:
    (folder / "notes.sqlite").write_text("not a database at all\n" * 100)
    return "notes.sqlite"


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda folder: str(folder / "here.sqlite"), "here.sqlite: is this cache itself"),  # another spelling
        (lambda folder: "gone.sqlite", "gone.sqlite: no such file"),
        (_text, "notes.sqlite: not a ctd cache (file is not a database)"),
        (_not_a_cache, "other.sqlite: not a ctd cache (no table of scores"),
        (_other_schema, "old.sqlite: holds answers of cache schema 2, this ctd writes schema 1"),
        (_damaged, "bad.sqlite: damaged ("),
    ],
    ids=["itself", "missing", "not-sqlite", "not-a-cache", "other-schema", "damaged"],
)
def test_a_bad_source_is_one_line_and_nothing_is_merged(workdir: Path, make: Any, said: str) -> None:
    """The bad source comes after a good one: every source is checked before the first insert."""
    _cache_of(workdir / "here.sqlite", range(1))
    _cache_of(workdir / "good.sqlite", range(100, 110))
    before = rows_of(workdir / "here.sqlite")
    result = run_ctd("cache", "merge", "good.sqlite", make(workdir), "--cache", "here.sqlite", cwd=workdir)
    assert_one_line_error(result, said)
    assert rows_of(workdir / "here.sqlite") == before


@pytest.mark.parametrize("command", [["check"], ["salvage", "--out", "salvaged.sqlite"]])
def test_check_and_salvage_of_a_file_that_is_not_sqlite_say_so_in_one_line(
    workdir: Path, command: list[str]
) -> None:
    """Not a damaged cache (exit 3, "run salvage"), but the wrong file: exit 2, as merge says it."""
    _text(workdir)
    result = run_ctd("cache", *command, "--cache", "notes.sqlite", cwd=workdir)
    assert_one_line_error(result, "notes.sqlite: not a ctd cache (file is not a database)")
    assert not (workdir / "salvaged.sqlite").exists()
