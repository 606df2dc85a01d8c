"""Stopping `ctd query` with a signal: the answers in flight are awaited for a bounded time and
committed (a resume pays for none of them again), and the stop is one line and exit code 130,
whether the shell started `ctd` with SIGINT ignored (a background job of a script) or not.

Each test runs the real `ctd query` in a subprocess against the fault server in a process of its
own, whose request counts say who paid for what."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ctd_cli import CTD, run_ctd
from fault_server import server_process
from test_experts_claims import write_workdir
from test_experts_engine import server_stats

N = 120
CONCURRENCY = 8
DELAY = 1.0  # each answer takes 1 s: a signal always finds answers in flight, well within the grace


def start_query(folder: Path, env: dict[str, str], *, sigint: signal.Handlers) -> subprocess.Popen[str]:
    """`ctd query` in the background with SIGINT set to `sigint` in the child (SIG_IGN: what a
    non-interactive shell does to a background job)."""
    return subprocess.Popen(
        [sys.executable, "-c", CTD, "query", "--data", "data.jsonl", "--out", "out.csv",
         "--expert", "faulty", "--no-check", "--json"],
        cwd=folder, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
    )  # fmt: skip


def stop_mid_run(url: str, process: subprocess.Popen[str], signum: int) -> str:
    """Send `signum` once some answers are in and more are in flight; the process's stderr."""
    deadline = time.monotonic() + 60
    while sum(server_stats(url)["successes"].values()) < 2 * CONCURRENCY:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no answers in time"
        time.sleep(0.05)
    time.sleep(DELAY / 2)  # mid-answer: the requests in flight are half way through their delay
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    return stderr


def assert_stopped(process: subprocess.Popen[str], stderr: str) -> None:
    """Exit code 130 and no traceback: stderr is the drain's line and one error line."""
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert lines[-1].startswith("error: interrupted"), stderr
    assert all(line.startswith("stopping: ") for line in lines[:-1]), stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_stop_commits_the_answers_in_flight(tmp_path: Path, signum: int) -> None:
    with server_process(tmp_path, {"delay": DELAY}) as url:
        env = write_workdir(tmp_path, N, url, concurrency=CONCURRENCY)
        process = start_query(tmp_path, env, sigint=signal.SIG_DFL)
        stderr = stop_mid_run(url, process, signum)
        at_stop = server_stats(url)
        assert sum(at_stop["requests"].values()) < N  # it did stop early
        resumed = run_ctd(
            "query", "--data", "data.jsonl", "--out", "out.csv", "--expert", "faulty", "--no-check",
            cwd=tmp_path, env=env, timeout=120,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        end = server_stats(url)
    # Every item paid for once: the answers in flight at the stop were committed, not dropped.
    assert end["requests"] == dict.fromkeys(range(N), 1), {i: c for i, c in end["requests"].items() if c > 1}
    assert_stopped(process, stderr)
    assert "stopping: waiting up to 5 s for" in stderr, stderr


def test_sigterm_with_sigint_ignored_is_one_line(tmp_path: Path) -> None:
    """A background job of a shell script starts with SIGINT ignored; SIGTERM still stops it
    cleanly, draining like any stop."""
    with server_process(tmp_path, {"delay": DELAY}) as url:
        env = write_workdir(tmp_path, N, url, concurrency=CONCURRENCY)
        process = start_query(tmp_path, env, sigint=signal.SIG_IGN)
        stderr = stop_mid_run(url, process, signal.SIGTERM)
        assert_stopped(process, stderr)
        stats = server_stats(url)
    assert sum(stats["successes"].values()) == sum(stats["requests"].values())  # none dropped


def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    """The drain is bounded, and a second signal cuts it short."""
    with server_process(tmp_path, {"delay": 30.0}) as url:  # answers that would outlast any grace
        env = write_workdir(tmp_path, N, url, concurrency=CONCURRENCY)
        process = start_query(tmp_path, env, sigint=signal.SIG_DFL)
        deadline = time.monotonic() + 60
        while sum(server_stats(url)["requests"].values()) < CONCURRENCY:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no requests in time"
            time.sleep(0.05)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert process.poll() is None  # draining
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        took = time.monotonic() - started
    assert_stopped(process, stderr)
    assert took < 4, took  # not the 5 s grace, let alone the 30 s answers
