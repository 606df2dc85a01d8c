"""`ctd score`, the bulk scoring path, on the `made` run and bundle (tests/harness/conftest.py):

- Equivalence: the run's test split scored in several shards gives, row by row, the run's probe
  and DV scores and the monitor's decisions (`Monitor.check`), with the expert off and on
  (tolerance 1e-5); the monitor on the expert cache `ctd score` filled pays the expert nothing.
- Resume: a job tried with --limit, then run in full, writes only the shards it lacks (the old
  files keep their inode and mtime) and equals a job run in one go; a job killed mid-way resumes
  the same; another job in the same --out is one line, exit 2, nothing changed.
- Reading: JSONL, CSV and Parquet inputs give the same rows, and a shard read from its planned
  offset gives the rows a full read gives there.
- Bad input: one line, exit 2, nothing written.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import signal
import sqlite3
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from ctd_cli import assert_one_line_error, free_port, run_ctd, start_ctd
from fault_server import FaultPlan, RunningServer
from monitor_run import conversations_of

from experts import ExpertClient, Item, ScoreCache
from harness import InputError

# Private: the command line's error handling, around a job whose cleaning up fails.
from harness.cli._common import clean_errors
from harness.data import folder_writer, read_scores
from harness.monitor import Monitor, ProbeScorer, read_bundle
from harness.score import ScoreOptions, ShardScorer, ShardTask, plan_score, score_local

# Private: the plan's writer of score.json and this process's holds, watched.
from harness.score import _plan as score_plan

# Private: the row reader a shard uses, compared here with a full read of each format.
from harness.score._inputs import read_rows, walk_rows

TOLERANCE = 1e-5


def score(made: dict, out: Path, *extra: str, data: Path | None = None) -> dict:
    """`ctd score --json` of the test split (or `data`) into `out`; its summary."""
    done = run_ctd(
        "score", "--bundle", str(made["bundle"]), "--data", str(data or made["tmp"] / "data" / "test.jsonl"),
        "--out", str(out), "--json", *extra, cwd=made["tmp"], env=made["env"], timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def rows_of(out: Path) -> dict[str, dict]:
    """Every row of the job's shards, by id."""
    table = pa.concat_tables(pq.read_table(p) for p in sorted(out.glob("shard-*.parquet")))
    return {row["id"]: row for row in table.to_pylist()}


def assert_same_rows(got: dict[str, dict], expected: dict[str, dict]) -> None:
    """The same rows, floats within the tolerance (another shard cut batches rows differently)."""
    assert set(got) == set(expected)
    for key, row in got.items():
        assert row == pytest.approx(expected[key], abs=TOLERANCE), key


def stamps(out: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of each shard file."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("shard-*.parquet")}


async def monitor_decisions(made: dict, conversations: list[object], **load: object) -> list[dict]:
    monitor = await Monitor.load(made["bundle"], **load)
    try:
        return [(await monitor.check(c)).to_json() for c in conversations]
    finally:
        await monitor.aclose()


@pytest.fixture(scope="module")
def one_go(made: dict) -> tuple[dict, dict[str, dict]]:
    """The test split scored in one go with the expert off, shards of 12 rows: (summary, rows)."""
    summary = score(made, made["tmp"] / "score-one-go", "--shard-rows", "12")
    return summary, rows_of(made["tmp"] / "score-one-go")


def test_score_equals_the_run_and_the_monitor_with_the_expert_off_and_on(made: dict, one_go: tuple) -> None:
    tmp, record = made["tmp"], made["record"]
    ids, conversations = conversations_of(tmp / "data")
    scores = read_scores(tmp / "runs" / "t" / "scores.parquet")
    rows = (scores.split == "test") & (scores.seed == record["seed"]) & (scores.arch == record["arch"])
    run = {
        str(i): (p, d) for i, p, d in zip(scores.id[rows], scores.probe[rows], scores.dv[rows], strict=True)
    }
    threshold = float(record["threshold"])

    off, scored = one_go
    assert (off["shards"], off["written"], off["rows"]) == (6, 6, len(ids))
    assert set(scored) == set(ids)
    with RunningServer() as expert:
        on = score(made, tmp / "score-on", "--shard-rows", "16", "--expert", "--expert-url", expert.url,
                   "--expert-cache", str(tmp / "score-cache.sqlite"))  # fmt: skip
        expert_scored = rows_of(tmp / "score-on")
        sent = sum(expert.server.counts.requests.values())
        decisions = asyncio.run(monitor_decisions(made, conversations, expert=False))
        # The monitor on the cache `ctd score` filled: its answers, and not one request more.
        expert_decisions = asyncio.run(
            monitor_decisions(
                made, conversations, expert_url=expert.url, expert_cache=tmp / "score-cache.sqlite"
            )
        )
        assert sum(expert.server.counts.requests.values()) == sent
    delegated = 0
    for i, decision, with_expert in zip(ids, decisions, expert_decisions, strict=True):
        row, row_on = scored[i], expert_scored[i]
        assert row["probe"] == pytest.approx(run[i][0], abs=TOLERANCE), i
        assert row["dv"] == pytest.approx(run[i][1], abs=TOLERANCE), i
        assert row["delegated"] is bool(run[i][1] > threshold), (i, row["dv"], threshold)
        for mine, theirs in ((row, decision), (row_on, with_expert)):
            for key in ("probe", "dv", "score"):
                assert mine[key] == pytest.approx(theirs[key], abs=TOLERANCE), (i, key)
            assert (mine["delegated"], mine["label"], mine["reason"], mine["truncated"]) == (
                theirs["delegated"], theirs["label"], theirs["reason"], theirs["truncated"],
            ), i  # fmt: skip
            assert (mine["expert"] is None) == (theirs["expert"] is None), i
        assert row["expert"] is None and row["reason"] == (
            "expert-disabled" if row["delegated"] else "not-delegated"
        )
        assert row["score"] == row["probe"] and row["true_label"] in (0, 1)
        delegated += row["delegated"]
    assert delegated > 0, "the bundle delegates nothing here: the expert side went untested"
    assert off["delegated"] == on["delegated"] == delegated and off["expert_calls"] == 0
    assert on["expert_calls"] == delegated == sent
    assert off["tokens"] == on["tokens"] > 0


def test_a_limited_job_then_the_full_one_writes_only_the_missing_shards(made: dict, one_go: tuple) -> None:
    tmp = made["tmp"]
    out = tmp / "score-resume"
    tried = score(made, out, "--shard-rows", "12", "--limit", "30")
    assert (tried["rows"], tried["shards"], tried["written"]) == (30, 3, 3)
    before = stamps(out)
    partial = before.pop("shard-00002.parquet")  # rows 24-29 of 24-35: replaced by the full job
    full = score(made, out, "--shard-rows", "12")
    after = stamps(out)
    assert {name: after[name] for name in before} == before  # shards 0 and 1 not rewritten
    assert after["shard-00002.parquet"] != partial
    assert (full["shards"], full["written"], full["skipped"], full["rows"]) == (6, 4, 2, 64)
    assert full["reused"] == 6  # the limited job's rows 24-29 kept their probe side; 30-35 met the model
    assert_same_rows(rows_of(out), one_go[1])
    rerun = score(made, out, "--shard-rows", "12")
    assert (rerun["written"], rerun["skipped"], rerun["tokens"]) == (0, 6, full["tokens"]) and stamps(
        out
    ) == after

    for other, fragment in (
        (["--shard-rows", "13"], "--shard-rows was 12, now 13"),
        (["--shard-rows", "12", "--expert"], "--no-expert was given, now --expert"),
    ):
        changed = run_ctd(
            "score", "--bundle", str(made["bundle"]), "--data", str(tmp / "data" / "test.jsonl"),
            "--out", str(out), *other, cwd=tmp, env=made["env"],
        )  # fmt: skip
        assert_one_line_error(changed, f"--out {out}: holds another job", fragment)
        assert stamps(out) == after


def test_a_smaller_limit_after_the_full_job_keeps_every_shard(made: dict, one_go: tuple) -> None:
    """A job run in full, then tried again with --limit: its whole shards stay (the shard the
    limit cuts is not replaced by its first rows), and nothing is scored."""
    out = made["tmp"] / "score-one-go"
    before = stamps(out)
    again = score(made, out, "--shard-rows", "12", "--limit", "30")
    assert (again["written"], again["skipped"]) == (0, 3)
    assert stamps(out) == before
    assert_same_rows(rows_of(out), one_go[1])


def test_rows_the_expert_failed_on_are_asked_again_by_a_rerun(
    made: dict, one_go: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every answer of a broken expert lacks the label tokens: the delegated rows are written
    with their reason, the job exits 1 (more than --max-failed of them failed), and the same
    job against a working expert asks exactly those rows again and rewrites only their shards,
    their probe side read back from the files (the rerun, in this process, cannot load the
    model); the shards with nothing delegated stay as they are."""
    tmp = made["tmp"]
    out, cache = tmp / "score-expert-failed", tmp / "score-expert-failed.sqlite"
    data = tmp / "data" / "test.jsonl"
    delegated = [row for row in one_go[1].values() if row["delegated"]]
    args = ("score", "--bundle", str(made["bundle"]), "--data", str(data),
            "--out", str(out), "--shard-rows", "12", "--expert", "--expert-cache", str(cache))  # fmt: skip
    with RunningServer(FaultPlan(broken=frozenset(range(-1, 10_000)))) as broken:
        failed = run_ctd(*args, "--expert-url", broken.url, cwd=tmp, env=made["env"], timeout=600)
    error = failed.stderr.strip().splitlines()[-1]  # after the progress lines
    assert failed.returncode == 1 and error.startswith("error: ") and "Traceback" not in failed.stderr
    assert "delegated rows without an expert score" in error and "rerun the same command" in error
    written = rows_of(out)
    assert all(row["expert"] is None and row["reason"].startswith("expert-failed") for row in written.values()
               if row["delegated"])  # fmt: skip

    def no_model(*_: object, **__: object) -> None:
        raise AssertionError("the rerun loaded the model")

    monkeypatch.setattr(ProbeScorer, "load", no_model)
    before = stamps(out)
    with RunningServer(port=broken.port) as working:  # the same URL: the same job
        options = ScoreOptions(
            bundle=made["bundle"], out=out, expert=True, expert_url=working.url, expert_cache=cache
        )
        rerun = score_local(plan_score(options, data, shard_rows=12, limit=None), options).to_dict()
        asked = sum(working.server.counts.requests.values())
    assert asked == len(delegated) == rerun["delegated"] and rerun["expert_failed"] == 0
    redone = {f"shard-{i // 12:05d}.parquet" for i, row in enumerate(one_go[1].values()) if row["delegated"]}
    after = stamps(out)
    assert rerun["written"] == len(redone) and all(after[name] != before[name] for name in redone)
    # Their probe side is the first job's: only the expert was asked, and no row met the model.
    assert rerun["reused"] == sum(pq.read_metadata(out / name).num_rows for name in redone) > 0
    assert rerun["rows_scored"] == 0
    again = rows_of(out)
    assert all((again[k]["probe"], again[k]["dv"]) == (row["probe"], row["dv"]) for k, row in written.items())
    assert all(after[name] == before[name] for name in set(before) - redone)
    assert all(row["expert"] is not None for row in again.values() if row["delegated"])


def test_rows_out_in_a_batch_file_are_not_asked_live(made: dict, one_go: tuple, tmp_path: Path) -> None:
    """Delegated rows whose requests are out in a batch file (`ctd query --batch-out` recorded them
    in the cache) are not sent: the job writes them as "in-batch" failures and says to rerun after
    the batch's --batch-in. The rerun, once two answers came back and the batch was released,
    takes those two from the cache and asks the third alone."""
    tmp = made["tmp"]
    data = tmp / "data" / "test.jsonl"
    delegated = [key for key, row in one_go[1].items() if row["delegated"]]
    conversation = {row.item.id: row.item.conversation for row in walk_rows(data)}
    cache_path = tmp_path / "cache.sqlite"
    job = ("--shard-rows", "12", "--expert", "--expert-cache", str(cache_path), "--max-failed", "0.9")
    with RunningServer() as expert:
        spec = read_bundle(made["bundle"]).expert_spec(expert.url)
        keys = {
            ExpertClient(spec, cache=None).request_for(Item(i, conversation[i]))[1]: i for i in delegated[:3]
        }
        cache = ScoreCache(cache_path)
        when = datetime.now(UTC)
        record = [
            {"key": key, "expert": spec.name, "item_id": i, "file": "/b/batch.jsonl", "created": when}
            for key, i in keys.items()
        ]
        assert cache.mark_batch_out(record, "/b/batch.jsonl") is None
        first = score(made, tmp_path / "out", *job, "--expert-url", expert.url)
        sent = sum(expert.server.counts.requests.values())
        rows = rows_of(tmp_path / "out")
        assert (first["expert_failed"], first["expert_in_batch"]) == (3, 3)
        assert sent == first["expert_calls"] == len(delegated) - 3
        in_batch = {i for i, row in rows.items() if row["reason"] == "expert-failed: in-batch"}
        assert in_batch == set(keys.values())
        answers = [
            {"key": key, "expert": spec.name, "item_id": i, "endpoint": "x", "model": "x",
             "method": spec.method, "template_sha256": "x", "schema_version": 1, "score": 0.375,
             "label_mass": 0.9, "response": "{}", "latency_ms": 1.0, "created": datetime.now(UTC)}
            for key, i in list(keys.items())[:2]
        ]  # fmt: skip
        cache.put_many(answers)  # what --batch-in does with the two answers it read back
        assert cache.release_batch("/b/batch.jsonl") == 1  # the batch expired with the third
        cache.close()
        again = score(made, tmp_path / "out", *job, "--expert-url", expert.url)
        assert sum(expert.server.counts.requests.values()) == sent + 1
    assert (again["expert_failed"], again["expert_in_batch"]) == (0, 0)
    rows = rows_of(tmp_path / "out")
    came_back = {rows[i]["expert"] for i in list(keys.values())[:2]}  # 0.375, as the bundle calibrates it
    assert len(came_back) == 1 and None not in came_back
    assert all(row["expert"] is not None for row in rows.values() if row["delegated"])


def test_a_smaller_limit_keeps_every_row_of_a_shard_scored_again_for_its_failures(
    made: dict, one_go: tuple
) -> None:
    """A full job whose expert failed, then the same job with a smaller --limit and a working
    expert: the shards scored again for their failures keep all their rows (the limit cutting
    one of them does not shrink the file it replaces), and the rows the limit leaves out stay."""
    tmp = made["tmp"]
    out, cache = tmp / "score-limit-failed", tmp / "score-limit-failed.sqlite"
    args = ("--shard-rows", "12", "--expert", "--expert-cache", str(cache))
    with RunningServer(FaultPlan(broken=frozenset(range(-1, 10_000)))) as broken:
        failed = run_ctd(
            "score", "--bundle", str(made["bundle"]), "--data", str(tmp / "data" / "test.jsonl"),
            "--out", str(out), *args, "--expert-url", broken.url, cwd=tmp, env=made["env"], timeout=600,
        )  # fmt: skip
    assert failed.returncode == 1, failed.stderr
    sizes = {p.name: pq.read_metadata(p).num_rows for p in out.glob("shard-*.parquet")}
    with RunningServer(port=broken.port) as working:
        score(made, out, *args, "--limit", "30", "--expert-url", working.url)
    assert {p.name: pq.read_metadata(p).num_rows for p in out.glob("shard-*.parquet")} == sizes
    assert set(rows_of(out)) == set(one_go[1])


def test_a_stop_during_expert_calls_keeps_every_answer_paid_for(tmp_path: Path, made: dict) -> None:
    """SIGTERM while the expert answers delegated rows (each answer takes half a second): the job
    drains, so every answer the expert gave is committed to the cache, and exits 130; the rerun
    asks the expert for the delegated rows the cache lacks and no other."""
    out, cache = tmp_path / "out", tmp_path / "cache.sqlite"
    job = ("--shard-rows", "24", "--limit", "24", "--expert", "--expert-cache", str(cache))
    data = str(made["tmp"] / "data" / "test.jsonl")
    args = ("score", "--bundle", str(made["bundle"]), "--data", data, "--out", str(out), *job)
    with RunningServer(FaultPlan(delay=0.5)) as slow:
        process = start_ctd(*args, "--expert-url", slow.url, cwd=tmp_path, env=made["env"])
        deadline = time.monotonic() + 300
        while not any(n for item, n in slow.server.counts.requests.items() if item >= 0):
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
        answered = sum(n for item, n in slow.server.counts.successes.items() if item >= 0)
    assert process.returncode == 130, stderr
    assert "stopping: waiting up to" in stderr and "Traceback" not in stderr
    with sqlite3.connect(cache) as db:
        stored = db.execute("SELECT COUNT(*) FROM scores").fetchone()[0]
    assert stored == answered > 0  # every answer paid for is kept
    with RunningServer(port=slow.port) as working:  # the same URL: the same job
        rerun = score(made, out, *job, "--expert-url", working.url)
        asked = sum(n for item, n in working.server.counts.requests.items() if item >= 0)
    assert asked == rerun["delegated"] - stored


def test_a_second_job_on_the_same_out_is_one_line_and_touches_nothing(tmp_path: Path, made: dict) -> None:
    """While a job writes --out (its lock held here, as a running `ctd score` holds it), the same
    command is refused in one line, exit 2: the running job's temporary shard file stays, and no
    shard is written beside it. With the lock free the job runs, and its leftovers go."""
    out = tmp_path / "out"
    out.mkdir()
    theirs = out / ".shard-00000.parquet.elsewhere-1.tmp"
    theirs.write_bytes(b"half a shard")
    command = ("score", "--bundle", str(made["bundle"]), "--data", str(made["tmp"] / "data" / "test.jsonl"),
               "--out", str(out), "--shard-rows", "32")  # fmt: skip
    with folder_writer(out) as held:
        assert held
        refused = run_ctd(*command, cwd=tmp_path, env=made["env"], timeout=600)
    assert_one_line_error(refused, f"--out {out}: another `ctd score` job is writing there")
    assert theirs.read_bytes() == b"half a shard" and not list(out.glob("shard-*.parquet"))
    assert not (out / "score.json").exists()  # its plan was not written over the running job's
    done = run_ctd(*command, cwd=tmp_path, env=made["env"], timeout=600)
    assert done.returncode == 0, done.stderr
    assert not theirs.exists() and len(list(out.glob("shard-*.parquet"))) == 2


def test_a_new_out_is_held_before_its_plan_is_written(
    tmp_path: Path, made: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """score.json is written only while the job holds --out, a folder not there yet included: two
    jobs started at once on a new folder would otherwise both find nothing to hold, and the
    second's plan would stand over the first's shards."""
    out = tmp_path / "new" / "out"
    holds: list[bool] = []
    write = score_plan.write_json

    def watched(path: Path, value: object) -> None:
        holds.append(out.resolve() in score_plan._HELD_HERE)
        write(path, value)

    monkeypatch.setattr(score_plan, "write_json", watched)
    data = made["tmp"] / "data" / "test.jsonl"
    plan_score(ScoreOptions(bundle=made["bundle"], out=out), data, shard_rows=32, limit=None)
    assert holds == [True] and (out / "score.json").is_file()


def test_a_damaged_parquet_input_is_one_line_naming_it(tmp_path: Path) -> None:
    """A damaged data page (the footer intact) fails where pyarrow reads it, with an error that
    names no file (OSError) or is not an input error at all (UnicodeDecodeError): one InputError
    naming the file and its row group."""
    rows = {
        "inputs": [f"conversation {i} " + "x" * (i % 50) for i in range(500)],
        "ids": [f"id{i}" for i in range(500)],
    }
    pq.write_table(pa.table(rows), tmp_path / "ok.parquet", row_group_size=100, compression="none")
    damaged = bytearray((tmp_path / "ok.parquet").read_bytes())
    damaged[200:264] = bytes(random.Random(200).randrange(256) for _ in range(64))
    (tmp_path / "bad.parquet").write_bytes(damaged)
    with pytest.raises(InputError, match=r"bad\.parquet: row group 1 is not readable"):
        list(walk_rows(tmp_path / "bad.parquet"))


def test_a_limit_reads_no_row_past_it_and_a_csv_empty_label_is_no_label(tmp_path: Path, made: dict) -> None:
    """--limit N plans N rows without parsing the next (a broken row 2 with --limit 1), nor any
    file after the one holding the last (a broken second file); a CSV's empty label cell is a row
    without a label, as null is in JSONL and Parquet (it was refused as the label '')."""
    options = ScoreOptions(bundle=made["bundle"], out=tmp_path / "out")
    (tmp_path / "one.jsonl").write_text('{"inputs": "hi", "ids": "x"}\n{"inputs": broken\n')
    assert plan_score(options, tmp_path / "one.jsonl", shard_rows=5, limit=1).shards[0].stop_row == 1
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "a.jsonl").write_text('{"inputs": "hi", "ids": "x"}\n')
    (tmp_path / "files" / "b.jsonl").write_text("{not json\n")
    options = replace(options, out=tmp_path / "out2")
    assert len(plan_score(options, tmp_path / "files", shard_rows=5, limit=1).shards) == 1
    (tmp_path / "labels.csv").write_text("inputs,ids,labels\nhello,x1,high-stakes\nworld,x2,\n")
    assert [(row.item.id, row.label) for row in walk_rows(tmp_path / "labels.csv")] == [
        ("x1", 1),
        ("x2", None),
    ]


def test_a_failed_job_raises_its_own_error_when_closing_fails_too(
    tmp_path: Path, made: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The input shrinks after the plan (the job's error: one line naming the file), and closing
    the scorer then fails as well (injected: committing to a failing disk is what it stands for):
    the job's error is the one raised, and the command line prints the closing's failure on a
    line before it."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join((made["tmp"] / "data" / "test.jsonl").read_text().splitlines(True)[:10]))
    options = ScoreOptions(bundle=made["bundle"], out=tmp_path / "out")
    plan = plan_score(options, data, shard_rows=5, limit=None)
    data.write_text("".join(data.read_text().splitlines(True)[:3]))

    def failing_close(self: ShardScorer) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ShardScorer, "close", failing_close)

    @clean_errors
    def job() -> None:
        score_local(plan, options)

    with pytest.raises(typer.Exit) as exited:
        job()
    assert exited.value.exit_code == 2  # the job's bad input, not the closing's full disk
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        "error, too: closing the shard scorer (committing the expert's answers) failed: "
        "[Errno 28] No space left on device"
    )
    assert (
        len(lines) == 2
        and lines[1].startswith("error: ")
        and "fewer rows than when the job was planned" in lines[1]
    )


def test_a_killed_job_resumes_without_writing_a_shard_twice(made: dict, one_go: tuple) -> None:
    tmp = made["tmp"]
    out = tmp / "score-killed"
    args = ("score", "--bundle", str(made["bundle"]), "--data", str(tmp / "data" / "test.jsonl"),
            "--out", str(out), "--shard-rows", "8")  # fmt: skip
    process = start_ctd(*args, cwd=tmp, env=made["env"])
    deadline = time.monotonic() + 300
    while not (out / "shard-00001.parquet").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    before = stamps(out)
    assert 2 <= len(before) < 8
    resumed = score(made, out, "--shard-rows", "8")
    assert (resumed["written"], resumed["skipped"]) == (8 - len(before), len(before))
    after = stamps(out)
    assert {name: after[name] for name in before} == before
    assert not list(out.glob(".shard-*")) and len(after) == 8
    assert_same_rows(rows_of(out), one_go[1])


def test_delegation_is_dv_strictly_above_the_threshold(made: dict) -> None:
    """The rule the shards and the monitor share (Bundle.delegates): at the threshold itself, no
    (no DV of the test split lands on it to the bit, so the tests above cannot tell > from >=)."""
    bundle = read_bundle(made["bundle"])
    assert not bundle.delegates(bundle.threshold)
    assert bundle.delegates(math.nextafter(bundle.threshold, math.inf))


def test_jsonl_csv_and_parquet_read_the_same_rows_from_any_shard_start(tmp_path: Path, made: dict) -> None:
    source = made["tmp"] / "data" / "test.jsonl"
    records = [json.loads(line) for line in source.read_text().splitlines()]
    records[3].pop("ids")  # a row without an id is named by its file and index
    records[5]["labels"] = "ambiguous"  # scored, with no true label
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in records[:10]) + "\n\n" +
                                         "\n".join(json.dumps(r) for r in records[10:]) + "\n")  # fmt: skip
    columns = {k: [r.get(k) for r in records] for k in ("inputs", "ids", "labels")}
    pq.write_table(pa.table(columns), tmp_path / "rows.parquet", row_group_size=7)
    import csv

    with (tmp_path / "rows.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["inputs", "ids", "labels"])
        writer.writerows([[r["inputs"] + "\n(second line)" * (i % 2), r.get("ids", ""), r["labels"]]
                          for i, r in enumerate(records)])  # fmt: skip
    options = ScoreOptions(bundle=made["bundle"], out=tmp_path / "out")
    for name in ("rows.jsonl", "rows.csv", "rows.parquet"):
        path = tmp_path / name
        whole = list(walk_rows(path))
        assert len(whole) == len(records)
        assert whole[3].item.id == "rows-3" and whole[5].label is None and whole[0].label in (0, 1)
        plan = plan_score(options, path, shard_rows=9, limit=None)
        assert [t.rows for t in plan.shards] == [9] * 7 + [1]
        for task in plan.shards:
            task = ShardTask.from_row(task.to_row())  # as it travels to a Ray actor
            start = task.byte_offset if task.byte_offset is not None else task.first_row
            got = read_rows(Path(task.path), start=start, line=task.first_line, first_index=task.first_row,
                            count=task.rows)  # fmt: skip
            assert got == whole[task.first_row : task.stop_row], (name, task)
        (tmp_path / "out" / "score.json").unlink()  # the next file is another job


def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, made: dict) -> None:
    data = made["tmp"] / "data" / "test.jsonl"
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "broken.jsonl").write_text(data.read_text().splitlines()[0] + "\n{not json\n")
    (tmp_path / "a-file").write_text("")
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "traffic").mkdir()
    (tmp_path / "traffic" / "day.jsonl").write_text(data.read_text())
    out = tmp_path / "out"
    for changed, extra, fragment in (
        ({"--bundle": tmp_path / "nope"}, [], "not a monitor bundle"),
        ({"--data": tmp_path / "empty.jsonl"}, [], "no rows to score"),
        ({"--data": tmp_path / "broken.jsonl"}, [], "broken.jsonl:2: malformed JSON"),
        ({"--data": tmp_path / "missing.jsonl"}, [], "no such file or folder"),
        ({"--data": tmp_path / "notes.txt"}, [], "expected a .jsonl, .csv, .parquet file"),
        ({"--out": tmp_path / "a-file"}, [], "is a file, where a folder is expected"),
        ({"--data": tmp_path / "traffic", "--out": tmp_path / "traffic"}, [], "is the --data folder"),
        ({}, ["--shard-rows", "0"], "--shard-rows 0: must be at least 1"),
        ({}, ["--limit", "0"], "--limit 0: must be at least 1"),
        ({}, ["--micro-batch", "0"], "--micro-batch 0: must be at least 1"),
        ({}, ["--batch-tokens", "0"], "--batch-tokens 0: must lie in 1..1048576"),
        ({}, ["--batch-tokens", "1048577"], "--batch-tokens 1048577: must lie in 1..1048576"),
        ({}, ["--expert", "--expert-url", "ftp://example"], "--expert-url = 'ftp://example': must start"),
        ({}, ["--expert-url", "http://127.0.0.1:9/v1"], "only with --expert"),
        ({}, ["--expert-cache", "c.sqlite"], "--expert-cache c.sqlite: only with --expert"),
        # A cache that cannot be made is told before the model loads, and leaves no score.json in --out.
        ({}, ["--expert", "--expert-cache", str(tmp_path / "a-file" / "c.sqlite")], "a-file"),
        ({}, ["--expert", "--max-failed", "1.5"], "--max-failed 1.5: must lie in [0, 1)"),
        ({}, ["--max-failed", "0.2"], "--max-failed 0.2: only with --expert"),
        # Nothing listens there: ray.init retried it for minutes, having written score.json.
        ({}, ["--ray", f"127.0.0.1:{free_port()}"], "no Ray cluster answered there"),
    ):
        given = {"--bundle": made["bundle"], "--data": data, "--out": out, **changed}
        command = [str(token) for pair in given.items() for token in pair]
        done = run_ctd("score", *command, *extra, cwd=tmp_path, env=made["env"])
        assert_one_line_error(done, fragment)
        assert not out.exists(), (changed, extra)


def test_a_conversation_the_chat_template_refuses_is_a_row_that_says_so(tmp_path: Path, made: dict) -> None:
    """One odd conversation among millions does not stop the job (the monitor answers it with a
    4xx): its row has no scores and its reason names the template's refusal; the others score. A
    job that goes on past a shard scored with --limit keeps the refusal as it was written."""
    records = [
        json.loads(line) for line in (made["tmp"] / "data" / "test.jsonl").read_text().splitlines()[:5]
    ]
    records[2]["inputs"] = "REFUSE-ME please"
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    options = ScoreOptions(bundle=made["bundle"], out=tmp_path / "out", batch_tokens=3000)
    scorer = ShardScorer(options)
    assert scorer.scorer.batch_tokens == 3000  # `ctd score --batch-tokens` reaches the passes
    # A template that refuses one conversation, as a model's own template refuses e.g. a system
    # role it does not know.
    scorer.scorer.model.tokenizer.chat_template = (
        "{% for m in messages %}{% if 'REFUSE-ME' in m['content'] %}"
        "{{ raise_exception('no refusals here') }}{% endif %}{{ m['content'] }}\n{% endfor %}"
    )
    shard = tmp_path / "out" / "shard-00000.parquet"
    try:
        # First the first 4 rows (--limit 4), then all 5: the refused row's reason is kept as is.
        tried = scorer(plan_score(options, data, shard_rows=10, limit=4).shards[0])
        first_four = pq.read_table(shard).to_pylist()
        done = scorer(plan_score(options, data, shard_rows=10, limit=None).shards[0])
    finally:
        scorer.close()
    assert (tried.rows, tried.refused, tried.reused) == (4, 1, 0)
    assert (done.rows, done.refused, done.reused) == (5, 1, 4)
    rows = pq.read_table(shard).to_pylist()
    assert rows[:4] == first_four
    refused = rows[2]
    assert refused["reason"].startswith("refused: ") and "no refusals here" in refused["reason"]
    assert (refused["probe"], refused["dv"], refused["score"], refused["label"], refused["delegated"]) == (
        None, None, None, None, False,
    )  # fmt: skip
    assert all(row["probe"] is not None and row["score"] is not None for i, row in enumerate(rows) if i != 2)
