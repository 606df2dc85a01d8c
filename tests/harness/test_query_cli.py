"""`ctd query` as a long benchmark run meets it: the exit code says whether the run produced
something usable, and a bad --data, --out or --max-failed is one line before anything is paid."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from aiohttp import web
from ctd_cli import assert_one_line_error, free_port, run_ctd
from fault_server import FaultPlan, RunningServer

# Private: the exit code of an environment failure.
from harness._errors import EXIT_ENVIRONMENT


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    rows = [
        {"ids": f"ex{i}", "inputs": f"item-{i}: is this risky?", "labels": "low-stakes"} for i in range(20)
    ]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return tmp_path


def query(folder: Path, url: str, *extra: str, data: str = "data.jsonl", out: str = "out.csv"):  # type: ignore[no-untyped-def]
    """`ctd query` with an expert registered at `url` that gives up on an item after two attempts
    (the default six, with backoff, would make each failing item cost seconds)."""
    registry = folder / "experts.toml"
    registry.write_text(f'[experts.fault]\nbase_url = "{url}"\nmodel = "fault-model"\nmax_attempts = 2\n')
    env = {"CTD_CACHE": str(folder / "cache.sqlite"), "CTD_EXPERTS_FILE": str(registry)}
    try:
        return run_ctd(
            "query", "--data", data, "--out", out, "--expert", "fault", *extra, cwd=folder, env=env
        )  # fmt: skip
    finally:
        registry.unlink()


def item_requests(server: RunningServer) -> int:
    """Requests that named an item (the pre-flight check's probes name none)."""
    return sum(n for item, n in server.server.counts.requests.items() if item >= 0)


def stored(folder: Path) -> tuple[int, int]:
    """(scores, failures) in the cache; (0, 0) when there is none."""
    path = folder / "cache.sqlite"
    if not path.exists():
        return 0, 0
    with sqlite3.connect(path) as db:
        return (
            db.execute("SELECT COUNT(*) FROM scores").fetchone()[0],
            db.execute("SELECT COUNT(*) FROM failures").fetchone()[0],
        )


# --------------------------------------------------------------------------- the exit code of a run


def assert_run_failed(result, *fragments: str) -> None:  # type: ignore[no-untyped-def]
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]


def test_a_run_where_every_item_fails_exits_1(workdir: Path) -> None:
    """Every item answers without the label tokens: the table is written, the exit code is 1."""
    with RunningServer(FaultPlan(broken=frozenset(range(20)))) as running:
        result = query(workdir, running.url)
    assert_run_failed(result, "20 of 20 failed", "20 x no-label-mass", "--max-failed", "out.csv")
    lines = (workdir / "out.csv").read_text().splitlines()
    assert len(lines) == 21 and all(line.split(",")[4] == "failed" for line in lines[1:])


def test_a_revoked_key_with_no_check_exits_1(workdir: Path) -> None:
    @web.middleware
    async def revoked(request: web.Request, handler):  # type: ignore[no-untyped-def]
        return web.json_response({"error": "invalid api key"}, status=401)

    running = RunningServer()
    running.server.app.middlewares.append(revoked)
    with running:
        result = query(workdir, running.url, "--no-check", "--json")
    assert_run_failed(result, "20 of 20 failed", "http-401")
    assert json.loads(result.stdout)["failed"] == 20  # --json still prints the summary
    assert stored(workdir) == (0, 20)


def test_server_errors_below_the_outage_limit_exit_1(workdir: Path) -> None:
    """20 items each failing with 500 after their retries: fewer in a row than EndpointDown
    needs, so the run ends normally, and its exit code must still say it produced nothing."""
    with RunningServer(FaultPlan(rates={"500": 1.0})) as running:
        result = query(workdir, running.url, "--no-check")
    assert_run_failed(result, "20 of 20 failed", "http-500")


def test_failures_within_max_failed_exit_0(workdir: Path) -> None:
    with RunningServer(FaultPlan(broken=frozenset({3}))) as running:
        strict = query(workdir, running.url)
        lenient = query(workdir, running.url, "--max-failed", "0.05")
    assert_run_failed(strict, "1 of 20 failed (5.0%)", "allows (0)")
    assert lenient.returncode == 0, lenient.stderr
    assert "1 failed" in lenient.stdout


def test_an_answer_outside_the_labels_is_recovered_and_says_how(workdir: Path) -> None:
    """Item 3 answers without label tokens except when the labels are named (experts._recovery):
    the run passes --max-failed 0 and the table says how each score was obtained."""
    with RunningServer(FaultPlan(recover_on={3: "named-labels"})) as running:
        result = query(workdir, running.url)
    assert result.returncode == 0, result.stderr
    rows = [line.split(",") for line in (workdir / "out.csv").read_text().splitlines()]
    how = {row[0]: row[rows[0].index("how")] for row in rows[1:]}
    assert how == {f"ex{i}": "named-labels" if i == 3 else "top-k" for i in range(20)}


@pytest.mark.parametrize("value", ["nan", "1", "-0.1", "lots"])
def test_bad_max_failed_is_refused_before_anything_is_paid(workdir: Path, value: str) -> None:
    with RunningServer() as running:
        result = query(workdir, running.url, "--max-failed", value)
        assert sum(running.server.counts.requests.values()) == 0
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "--max-failed" in result.stderr
    assert stored(workdir) == (0, 0) and not (workdir / "out.csv").exists()


# --------------------------------------------------------------------------- inputs checked first


@pytest.mark.parametrize(
    ("out", "fragments"),
    [
        ("scores.txt", ("--out scores.txt", "unknown file type '.txt'", ".parquet or .csv")),
        ("scores", ("--out scores", "unknown file type '(none)'")),
        ("plain/out.csv", ("--out plain/out.csv", "plain is a file, not a folder")),
        ("/proc/out.csv", ("--out /proc/out.csv", "cannot write in /proc")),
        (".", ("--out .", "is a folder")),
    ],
)
def test_an_unwritable_out_is_found_before_anything_is_paid(
    workdir: Path, out: str, fragments: tuple[str, ...]
) -> None:
    (workdir / "plain").write_text("a file where a folder should be\n")
    with RunningServer() as running:
        result = query(workdir, running.url, out=out)
        assert item_requests(running) == 0
    assert_one_line_error(result, *fragments)
    assert stored(workdir) == (0, 0)
    assert sorted(p.name for p in workdir.iterdir()) == ["data.jsonl", "plain"]  # no probe file left


@pytest.mark.parametrize("extra", [(), ("--batch-in", "results.jsonl")], ids=["live", "batch-in"])
def test_out_naming_the_data_file_is_refused_and_the_data_kept(workdir: Path, extra: tuple[str, ...]) -> None:
    """`--out` the `--data` file itself, named another way: writing the table would replace the
    data. One line, nothing asked, the file as it was."""
    data = workdir / "data.csv"
    data.write_text("ids,inputs,labels\n" + "".join(f"ex{i},item {i},low-stakes\n" for i in range(5)))
    before = data.read_bytes()
    with RunningServer() as running:
        result = query(workdir, running.url, *extra, data="data.csv", out="./data.csv")
        assert item_requests(running) == 0
    assert_one_line_error(result, "--out data.csv: is the --data file, which it would replace")
    assert data.read_bytes() == before and stored(workdir) == (0, 0)


@pytest.mark.parametrize("extra", [(), ("--batch-in", "results.jsonl")], ids=["live", "batch-in"])
def test_out_naming_the_cache_is_refused_and_the_paid_answers_kept(
    workdir: Path, extra: tuple[str, ...]
) -> None:
    """`--out` the cache file (the paid answers), existing or about to be created: the table
    would replace it at the end, after the requests were paid. One line, nothing asked."""
    with RunningServer() as running:
        first = query(workdir, running.url)  # the answers, paid, in cache.sqlite
        assert first.returncode == 0, first.stderr
        paid = item_requests(running)
        before = (workdir / "cache.sqlite").read_bytes()
        fresh = query(workdir, running.url, *extra, "--cache", "same.csv", out="same.csv")
        assert_one_line_error(fresh, "--out same.csv: is the --cache file")
        assert item_requests(running) == paid and not (workdir / "same.csv").exists()
        result = query(workdir, running.url, *extra, out="./cache.sqlite")
        assert_one_line_error(result, "--out cache.sqlite: is the --cache file, which it would replace")
        assert (workdir / "cache.sqlite").read_bytes() == before


def test_out_in_a_new_folder_is_created(workdir: Path) -> None:
    with RunningServer() as running:
        result = query(workdir, running.url, out="new/deeper/out.parquet")
    assert result.returncode == 0, result.stderr
    assert (workdir / "new" / "deeper" / "out.parquet").is_file()


def test_a_folder_as_data_is_named_as_a_folder(workdir: Path) -> None:
    (workdir / "folder").mkdir()
    with RunningServer() as running:
        result = query(workdir, running.url, data="folder")
    assert_one_line_error(result, "folder: is a folder, expected a dataset file")


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_data_that_is_not_utf8_names_the_line(workdir: Path, suffix: str) -> None:
    head = "ids,inputs,labels\n" if suffix == ".csv" else ""
    good = "a,item-1 fine,low-stakes\n" if suffix == ".csv" else '{"ids": "a", "inputs": "item-1 fine"}\n'
    # A long first part puts the bad byte beyond the text reader's first buffer.
    filler = "".join(good.replace("a", f"a{i}", 1) for i in range(400))
    bad = b"b,caf\xe9,low-stakes\n" if suffix == ".csv" else b'{"ids": "b", "inputs": "caf\xe9"}\n'
    path = workdir / f"latin1{suffix}"
    path.write_bytes((head + filler).encode() + bad)
    with RunningServer() as running:
        result = query(workdir, running.url, data=path.name)
    line = 402 if suffix == ".csv" else 401
    assert_one_line_error(result, f"latin1{suffix}:{line}: not UTF-8 text (byte 0xe9)")
    assert stored(workdir) == (0, 0)


def test_a_refused_connection_is_not_called_a_timeout(workdir: Path) -> None:
    result = query(workdir, f"http://127.0.0.1:{free_port()}/v1")
    assert_one_line_error(result, "cannot reach", "connection refused")
    assert "timeout" not in result.stderr and "timed out" not in result.stderr


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda p: p.write_text("hello\n"), "cannot be used as the cache (file is not a database)"),
        (lambda p: p.mkdir(), "is a folder, expected the cache's SQLite file"),
    ],
    ids=["not-sqlite", "folder"],
)
def test_a_cache_that_is_not_sqlite_is_one_line(workdir: Path, make, fragment: str) -> None:  # type: ignore[no-untyped-def]
    cache = workdir / "notsqlite.sqlite"
    make(cache)
    before = sorted(p.name for p in workdir.rglob("*"))
    stats = run_ctd("cache", "stats", "--cache", str(cache), cwd=workdir)
    assert_one_line_error(stats, f"{cache}: {fragment}")
    with RunningServer() as running:
        result = query(workdir, running.url, "--cache", str(cache))
        assert item_requests(running) == 0
    assert_one_line_error(result, f"{cache}: {fragment}")
    assert sorted(p.name for p in workdir.rglob("*")) == before


def test_a_full_disk_stops_the_run_in_one_line_after_committing_what_fits(
    workdir: Path, small_disk: Path
) -> None:
    n, concurrency = 1500, 16  # the registered expert's default concurrency
    rows = [{"ids": f"ex{i}", "inputs": f"item-{i}: is this risky?"} for i in range(n)]
    (workdir / "big.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = small_disk / "cache.sqlite"
    with RunningServer() as running:
        result = query(workdir, running.url, "--cache", str(cache), data="big.jsonl")
        answered = {i for i, count in running.server.counts.successes.items() if i >= 0 and count > 0}
    assert result.returncode == EXIT_ENVIRONMENT, (result.stdout, result.stderr)  # the machine's doing
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {cache}: database or disk is full"), last
    assert "could not be stored" in last and "rerun to resume" in last
    assert not (workdir / "out.csv").exists()
    with sqlite3.connect(cache) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        stored_items = {int(item.removeprefix("ex")) for (item,) in db.execute("SELECT item_id FROM scores")}
    assert 0 < len(stored_items) < n
    assert stored_items <= answered
    # Paid but not stored: at most the answers in flight when the disk filled.
    assert len(answered - stored_items) <= concurrency
