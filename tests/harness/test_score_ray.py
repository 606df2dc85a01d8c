"""`ctd score --ray`: the same shards as `ctd score`, scored by Ray actors on a local Ray (started
by the command, about 10 s here), killed mid-job and resumed without a shard written twice; and
without Ray, one line naming the extra to install.

The data is the `made` run's test split three times over (the first copy keeps its ids, so it is
the run's test split; the others get new ids): enough shards that a job is still working when
it is killed."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from ctd_cli import CTD, assert_one_line_error, run_ctd, start_ctd

from harness import read_scores

COPIES = 3
SHARD_ROWS = 8
TOLERANCE = 1e-5
RAY_TIMEOUT = 300  # seconds: Ray's start, two actors loading the model, 24 shards


def _needs_ray() -> None:
    pytest.importorskip("ray.data", reason="Ray is not installed (pip install 'ctd-harness[ray]')")


@pytest.fixture(scope="module")
def job(made: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The repeated test split, and `ctd score` of it without Ray (the one-go run to compare)."""
    tmp = tmp_path_factory.mktemp("score-ray")
    rows = [json.loads(line) for line in (made["tmp"] / "data" / "test.jsonl").read_text().splitlines()]
    data = tmp / "conversations.jsonl"
    with data.open("w") as handle:
        for copy in range(COPIES):
            for row in rows:
                ids = row["ids"] if copy == 0 else f"{row['ids']}-copy{copy}"
                handle.write(json.dumps({**row, "ids": ids}) + "\n")
    here = tmp / "here"
    done = _score(made, data, here)
    assert done.returncode == 0, done.stderr
    return {"data": data, "here": here, "rows": len(rows) * COPIES, "test_ids": [r["ids"] for r in rows]}


def _score(made: dict, data: Path, out: Path, *extra: str):
    return run_ctd(
        "score", "--bundle", str(made["bundle"]), "--data", str(data), "--out", str(out),
        "--shard-rows", str(SHARD_ROWS), "--json", *extra,
        cwd=made["tmp"], env=made["env"], timeout=RAY_TIMEOUT,
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


def test_score_on_ray_equals_score_here_and_the_run(made: dict, job: dict, tmp_path: Path) -> None:
    _needs_ray()
    done = _score(made, job["data"], tmp_path / "ray", "--ray", "local", "--actors", "2")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    shards = -(-job["rows"] // SHARD_ROWS)
    assert (summary["rows"], summary["shards"], summary["written"]) == (job["rows"], shards, shards)
    assert "Traceback" not in done.stderr
    on_ray, here = _rows(tmp_path / "ray"), _rows(job["here"])
    _assert_same_scores(on_ray, here)
    # The first copy is the run's test split: its probe and DV scores are the run's.
    run = read_scores(made["tmp"] / "runs" / "t" / "scores.parquet")
    test = {i: (p, d) for i, s, p, d in zip(run.id, run.split, run.probe, run.dv, strict=True) if s == "test"}
    assert sorted(test) == sorted(job["test_ids"])
    for i, (probe, dv) in test.items():
        assert abs(on_ray[i]["probe"] - probe) <= TOLERANCE and abs(on_ray[i]["dv"] - dv) <= TOLERANCE, i


def test_a_killed_ray_job_resumes_without_writing_a_shard_twice(
    made: dict, job: dict, tmp_path: Path
) -> None:
    _needs_ray()
    out = tmp_path / "ray"
    args = ["score", "--bundle", str(made["bundle"]), "--data", str(job["data"]), "--out", str(out)]
    args += ["--shard-rows", str(SHARD_ROWS), "--ray", "local", "--actors", "2"]
    process = start_ctd(*args, cwd=made["tmp"], env=made["env"])
    total = -(-job["rows"] // SHARD_ROWS)
    deadline = time.monotonic() + RAY_TIMEOUT
    while len(_stamps(out)) < 3 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process.poll() is None, f"the job ended before it could be killed: {process.communicate()}"
    ray = _descendants(process.pid)
    assert len(ray) >= 3, ray  # the GCS, the raylet, two actors (and Ray's helpers)
    process.send_signal(signal.SIGINT)
    try:
        process.communicate(timeout=5)
    except Exception:
        process.kill()  # SIGKILL: Ray's local processes share the driver's fate
        process.communicate()
    before = _stamps(out)
    assert 3 <= len(before) < total, len(before)
    _assert_gone(ray)

    done = _score(made, job["data"], out, "--ray", "local", "--actors", "2")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["skipped"] >= len(before) and summary["written"] == total - summary["skipped"]
    after = _stamps(out)
    assert {name: after[name] for name in before} == before  # not one shard written again
    assert len(after) == total and not list(out.glob(".shard-*"))
    _assert_same_scores(_rows(out), _rows(job["here"]))


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


def test_without_ray_it_is_one_line_naming_the_extra(made: dict, tmp_path: Path) -> None:
    """Ray made unimportable (a None in sys.modules is how Python marks a module that must not
    load): one line, exit 2, nothing written."""
    import subprocess
    import sys

    out = tmp_path / "out"
    code = "import sys; sys.modules['ray'] = None; " + CTD
    args = ["score", "--bundle", str(made["bundle"]), "--data", str(made["tmp"] / "data" / "test.jsonl")]
    args += ["--out", str(out), "--ray", "local"]
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=made["tmp"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **made["env"]},
    )
    assert_one_line_error(result, "--ray", "pip install 'ctd-harness[ray]'")
    assert not out.exists()
