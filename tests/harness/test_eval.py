"""`ctd eval` end to end through the real CLI: the embedded monitored model, a fault-injecting
OpenAI-compatible expert that counts requests, resumable stages, kill and resume, bad input."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest
from ctd_cli import assert_one_line_error, free_port, llama_servers_on, run_ctd, start_ctd
from eval_data import FAST, SIZES, eval_env, write_tagged_data
from fault_server import FaultPlan, RunningServer, item_score

from harness import read_scores, read_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    return eval_env(tmp_path)


def eval_args(data: list[str], url: str, *extra: str, expert_model: str | None = "fault-model") -> list[str]:
    """An expert by URL (with the model it serves), or by registered name (expert_model=None)."""
    model = ["--expert-model", expert_model] if expert_model else []
    args = ["eval", "--name", "t", "--expert", url, *model, *FAST, *extra]
    for token in data:
        args += ["--data", token]
    return args


def item_requests(server: RunningServer) -> dict[int, int]:
    """Requests per example; the endpoint checks (no item tag, key -1) left out."""
    return {k: v for k, v in server.server.counts.requests.items() if k >= 0}


def item_successes(server: RunningServer) -> int:
    return sum(v for k, v in server.server.counts.successes.items() if k >= 0)


def stage_status(out: str) -> dict[str, str]:
    return {s["stage"]: s["status"] for s in json.loads(out)["stages"]}


def test_eval_runs_every_stage_then_skips_and_reruns_only_what_changed(tmp_path, env) -> None:
    data = write_tagged_data(tmp_path / "data")
    with RunningServer() as server:
        first = run_ctd(*eval_args(data, server.url), "--json", cwd=tmp_path, env=env, timeout=600)
        assert first.returncode == 0, first.stderr
        assert set(stage_status(first.stdout).values()) == {"ran"}
        run = tmp_path / "runs" / "t"
        requests = item_requests(server)
        assert len(requests) == SIZES["dev"] + SIZES["test"] and set(requests.values()) == {1}

        table = read_scores(run / "scores.parquet")
        test_rows = table.split == "test"
        assert np.isfinite(table.dv[test_rows]).all() and np.isnan(table.dv[~test_rows]).all()
        expert = read_table(run / "query" / "expert_scores.parquet").columns
        numbers = item_numbers(tmp_path / "data")
        for item_id, score in zip(expert["id"], expert["expert"], strict=True):
            assert score == pytest.approx(item_score(numbers[str(item_id)]), abs=1e-6)
        for name in ("config.toml", "run.json", "log.txt", "report/report.md", "report/numbers.json"):
            assert (run / name).is_file(), name
        for stage in ("probe", "query", "dv", "calibrate", "validate", "report"):
            assert json.loads((run / "manifests" / f"{stage}.json").read_text())["status"] == "done"
        # where the probe stage's time went, every token run by this first call
        assert re.search(
            r"probe: [\d.]+ s loading the model, [\d.]+ s extracting \((\d+) of \1 tokens run, [\d,]+ "
            r"tokens/s\), [\d.]+ s training 1 probe, [\d.]+ s scoring dev and test",
            (run / "log.txt").read_text(),
        )
        figures = {p.name for p in (run / "report" / "figures" / "attention").glob("*.png")}
        assert {
            "cascade-auroc.png",
            "cascade-accuracy.png",
            "realised.png",
            "validation-levels.png",
            "validation-budget.png",
        } <= figures
        # Performance control at every error level D_cal can certify (22 rows: not 0.05), each
        # configuration with split seeds of its own.
        performance = json.loads((run / "validate" / "attention" / "performance.json").read_text())
        assert [level["alpha"] for level in performance["levels"]][:2] == [0.1, 0.15]
        assert performance["not_validated"][0]["alpha"] == 0.05
        seeds = {
            json.loads((run / "validate" / "attention" / f"{job}.json").read_text())["levels"][0]["seed"][1]
            for job in ("budget-pareto", "budget-ltt", "performance")
        }
        assert len(seeds) == 3
        assert read_table(run / "query" / "failed.csv").columns["id"].size == 0

        again = run_ctd(*eval_args(data, server.url), "--json", cwd=tmp_path, env=env, timeout=600)
        assert again.returncode == 0, again.stderr
        assert set(stage_status(again.stdout).values()) == {"skipped"}
        assert item_requests(server) == requests  # nothing asked twice

        changed = run_ctd(
            *eval_args(data, server.url),
            *("--json", "--budgets", "0.4,0.6", "--no-merge-controls"),
            cwd=tmp_path,
            env=env,
            timeout=600,
        )
        assert changed.returncode == 0, changed.stderr
        assert stage_status(changed.stdout) == {
            "probe": "skipped",
            "query": "skipped",
            "dv": "skipped",
            "calibrate": "ran",
            "validate": "ran",  # budget control is validated at every budget of the run
            "report": "ran",
        }
        assert not list((run / "calibrate" / "attention").glob("merge-*"))  # no stale merge controls
        sweep = read_table(run / "calibrate" / "attention" / "sweep.csv").columns
        assert set(np.round(sweep["budget"].astype(float), 6)) == {0.4, 0.6}
        # Every budget and the headline level (--budget-alpha, default 0.3) are validated.
        record = json.loads((run / "validate" / "attention" / "budget-ltt.json").read_text())
        assert [level["alpha"] for level in record["levels"]] == [0.3, 0.4, 0.6]
        assert all("population" in level for level in record["levels"])
        report = run_ctd("report", "t", cwd=tmp_path, env=env)
        assert report.returncode == 0, report.stderr
        assert "report.md" in report.stdout

        # An output truncated behind the run's back: `ctd runs` says so instead of "done", and
        # the rerun redoes that stage (from the cache: nothing asked) and says why.
        def listed() -> dict:
            runs = run_ctd("runs", "--json", cwd=tmp_path, env=env)
            assert runs.returncode == 0, runs.stderr
            return json.loads(runs.stdout)["runs"][0]

        assert listed()["status"] == "done"
        scores_table = run / "query" / "expert_scores.parquet"
        with scores_table.open("r+b") as handle:
            handle.truncate(scores_table.stat().st_size // 2)
        shown = listed()
        assert shown["status"] == "changed on disk: query/expert_scores.parquet"
        assert shown["changed"] == ["query/expert_scores.parquet"]
        redone = run_ctd(
            *eval_args(data, server.url),
            *("--json", "--budgets", "0.4,0.6", "--no-merge-controls"),
            cwd=tmp_path,
            env=env,
            timeout=600,
        )
        assert redone.returncode == 0, redone.stderr
        query = next(s for s in json.loads(redone.stdout)["stages"] if s["stage"] == "query")
        assert query["status"] == "ran"
        assert "query/expert_scores.parquet had changed on disk" in query["detail"]
        assert item_requests(server) == requests  # answered from the cache
        assert "outputs changed on disk since it ran" in (run / "log.txt").read_text()
        assert listed()["status"] == "done"

        # Answers removed from the cache (`ctd cache forget`, here of three answers marked as the
        # old `choice` rung's): a plain rerun keeps the run as it is and asks nothing; with
        # --retry-failed the query stage asks those three items and no other.
        with contextlib.closing(sqlite3.connect(tmp_path / "cache.sqlite")) as connection:
            connection.execute("UPDATE scores SET how = 'choice' WHERE rowid IN (2, 5, 7)")
            connection.commit()
        forgot = run_ctd("cache", "forget", "--how", "choice", "--yes", cwd=tmp_path, env=env)
        assert forgot.returncode == 0 and "forgot 3 answers" in forgot.stdout, forgot.stderr
        rerun_args = (*eval_args(data, server.url), "--json", "--budgets", "0.4,0.6", "--no-merge-controls")
        plain = run_ctd(*rerun_args, cwd=tmp_path, env=env, timeout=600)
        assert plain.returncode == 0, plain.stderr
        assert stage_status(plain.stdout)["query"] == "skipped" and item_requests(server) == requests
        asked = run_ctd(*rerun_args, "--retry-failed", cwd=tmp_path, env=env, timeout=600)
        assert asked.returncode == 0, asked.stderr
        assert stage_status(asked.stdout)["query"] == "ran"
        assert sum(item_requests(server).values()) == sum(requests.values()) + 3
        # A cache that holds none of the run's answers (not the one it used): asking them all
        # again is no retry, so nothing is asked and the cache is not made.
        other = {**env, "CTD_CACHE": str(tmp_path / "other.sqlite")}
        elsewhere = run_ctd(*rerun_args, "--retry-failed", cwd=tmp_path, env=other, timeout=600)
        assert_one_line_error(elsewhere, "--retry-failed", "other.sqlite", "nothing was asked")
        assert not (tmp_path / "other.sqlite").exists()
        assert sum(item_requests(server).values()) == sum(requests.values()) + 3


def test_too_many_expert_failures_stop_before_calibration(tmp_path, env) -> None:
    """Two of 64 test items fail at the expert (3.1%, above --max-failed 1%): the run stops after
    the query stage in one line with exit code 1, the ids are in query/failed.csv, and nothing
    is calibrated. A higher --max-failed goes on without them and the report says so."""
    data = write_tagged_data(tmp_path / "data")
    first_test_item = SIZES["train"] + SIZES["dev"]
    broken = frozenset({first_test_item + 2, first_test_item + 3})
    with RunningServer(FaultPlan(broken=broken)) as server:
        stopped = run_ctd(*eval_args(data, server.url), cwd=tmp_path, env=env, timeout=600)
        assert stopped.returncode == 1, stopped.stderr
        last = stopped.stderr.strip().splitlines()[-1]
        assert "Traceback" not in stopped.stderr
        assert last.startswith("error: the expert failed on test examples: 2 of 64 failed (3.1%)"), last
        assert "--max-failed 0.01" in last and "--retry-failed" in last
        run = tmp_path / "runs" / "t"
        assert str(run / "query" / "failed.csv") in last
        failed = read_table(run / "query" / "failed.csv").columns
        assert sorted(failed["split"].tolist()) == ["test", "test"]
        assert not (run / "scores.parquet").exists() and not (run / "calibrate").exists()

        went_on = run_ctd(
            *eval_args(data, server.url), "--max-failed", "0.05", "--json", cwd=tmp_path, env=env
        )
        assert went_on.returncode == 0, went_on.stderr
        assert stage_status(went_on.stdout)["query"] == "skipped"
        assert read_scores(run / "scores.parquet").id.size == SIZES["dev"] + SIZES["test"] - 2
        report = (run / "report" / "report.md").read_text()
        assert "the expert failed on 2 examples" in report
        numbers = json.loads((run / "report" / "numbers.json").read_text())
        assert numbers["left_out"] == 2
        # Beside the count: the left-out rows' labels and groups, as the data file gives them.
        truth = {(r["split"], r["group"], str(r["label"])) for r in written_rows(tmp_path / "data", broken)}
        assert {(r["split"], r["group"], r["label"]) for r in numbers["left_out_rows"]} == truth
        assert sum(r["count"] for r in numbers["left_out_rows"]) == 2
        assert all(f"| test | {g} | {lab} | no-label-mass |" in report for _, g, lab in truth)
        assert numbers["expert_how_by_split"]["test"]["left out"] == 2


def written_rows(folder: Path, numbers: frozenset[int]) -> list[dict[str, object]]:
    """The rows of the data folder whose item-N tag is in `numbers`: split, group, label (1 high)."""
    found = []
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if int(re.search(r"item-(\d+)", row["inputs"]).group(1)) in numbers:
                label = int(row["labels"] == "high-stakes")
                found.append({"split": path.stem, "group": row.get("group", ""), "label": label})
    return found


def item_numbers(folder: Path) -> dict[str, int]:
    """Example id -> the item-N tag written into its text."""
    numbers: dict[str, int] = {}
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            numbers[row["ids"]] = int(re.search(r"item-(\d+)", row["inputs"]).group(1))
    return numbers


def test_killed_during_expert_stage_resumes_without_paying_twice(tmp_path, env) -> None:
    data = write_tagged_data(tmp_path / "data")
    plan = FaultPlan(delay=0.15)  # slow answers, so the kill lands inside the expert stage
    with RunningServer(plan) as server:
        process = start_ctd(*eval_args(data, server.url), "--json", cwd=tmp_path, env=env)
        deadline = time.monotonic() + 300
        while item_successes(server) < 20 and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait()
        killed_at = item_requests(server)
        in_flight = sum(killed_at.values()) - sum(server.server.counts.successes[k] for k in killed_at)
        assert 20 <= sum(killed_at.values()) < SIZES["dev"] + SIZES["test"]
        run = tmp_path / "runs" / "t"
        assert not (run / "manifests" / "query.json").exists()

        resumed = run_ctd(*eval_args(data, server.url), "--json", cwd=tmp_path, env=env, timeout=600)
        assert resumed.returncode == 0, resumed.stderr
        counts = item_requests(server)
        duplicates = sum(c - 1 for c in counts.values())
        # Asked again: only what was in flight at the kill, or answered but not yet committed;
        # both are bounded by the client's concurrency (16 for an expert given by URL).
        assert duplicates <= 16, (duplicates, in_flight)
        assert len(counts) == SIZES["dev"] + SIZES["test"]

    clean_env = {**env, "CTD_RUNS_DIR": str(tmp_path / "clean"), "CTD_CACHE": str(tmp_path / "clean.sqlite")}
    with RunningServer() as server:
        clean = run_ctd(*eval_args(data, server.url), "--json", cwd=tmp_path, env=clean_env, timeout=600)
        assert clean.returncode == 0, clean.stderr
    resumed_scores = read_table(run / "scores.parquet").columns
    clean_scores = read_table(tmp_path / "clean" / "t" / "scores.parquet").columns
    for column in ("id", "probe", "expert", "dv"):
        np.testing.assert_array_equal(resumed_scores[column], clean_scores[column])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupt_leaves_a_run_that_resumes(tmp_path, env, signum: int) -> None:
    data = write_tagged_data(tmp_path / "data")
    with RunningServer(FaultPlan(delay=0.15)) as server:
        process = start_ctd(*eval_args(data, server.url), cwd=tmp_path, env=env)
        deadline = time.monotonic() + 300
        while item_successes(server) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 130, stderr
        assert "rerun the same command to resume" in stderr.strip().splitlines()[-1]
        run = tmp_path / "runs" / "t"
        log = json.loads((run / "run.json").read_text())
        # The expert is asked while the probe stage works (an expert by URL): the signal lands in
        # the probe stage and the query stage beside it is stopped with it. On a loaded machine
        # the probe stage may have ended first: its log line says so.
        assert log["stages"]["query"]["status"] == "interrupted", stderr
        told = (run / "log.txt").read_text()
        probe_ended = "probe: finished" in told
        assert log["stages"]["probe"]["status"] == ("ran" if probe_ended else "interrupted"), (told, stderr)
        resumed = run_ctd(*eval_args(data, server.url), "--json", cwd=tmp_path, env=env, timeout=600)
        assert resumed.returncode == 0, resumed.stderr
        assert sum(c - 1 for c in item_requests(server).values()) <= 16


def test_bad_options_fail_before_any_work(tmp_path, env) -> None:
    data = write_tagged_data(tmp_path / "data")
    with RunningServer() as server:
        cases = [
            (["eval", "--expert", "no-such-expert"], ["no-such-expert"]),
            (["eval", "--expert", "http://127.0.0.1:9/v1", "--expert-model", "m"], ["127.0.0.1:9"]),
            (
                ["eval", "--expert", "http://me:s3cret@127.0.0.1:9/v1", "--expert-model", "m"],
                ["--expert 'http://***@127.0.0.1:9/v1'", "credentials", "--api-key-env"],
            ),
            (["eval", "--data", "train=missing.jsonl"], ["missing.jsonl"]),
            (["eval", "--data", "bogus=x.jsonl"], ["bogus"]),
            (["eval", "--budgets", "0.2,1.5"], ["--budgets", "1.5"]),
            (["eval", "--arch", "transformer"], ["--arch", "transformer"]),
            (eval_args(data, server.url, "--layer", "99"), ["--layer 99", "30 layers"]),
        ]
        for args, fragments in cases:
            started = time.monotonic()
            result = run_ctd(*args, cwd=tmp_path, env=env, timeout=300)
            assert_one_line_error(result, *fragments)
            assert "s3cret" not in result.stdout + result.stderr
            assert time.monotonic() - started < 60
        assert not item_requests(server)  # the layer error came before any expert was scored
    assert not list((tmp_path / "store").glob("*/complete.json"))


def test_config_file_with_flags_on_top(tmp_path, env) -> None:
    config = tmp_path / "run.toml"
    config.write_text('[run]\nexpert = "no-such-expert"\nseeds = [0, 1]\n')
    result = run_ctd("eval", "--config", str(config), cwd=tmp_path, env=env)
    assert_one_line_error(result, "no-such-expert")
    config.write_text('[run]\nexpert = "smollm2"\nbudget = 0.3\n')
    result = run_ctd("eval", "--config", str(config), cwd=tmp_path, env=env)
    assert_one_line_error(result, f"{config}:3", "unknown key 'budget'")
    config.write_text('[run]\nseeds = "zero"\n')
    result = run_ctd("eval", "--config", str(config), cwd=tmp_path, env=env)
    assert_one_line_error(result, "'seeds'")


def test_an_expert_that_goes_away_ends_the_run_in_one_line_and_it_resumes(tmp_path, env) -> None:
    """The expert server dies in the middle of the query stage: instead of paying every remaining
    item its retries, the run stops once `down_after` items in a row fail at the endpoint, with
    one line and exit code 1; the probe stage and the answers so far are kept, and a rerun
    against the server (back on the same port) finishes without asking them again."""
    data = write_tagged_data(tmp_path / "data")
    experts_file = tmp_path / "experts.toml"
    env = {**env, "CTD_EXPERTS_FILE": str(experts_file)}
    args = eval_args(data, "flaky", expert_model=None)
    first = RunningServer(FaultPlan(delay=0.05))
    with first:
        port = first.port
        experts_file.write_text(
            f'[experts.flaky]\nbase_url = "{first.url}"\nmodel = "fault-model"\n'
            "concurrency = 2\nmax_attempts = 2\ndown_after = 4\n"
        )
        process = start_ctd(*args, cwd=tmp_path, env=env)
        deadline = time.monotonic() + 300
        while item_successes(first) < 10 and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()
            time.sleep(0.02)
    answered_first = {k for k, v in first.server.counts.successes.items() if k >= 0 and v}
    started = time.monotonic()
    _, stderr = process.communicate(timeout=120)
    assert time.monotonic() - started < 60
    assert process.returncode == 1, stderr
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr
    assert lines[-1].startswith("error: the expert stopped answering: 4 items in a row"), lines[-1]
    assert lines[-1].endswith("rerun to resume")
    run = tmp_path / "runs" / "t"
    log = json.loads((run / "run.json").read_text())
    assert log["stages"]["probe"]["status"] == "ran"
    assert log["stages"]["query"]["status"] == "failed"

    with RunningServer(FaultPlan(), port=port) as second:
        resumed = run_ctd(*args, "--json", cwd=tmp_path, env=env, timeout=600)
        assert resumed.returncode == 0, resumed.stderr
        assert stage_status(resumed.stdout)["probe"] == "skipped"
        asked_again = set(item_requests(second)) & answered_first
        assert len(asked_again) <= 2  # at most what was in flight when the first server went away
        assert len(set(item_requests(second)) | answered_first) == SIZES["dev"] + SIZES["test"]


@pytest.mark.skipif(
    importlib.util.find_spec("xllamacpp") is None, reason="xllamacpp (llama.cpp's server) is not installed"
)
def test_a_local_expert_server_that_dies_is_named(tmp_path, env) -> None:
    """The llama.cpp server the run started is killed in the middle of the query stage: the run
    ends in one line that says the local server exited, with its log, and exit code 1."""
    data = write_tagged_data(tmp_path / "data")
    port = free_port()
    experts_file = tmp_path / "experts.toml"
    experts_file.write_text(
        f'[experts.tiny]\nbase_url = "http://127.0.0.1:{port}/v1"\nmodel = "smollm2"\n'
        'server = "llama.cpp"\nconcurrency = 2\nmax_attempts = 2\ndown_after = 2\n'
    )
    env = {**env, "CTD_EXPERTS_FILE": str(experts_file)}
    args = eval_args(data, "tiny", expert_model=None)
    process = start_ctd(*args, cwd=tmp_path, env=env)
    cache = tmp_path / "cache.sqlite"
    deadline = time.monotonic() + 400
    answered = 0
    while answered < 3 and time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        if cache.is_file() and llama_servers_on(port):
            with contextlib.closing(sqlite3.connect(cache)) as db, contextlib.suppress(sqlite3.Error):
                answered = db.execute("select count(*) from scores").fetchone()[0]
        time.sleep(0.2)
    for pid in llama_servers_on(port):
        os.kill(pid, signal.SIGKILL)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr
    last = stderr.strip().splitlines()[-1]
    assert "Traceback" not in stderr
    assert last.startswith("error: the local server for tiny exited with code -9 during the run"), last
    run = tmp_path / "runs" / "t"
    assert str(run / "query" / "server.log") in last and last.endswith("rerun to resume")
    assert json.loads((run / "run.json").read_text())["stages"]["query"]["status"] == "failed"
    assert llama_servers_on(port) == []
