"""What `ctd eval` shows, through the real command: in a terminal its first line comes as soon as
the command has started and the stage counter follows; in a real terminal (tmux) the final screen
keeps every stage's summary line, with its counter, and the summary table; with output to a file,
a plain progress line arrives at a steady interval during a long stage and lines are not cut at
80 columns. Also the run record of every invocation (run.json), `ctd runs` and `ctd report`."""

from __future__ import annotations

import itertools
import json
import os
import pty
import re
import select
import shutil
import signal
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
# "[2/6] query done in 1m05s: ..." (the counter is the stage's place among the six)
STAGE_LINE = re.compile(
    r"^\[(?P<number>\d)/6\] (?P<stage>probe|query|dv|calibrate|validate|report) "
    r"(done in (\d+\.\ds|\d+s|\d+m\d\ds|\d+h\d\dm)|skipped \(up to date\))"
)
PROGRESS_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d) expert: (\d+)/(\d+) examples ")


def eval_args(data: list[str], url: str) -> list[str]:
    return ["eval", "--name", "t", "--expert", url, "--expert-model", "fault-model", *FAST, *data]


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # cursor moves and styles between the texts of a live display
FIRST_LINE = "ctd eval: starting"  # before the command line's imports
CHECKING = "ctd eval t: checking the data, the model and the expert"  # after them, during the checks


def tmux(socket: str, *args: str) -> str:
    return subprocess.run(
        ["tmux", "-L", socket, *args], check=True, capture_output=True, text=True, timeout=30
    ).stdout


def _read_until(
    master: int, patterns: list[re.Pattern[str]], started: float, limit: float
) -> dict[str, float]:
    """Read the terminal's output until each pattern has been seen (or `limit` seconds have
    passed): the seconds from `started` to the first sight of each, by pattern text."""
    seen: dict[str, float] = {}
    text = ""
    while len(seen) < len(patterns) and time.monotonic() - started < limit:
        ready, _, _ = select.select([master], [], [], 0.05)
        if not ready:
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the command exited and closed the terminal
            break
        if not chunk:
            break
        text += ANSI.sub("", chunk.decode(errors="replace"))
        for pattern in patterns:
            if pattern.pattern not in seen and pattern.search(text):
                seen[pattern.pattern] = time.monotonic() - started
    return seen


def test_a_terminal_shows_a_line_at_once_then_the_stage_counter(tmp_path: Path) -> None:
    """In a terminal (a pseudo-terminal), `ctd eval`'s first line comes at once: "ctd eval:
    starting", before the command line's imports, well within the time `ctd --version` (the same
    interpreter start and all of those imports) takes: the bound is twice that plus a second,
    for a loaded machine. The old code's first text came with the first bar, after the model
    loaded: 29 s into a run here (`ctd --version` 1.0 s). Then what the run checks, then the
    stage counter "[1/6] probe"; Ctrl-C there ends the run as an interrupted one."""
    data = [f"--data={token}" for token in write_tagged_data(tmp_path / "data")]
    env = {**os.environ, **eval_env(tmp_path), "TERM": "xterm-256color", "COLUMNS": "150", "LINES": "50"}
    started = time.monotonic()
    assert run_ctd("--version", cwd=tmp_path).returncode == 0
    start_cost = time.monotonic() - started
    with RunningServer() as server:
        master, terminal = pty.openpty()
        started = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, "-c", CTD, *eval_args(data, server.url)],
            cwd=tmp_path,
            env=env,
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # pytest may ignore it
        )
        os.close(terminal)
        try:
            anything, first = re.compile(r"\S"), re.compile(re.escape(FIRST_LINE))
            checking, counter = re.compile(re.escape(CHECKING)), re.compile(r"\[1/6\] probe\b")
            seen = _read_until(master, [anything, first, checking, counter], started, limit=300)
            process.send_signal(signal.SIGINT)
            _read_until(master, [re.compile("never printed")], time.monotonic(), limit=60)  # drain
            code = process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(10)
            os.close(master)
    assert anything.pattern in seen and seen[anything.pattern] <= 2 * start_cost + 1.0, (seen, start_cost)
    assert seen.get(first.pattern, 1e9) - seen[anything.pattern] < 0.5, seen  # the first text is that line
    assert seen[first.pattern] <= seen.get(checking.pattern, 0) <= seen.get(counter.pattern, 0), seen
    assert code == 130, code
    runs = run_ctd("runs", "--json", cwd=tmp_path, env=eval_env(tmp_path))
    assert json.loads(runs.stdout)["runs"][0]["status"] == "interrupted at probe", runs.stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")
@pytest.mark.parametrize(
    "refused",
    [("--budgets", "0.2,1.5"), ("--limit", "40")],  # refused parsing options; by the checks, after the status
    ids=["options", "checks"],
)
def test_a_refused_run_in_a_terminal_leaves_only_its_error_line(
    tmp_path: Path, refused: tuple[str, str]
) -> None:
    """The starting line and the checks' status row are replaced, not left above the error: the
    screen of a run refused while its options are read, or by its checks, holds one error line."""
    socket = f"ctd-test-{uuid.uuid4().hex[:8]}"
    env = {**eval_env(tmp_path), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    command = " ".join(
        ["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-c", f'"{CTD}"', "eval", *refused]
    )
    tmux(
        socket,
        "new-session",
        "-d",
        "-x",
        "500",  # wide enough that the error line (it names the budgets that would work) never wraps
        "-y",
        "20",
        "-c",
        str(tmp_path),
        command + "; echo CTD-EXIT=$?; sleep 60",
    )
    try:
        deadline, screen = time.monotonic() + 120, ""
        while "CTD-EXIT=" not in screen and time.monotonic() < deadline:
            time.sleep(0.5)
            screen = tmux(socket, "capture-pane", "-p", "-t", "0")
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, timeout=30)
    lines = [line.rstrip() for line in screen.splitlines() if line.strip()]
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1] == "CTD-EXIT=2", screen


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
    shown = {m["stage"]: int(m["number"]) for line in lines if (m := STAGE_LINE.match(line))}
    assert shown == {stage: number for number, stage in enumerate(STAGES, 1)}, screen
    assert any("summary: means over seeds" in line for line in lines), screen
    assert any(line.lstrip("│┃ ").startswith("metric") for line in lines), screen
    assert not any("━" in line and "%" in line for line in lines), screen  # no bar left on the screen
    assert any(line.startswith("report: ") for line in lines), screen


def test_output_to_a_file_has_steady_plain_progress_lines(tmp_path: Path) -> None:
    """Output to a file with CTD_PROGRESS_INTERVAL=1: during the expert stage (about 8 s, beside
    the probe stage, whose lines are as steady), a plain line at least every interval (timestamps
    have whole seconds: a gap of at most 3 s), lines longer than 80 columns kept whole, no bar
    drawing; then a rerun keeps both invocations' records, and `ctd runs` and `ctd report` show
    the run."""
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
    # The expert is asked while the probe stage works (an expert by URL): either may end first.
    done = [m["stage"] for line in lines if (m := STAGE_LINE.match(line))]
    assert sorted(done[:2]) == ["probe", "query"] and done[2:] == list(STAGES[2:]), log
    header = "ctd eval t: 6 stages (probe, query, dv, calibrate, validate, report) in "
    assert lines[0].startswith(header), log  # after the checks: a refused run prints only its error
    assert re.match(r"^\d\d:\d\d:\d\d \[1/6\] probe: started$", lines[1]), log  # then the stage beside it
    # The two stages' first lines, in either order
    firsts = sorted(line[9:] for line in lines[2:4])
    assert firsts == ["[1/6] probe: loading the monitored model smollm2", "[2/6] query: started"], log
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
