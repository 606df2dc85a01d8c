"""`ctd score --ray`: the same shards as `ctd score`, scored by Ray actors on a local Ray (started
by the command, about 10 s here), killed mid-job and resumed without a shard written twice; and
without Ray, one line naming the extra to install.

The parity test scores the `made` run's test split on Ray and compares it with the run's own
probe and DV scores and the bundle's rule (as `ctd score` without Ray does in test_score.py).
The kill test uses an untrained bundle over the embedded model's layer 2 (tests/monitor_bundle.py:
ten times cheaper per row), on enough rows that the job is still working when it is killed."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from ctd_cli import CTD, assert_one_line_error, run_ctd, start_ctd
from fault_server import FaultPlan, RunningServer
from monitor_bundle import write_untrained_bundle

from harness import InputError, read_scores
from harness.score import actor_shape

SHARD_ROWS = 8
TOLERANCE = 1e-5
RAY_TIMEOUT = 300  # seconds: Ray's start, two actors loading the model, the shards
REPO = Path(__file__).resolve().parents[2]
KILL_SHARDS = 12  # the kill test: 12 shards of 6 rows
KILL_ROWS = 6 * KILL_SHARDS


@pytest.mark.parametrize(
    ("cpus", "gpus", "actors", "threads", "want"),
    [
        (2, 0, 2, None, (2, 1.0, 0.0, 1)),  # this machine, --actors 2: a CPU and a thread each
        (2, 0, None, None, (1, 2.0, 0.0, 2)),  # the default: CPUs // 4, at least one
        (16, 0, None, None, (4, 4.0, 0.0, 4)),
        (2, 0, 3, None, (3, 2 / 3, 0.0, 1)),  # more actors than CPUs: shares below one, all placed
        (64, 4, None, None, (4, 1.0, 1.0, 1)),  # GPUs: one actor per GPU
        (64, 4, 2, None, (2, 1.0, 1.0, 1)),
    ],
)
def test_the_pool_never_asks_for_more_than_the_cluster_has(
    cpus: float, gpus: float, actors: int | None, threads: int | None, want: tuple
) -> None:
    shape = actor_shape(cpus=cpus, gpus=gpus, actors=actors, threads=threads)
    assert (shape.actors, shape.num_cpus, shape.num_gpus, shape.threads) == pytest.approx(want)
    assert shape.actors * shape.num_cpus <= cpus and shape.actors * shape.num_gpus <= gpus


def test_more_gpu_actors_than_gpus_is_one_line() -> None:
    with pytest.raises(InputError, match="--actors 5: the Ray cluster has 4 GPUs"):
        actor_shape(cpus=64, gpus=4, actors=5, threads=None)


def _needs_ray() -> None:
    pytest.importorskip("ray.data", reason="Ray is not installed (pip install 'ctd-harness[ray]')")


def _score(bundle: Path, data: Path, out: Path, *extra: str, env: dict[str, str]):
    return run_ctd(
        "score", "--bundle", str(bundle), "--data", str(data), "--out", str(out), "--json", *extra,
        cwd=out.parent, env=env, timeout=RAY_TIMEOUT,
    )  # fmt: skip


def _rows(out: Path) -> dict[str, dict]:
    """{id: row} over every shard of `out` (ids are unique in the job's data)."""
    found: dict[str, dict] = {}
    for shard in sorted(out.glob("shard-*.parquet")):
        for row in pq.read_table(shard).to_pylist():
            assert row["id"] not in found, f"{row['id']} is in two shards"
            found[row["id"]] = row
    return found


def _assert_same_scores(got: dict[str, dict], want: dict[str, dict]) -> None:
    assert sorted(got) == sorted(want)
    for name in ("probe", "dv", "score"):
        a = np.array([got[i][name] for i in want])
        b = np.array([want[i][name] for i in want])
        assert np.max(np.abs(a - b)) <= TOLERANCE, name
    for name in ("delegated", "label", "reason", "truncated", "true_label"):
        assert [got[i][name] for i in want] == [want[i][name] for i in want], name


def _stamps(out: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of each shard file: a shard rewritten changes both."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("shard-*.parquet")}


def test_score_on_ray_equals_the_run_and_the_monitors_rule(made: dict, tmp_path: Path) -> None:
    _needs_ray()
    data = made["tmp"] / "data" / "test.jsonl"
    out = tmp_path / "ray"
    on_ray = ["--shard-rows", str(SHARD_ROWS), "--ray", "local", "--actors", "2"]
    done = _score(made["bundle"], data, out, *on_ray, env=made["env"])
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    rows = len(data.read_text().splitlines())
    shards = -(-rows // SHARD_ROWS)
    assert (summary["rows"], summary["shards"], summary["written"]) == (rows, shards, shards)
    assert "Traceback" not in done.stderr
    on_ray = _rows(out)
    run = read_scores(made["tmp"] / "runs" / "t" / "scores.parquet")
    test = {i: (p, d) for i, s, p, d in zip(run.id, run.split, run.probe, run.dv, strict=True) if s == "test"}
    assert sorted(on_ray) == sorted(test)
    threshold = float(made["record"]["threshold"])
    for i, (probe, dv) in test.items():
        row = on_ray[i]
        assert abs(row["probe"] - probe) <= TOLERANCE and abs(row["dv"] - dv) <= TOLERANCE, i
        # The monitor's decision with the expert off: delegate when DV > threshold, keep the probe.
        assert row["delegated"] == (row["dv"] > threshold), i
        assert row["reason"] == ("expert-disabled" if row["delegated"] else "not-delegated"), i
        assert row["score"] == row["probe"] and row["label"] == int(row["score"] >= 0.5), i
    assert any(r["delegated"] for r in on_ray.values()) and not all(r["delegated"] for r in on_ray.values())


@pytest.fixture(scope="module")
def untrained(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An untrained bundle and KILL_ROWS conversations of the built-in test split."""
    tmp = tmp_path_factory.mktemp("score-ray")
    bundle = write_untrained_bundle(tmp / "bundle")
    data = tmp / "conversations.jsonl"
    lines = (REPO / "harness" / "data" / "builtin" / "test.jsonl").read_text().splitlines()
    assert len(lines) >= KILL_ROWS
    data.write_text("\n".join(lines[:KILL_ROWS]) + "\n")
    env = {"CTD_RUNS_DIR": str(tmp / "runs"), "HF_HUB_OFFLINE": "1"}
    return {"bundle": bundle, "data": data, "env": env}


def test_a_killed_ray_job_resumes_without_writing_a_shard_twice(untrained: dict, tmp_path: Path) -> None:
    """SIGINT, then SIGKILL if the driver is still there after 5 s; the rerun resumes."""
    _needs_ray()
    out = tmp_path / "ray"
    shard_rows = str(KILL_ROWS // KILL_SHARDS)
    job = ["--bundle", str(untrained["bundle"]), "--data", str(untrained["data"]), "--out", str(out)]
    on_ray = ["--shard-rows", shard_rows, "--ray", "local", "--actors", "2"]
    process = start_ctd("score", *job, *on_ray, cwd=tmp_path, env=untrained["env"])
    deadline = time.monotonic() + RAY_TIMEOUT
    while len(_stamps(out)) < 3 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process.poll() is None, f"the job ended before it could be killed: {process.communicate()}"
    ray = _descendants(process.pid)
    assert len(ray) >= 4, ray  # the GCS, the raylet, two actors (and Ray's helpers)
    process.send_signal(signal.SIGINT)
    try:
        _, stderr = process.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()  # SIGKILL: Ray's local processes share the driver's fate
        _, stderr = process.communicate()
    assert "2 actors (1 CPU each, 1 torch thread)" in stderr and "Ray's logs: " in stderr, stderr
    before = _stamps(out)
    assert 3 <= len(before) < KILL_SHARDS, len(before)
    _assert_gone(ray)

    done = _score(untrained["bundle"], untrained["data"], out, *on_ray, env=untrained["env"])
    assert done.returncode == 0, done.stderr
    after = _stamps(out)
    assert {name: after[name] for name in before} == before  # not one shard written again
    assert len(after) == KILL_SHARDS and not list(out.glob(".shard-*"))
    summary = json.loads(done.stdout)
    assert summary["skipped"] >= len(before) and summary["written"] == KILL_SHARDS - summary["skipped"]
    # The union equals one go of `ctd score` without Ray.
    here = tmp_path / "here"
    done = _score(
        untrained["bundle"], untrained["data"], here, "--shard-rows", shard_rows, env=untrained["env"]
    )
    assert done.returncode == 0, done.stderr
    _assert_same_scores(_rows(out), _rows(here))


@pytest.mark.parametrize("after_a_shard", [False, True], ids=["before-any-shard", "after-a-shard"])
def test_a_stopped_ray_job_keeps_every_answer_its_actors_were_paid_for(
    tmp_path: Path, after_a_shard: bool
) -> None:
    """SIGINT while two actors ask a slow expert (2 s an answer) for every row, before any shard
    came back or after one did (a stop inside Ray Data's iterator would kill the actors at once):
    the driver says stop on the job's stop board and waits while they ask, so every answer the
    expert gave is in the cache before Ray is shut down; the rerun asks for the rest and nothing
    twice."""
    _needs_ray()
    bundle = write_untrained_bundle(tmp_path / "bundle", threshold=-1e9, expert=True)  # delegate all
    data = tmp_path / "rows.jsonl"
    lines = (REPO / "harness" / "data" / "builtin" / "test.jsonl").read_text().splitlines()
    rows = 40
    data.write_text("\n".join(lines[:rows]) + "\n")
    env = {"CTD_RUNS_DIR": str(tmp_path / "runs"), "HF_HUB_OFFLINE": "1"}
    out, cache = tmp_path / "out", tmp_path / "cache.sqlite"
    job = ["--shard-rows", "8", "--ray", "local", "--actors", "2", "--expert", "--expert-cache", str(cache)]
    with RunningServer(FaultPlan(delay=2.0)) as slow:
        process = start_ctd(
            "score", "--bundle", str(bundle), "--data", str(data), "--out", str(out), *job,
            "--expert-url", slow.url, cwd=tmp_path, env=env,
        )  # fmt: skip
        deadline = time.monotonic() + RAY_TIMEOUT

        def asking() -> int:  # requests in flight now
            return sum(slow.server.counts.requests.values()) - sum(slow.server.counts.successes.values())

        while asking() < 4 or (after_a_shard and not list(out.glob("shard-*.parquet"))):
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        answered = sum(slow.server.counts.successes.values())
        asked = sum(slow.server.counts.requests.values())
    assert process.returncode == 130 and "Traceback" not in stderr, stderr
    with sqlite3.connect(cache) as db:
        stored = db.execute("SELECT COUNT(*) FROM scores").fetchone()[0]
    assert stored == answered == asked > 0  # every answer paid for is kept, and nothing else sent
    assert "stopping: waiting up to" in stderr, stderr
    with RunningServer(port=slow.port) as working:  # the same URL: the same job
        done = _score(bundle, data, out, *job, "--expert-url", working.url, env=env)
        assert done.returncode == 0, done.stderr
        again = sum(working.server.counts.requests.values())
    assert again == rows - stored and json.loads(done.stdout)["expert_failed"] == 0


def test_a_stop_waits_for_live_actors_and_not_for_one_that_died_asking() -> None:
    """One actor registered on the stop board dies mid-call (SIGKILL), another holds its call 6 s
    (`ray_stop_run.py`): the driver's stop waits for the live call to end, and not its whole 10 s
    for the dead one, whose beats stopped. Without the beats the live call was dropped after 3 s
    with its answers in flight; with no deadline the dead call held the wait to 10 s."""
    _needs_ray()
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("ray_stop_run.py"))],
        capture_output=True, text=True, timeout=RAY_TIMEOUT, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["left"] == 0 and found["live_ended"], found
    assert found["waited"] < 9.0, found


def _descendants(root: int) -> set[int]:
    """Pids of the processes below `root` (its local Ray: GCS, raylet, the actors), from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # the process ended while we looked
            continue
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _assert_gone(pids: set[int], wait: float = 30) -> None:
    """Every process of `pids` has ended (Ray's local processes share the driver's fate), so no
    actor of the killed job is left that could still write a shard."""
    deadline = time.monotonic() + wait
    while (left := {p for p in pids if Path(f"/proc/{p}").exists()}) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, left


def test_without_ray_it_is_one_line_naming_the_extra(untrained: dict, tmp_path: Path) -> None:
    """Ray made unimportable (a None in sys.modules is how Python marks a module that must not
    load): one line, exit 2, nothing written."""
    out = tmp_path / "out"
    code = "import sys; sys.modules['ray'] = None; " + CTD
    args = ["score", "--bundle", str(untrained["bundle"]), "--data", str(untrained["data"])]
    args += ["--out", str(out), "--ray", "local"]
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **untrained["env"]},
    )
    assert_one_line_error(result, "--ray", "pip install 'ctd-harness[ray]'")
    assert not out.exists()
