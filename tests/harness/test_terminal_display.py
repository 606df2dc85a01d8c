"""What `ctd eval` shows, through the real command: in a real terminal (tmux) the final screen
keeps every stage's summary line and the summary table; with output to a file, a plain progress
line arrives at a steady interval during a long stage and lines are not cut at 80 columns. Also
the run record of every invocation (run.json), `ctd runs` and `ctd report`."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from ctd_cli import CTD, run_ctd
from eval_data import FAST, SIZES, eval_env, write_tagged_data
from fault_server import FaultPlan, RunningServer

STAGES = ("probe", "query", "dv", "calibrate", "validate", "report")
STAGE_LINE = re.compile(
    r"^(probe|query|dv|calibrate|validate|report) (done in [\d.]+ s|skipped \(up to date\))"
)
PROGRESS_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d) expert: (\d+)/(\d+) ")


def eval_args(data: list[str], url: str) -> list[str]:
    return ["eval", "--name", "t", "--expert", url, "--expert-model", "fault-model", *FAST, *data]


def tmux(socket: str, *args: str) -> str:
    return subprocess.run(
        ["tmux", "-L", socket, *args], check=True, capture_output=True, text=True, timeout=30
    ).stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")
def test_final_screen_in_a_terminal_keeps_every_stage_line_and_the_summary(tmp_path: Path) -> None:
    """`ctd eval` in a 130x50 tmux pane: after the run, the visible screen holds each stage's
    summary line and the summary table, and no progress bar is left over."""
    data = [f"--data={token}" for token in write_tagged_data(tmp_path / "data")]
    socket = f"ctd-test-{uuid.uuid4().hex[:8]}"  # a tmux server of our own, ended below
    env = {**eval_env(tmp_path), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    with RunningServer(FaultPlan(delay=0.05)) as server:
        command = " ".join(
            [
                "env",
                *(f"{k}={v}" for k, v in env.items()),
                sys.executable,
                "-c",
                f'"{CTD}"',
                *eval_args(data, server.url),
                "; echo CTD-EXIT=$?",
            ]
        )
        tmux(
            socket,
            "new-session",
            "-d",
            "-x",
            "130",
            "-y",
            "50",
            "-c",
            str(tmp_path),
            "bash --norc --noprofile",
        )
        try:
            tmux(socket, "send-keys", "-t", "0", "clear; " + command, "Enter")
            deadline = time.monotonic() + 600
            screen = ""
            while time.monotonic() < deadline:
                screen = tmux(socket, "capture-pane", "-p", "-t", "0")
                if re.search(r"^CTD-EXIT=\d+", screen, re.MULTILINE):
                    break
                time.sleep(1)
        finally:
            subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, timeout=30)
    (tmp_path / "screen.txt").write_text(screen)  # the final screen, to look at when this fails
    assert "CTD-EXIT=0" in screen, screen
    lines = [line.rstrip() for line in screen.splitlines()]
    shown = {m.group(1) for line in lines if (m := STAGE_LINE.match(line))}
    assert shown == set(STAGES), screen
    assert any("summary: means over seeds" in line for line in lines), screen
    assert any(line.lstrip("│┃ ").startswith("metric") for line in lines), screen
    assert not any("━" in line and "%" in line for line in lines), screen  # no bar left on the screen
    assert any(line.startswith("report: ") for line in lines), screen


def test_output_to_a_file_has_steady_plain_progress_lines(tmp_path: Path) -> None:
    """Output to a file with CTD_PROGRESS_INTERVAL=1: during the expert stage (about 8 s), a plain
    line at least every interval (timestamps have whole seconds: a gap of at most 3 s), lines
    longer than 80 columns kept whole, no bar drawing; then a rerun keeps both invocations'
    records, and `ctd runs` and `ctd report` show the run."""
    data = [f"--data={token}" for token in write_tagged_data(tmp_path / "data")]
    env = {**eval_env(tmp_path), "CTD_PROGRESS_INTERVAL": "1"}
    with RunningServer(FaultPlan(delay=1.2)) as server:
        with (tmp_path / "out.txt").open("w") as out, (tmp_path / "err.txt").open("w") as err:
            result = subprocess.run(
                [sys.executable, "-c", CTD, *eval_args(data, server.url)],
                cwd=tmp_path,
                env={**os.environ, **env},
                stdout=out,
                stderr=err,
                timeout=600,
            )
        log = (tmp_path / "err.txt").read_text()
        assert result.returncode == 0, log
        again = run_ctd(*eval_args(data, server.url), cwd=tmp_path, env=env, timeout=600)
        assert again.returncode == 0, again.stderr
    lines = log.splitlines()
    assert {m.group(1) for line in lines if (m := STAGE_LINE.match(line))} == set(STAGES), log
    progress = [m for line in lines if (m := PROGRESS_LINE.match(line))]
    seconds = [
        int(h) * 3600 + int(m) * 60 + int(s) for h, m, s, _done, _total in (p.groups() for p in progress)
    ]
    assert len(progress) >= 5, log
    assert max(b - a for a, b in itertools.pairwise(seconds)) <= 3, log
    assert progress[-1].group(4) == progress[-1].group(5) == str(SIZES["dev"] + SIZES["test"])
    assert max(len(line) for line in lines if PROGRESS_LINE.match(line)) > 80  # not cut at 80
    assert "━" not in log and "\x1b[" not in log
    summary = (tmp_path / "out.txt").read_text()
    assert "summary: means over seeds" in summary and "report: " in summary

    # The rerun skipped every stage; the first invocation's records and timings are kept.
    record = json.loads((tmp_path / "runs" / "t" / "run.json").read_text())
    assert record["version"] == 2 and len(record["invocations"]) == 2
    assert {r["status"] for r in record["invocations"][1]["stages"].values()} == {"skipped"}
    first = record["invocations"][0]["stages"]
    assert {name: r["status"] for name, r in record["stages"].items()} == dict.fromkeys(STAGES, "ran")
    assert record["stages"]["query"]["seconds"] == first["query"]["seconds"] > 5

    runs = run_ctd("runs", "--json", cwd=tmp_path, env=env)
    assert runs.returncode == 0, runs.stderr
    (listed,) = json.loads(runs.stdout)["runs"]
    assert listed["name"] == "t" and listed["status"] == "done" and listed["invocations"] == 2
    assert listed["expert"] == server.url and listed["data"].startswith("train=")
    assert listed["stages"]["query"]["at"] == first["query"]["at"]
    table = run_ctd("runs", cwd=tmp_path, env=env)
    assert table.returncode == 0 and "done" in table.stdout and "test.jsonl" in table.stdout, table.stdout

    report = run_ctd("report", "t", cwd=tmp_path, env=env)
    assert report.returncode == 0, report.stderr
    assert "summary: means over seeds" in report.stdout and "report.md" in report.stdout
