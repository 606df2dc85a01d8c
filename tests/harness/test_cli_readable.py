"""What the light commands show, through the real `ctd`: every `ctd eval` default in --help,
`ctd experts show` in plain words, a refused connection named at once, `--version`, `ctd runs`
over run logs of every shape, and the plain progress display when stderr is not a terminal."""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Callable
from dataclasses import fields
from importlib import metadata
from pathlib import Path

import pytest
from ctd_cli import assert_one_line_error, free_port, run_ctd
from rich.console import Console

# Private: how a command shows a path or value.
from harness.cli._common import shown
from harness.expert import check_expert, pick_expert
from harness.run import RunConfig, RunLog, RunLogError, StageProgress, StageStatus

# Private: the run log's format version, written into the hand-made logs.
from harness.run._log import RUN_LOG_VERSION

# RunConfig fields whose default is not a value of the option: derived, or empty meaning "built-in".
# Defaults of None, described in words in their help ("default: ...").
# Defaults of None, said in words (the headline error level: the smallest certifiable one).
NOT_SHOWN = {
    "name",
    "data",
    "revision",
    "layer",
    "device_map",
    "expert_model",
    "merge_controls",
    "limit",
    "performance_alpha",
    "cost_limit",  # None, said in words: [no limit]
    "cascade",  # no option of its own: --expert small,large names the later experts
}


def test_eval_help_shows_every_default() -> None:
    """Each RunConfig default appears as [VALUE] in its own option's entry of `ctd eval --help`
    (none eaten as markup)."""
    result = run_ctd("eval", "--help", cwd=Path.cwd())
    assert result.returncode == 0, result.stderr
    entries: dict[str, str] = {}  # option -> its help, wrapping undone
    option = ""
    for line in result.stdout.splitlines():
        if match := re.match(r"^\s+(--[a-z-]+)", line):
            option = match.group(1)
        if option:
            entries[option] = entries.get(option, "") + " " + line.strip()
    defaults = RunConfig()
    options = {f.name: "--" + f.name.replace("_", "-") for f in fields(RunConfig)} | {"archs": "--arch"}
    missing = [
        f"{options[f.name]} [{shown(getattr(defaults, f.name))}]"
        for f in fields(RunConfig)
        if f.name not in NOT_SHOWN
        and f"[{shown(getattr(defaults, f.name))}]" not in " ".join(entries.get(options[f.name], "").split())
    ]
    assert not missing, (missing, sorted(entries))
    assert "[--merge-controls]" in entries["--merge-controls"]
    headline = " ".join(entries["--performance-alpha"].split())  # said in words, where None would be
    assert "[the smallest level of" in headline and "returns a policy in at least 10% of the" in headline
    assert "[no limit]" in entries["--cost-limit"]


def test_experts_show_prints_plain_values_and_the_effective_down_after(tmp_path: Path) -> None:
    env = {"CTD_EXPERTS_FILE": str(tmp_path / "experts.toml")}
    result = run_ctd("experts", "show", "gemma-27b", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert not re.search(r"[(\[{]'", result.stdout), result.stdout  # no tuple, list or dict repr
    assert "base_urls: http://127.0.0.1:8000/v1\n" in result.stdout
    assert "  rpm: unlimited\n" in result.stdout and "  read: 120 s\n" in result.stdout
    assert "  down_after: 128 (default: twice the concurrency, at least 8)\n" in result.stdout
    small = run_ctd("experts", "show", "smollm2", "--json", cwd=tmp_path, env=env)
    assert json.loads(small.stdout)["retry"]["down_after"] == 8  # concurrency 2: at least 8


def test_experts_check_names_a_refused_connection_at_once(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    started = time.monotonic()  # timed in this process: the CLI's imports are not the check
    report = check_expert(pick_expert(None, url, "m"))
    assert time.monotonic() - started < 2 and not report.reachable
    result = run_ctd("experts", "check", "--expert-url", url, "--expert-model", "m", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "connection refused" in result.stderr and "timeout" not in result.stderr.lower()


def test_version() -> None:
    result = run_ctd("--version", cwd=Path.cwd())
    assert result.returncode == 0, result.stderr
    version = re.escape(metadata.version("ctd-harness"))
    assert re.fullmatch(rf"ctd-harness {version}( \(git [0-9a-f]{{12}}\))?\n", result.stdout), result.stdout


def _write_runs(root: Path) -> None:
    """Run folders holding a version-1 log, a version-2 log after a rerun, a newer version and
    a file that is not JSON."""
    record = {"status": "ran", "seconds": 12.5, "detail": "x", "at": "2026-01-02T03:04:05+00:00"}
    config = {"data": [], "model": "smollm2", "expert": "smollm2"}
    old = root / "old"
    old.mkdir(parents=True)
    (old / "run.json").write_text(
        json.dumps(
            {
                "created": "2026-01-01T00:00:00+00:00",
                "version": 1,
                "config": config,
                "stages": {"probe": record, "report": record},
            }
        )
    )
    log = RunLog()
    log.started(config)
    log.record("probe", StageStatus.RAN, 30.0, "probe ran")
    log.record("query", StageStatus.INTERRUPTED, 4.0, "")
    log.started(config)
    log.record("probe", StageStatus.SKIPPED, 0.0, "up to date")
    (root / "new").mkdir()
    log.write(root / "new" / "run.json")
    (root / "future").mkdir()
    (root / "future" / "run.json").write_text(json.dumps({"created": "x", "version": RUN_LOG_VERSION + 1}))
    (root / "broken").mkdir()
    (root / "broken" / "run.json").write_text("{not json")
    (root / "cache").mkdir()  # the shared caches live beside the runs: not a run


def test_runs_lists_every_shape_of_run_log(tmp_path: Path) -> None:
    _write_runs(tmp_path / "runs")
    result = run_ctd("runs", "--json", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    runs = {r["name"]: r for r in json.loads(result.stdout)["runs"]}
    assert set(runs) == {"old", "new", "future", "broken"}
    assert runs["old"]["status"] == "done" and runs["old"]["invocations"] == 1
    assert runs["old"]["data"] == "built-in" and runs["old"]["stages"]["probe"]["seconds"] == 12.5
    # The rerun skipped the probe stage: its record is still the one that ran, in 30 s.
    assert runs["new"]["invocations"] == 2 and runs["new"]["stages"]["probe"]["seconds"] == 30.0
    assert runs["new"]["status"] == "incomplete"  # the latest invocation stopped after the probe
    assert runs["future"]["status"] == runs["broken"]["status"] == "unreadable"
    assert "newer ctd-harness" in runs["future"]["problem"]
    table = run_ctd("runs", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, env={"COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    # The query stage's latest work was interrupted, in the first invocation.
    assert re.search(r"interrupted \d\d-\d\d \d\d:\d\d 4\.0s", table.stdout), table.stdout
    assert "01-02 03:04 12.5s" in table.stdout and "not a readable run log" in table.stdout


def test_runs_and_report_from_another_folder_say_where_they_looked(tmp_path: Path) -> None:
    """Run from a folder without runs/ (the likeliest mistake): the whole path looked at and how
    to name the runs folder, where `ctd runs` said "no runs under runs"; a run's long name in a
    narrow terminal is on one line, as the other commands take it."""
    listed = run_ctd("runs", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert f"no runs folder at {tmp_path / 'runs'}" in listed.stdout and "--runs-dir" in listed.stdout
    report = run_ctd("report", "demo", cwd=tmp_path)
    assert_one_line_error(report, f"no such run folder ({tmp_path / 'runs' / 'demo'})", "$CTD_RUNS_DIR")
    long_name = tmp_path / "runs" / "smollm2-smollm2-builtin-limit40"
    _write_runs(tmp_path / "runs")
    (tmp_path / "runs" / "old").rename(long_name)
    table = run_ctd("runs", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, env={"COLUMNS": "80"})
    assert long_name.name in table.stdout, table.stdout


def test_run_log_keeps_the_record_of_the_invocation_that_did_the_work(tmp_path: Path) -> None:
    log = RunLog()
    log.started({})
    log.record("query", StageStatus.RAN, 100.0, "104 scored")
    log.started({})
    log.record("query", StageStatus.SKIPPED, 0.0, "up to date")
    log.write(tmp_path / "run.json")
    again = RunLog.read(tmp_path / "run.json")
    assert [i.stages["query"].status for i in again.invocations] == [StageStatus.RAN, StageStatus.SKIPPED]
    assert again.stages["query"].seconds == 100.0
    assert json.loads((tmp_path / "run.json").read_text())["stages"]["query"]["detail"] == "104 scored"
    (tmp_path / "run.json").write_text(json.dumps({"created": "x", "version": RUN_LOG_VERSION + 1}))
    with pytest.raises(RunLogError, match="newer"):
        RunLog.read(tmp_path / "run.json")


def test_eval_refuses_a_run_log_it_cannot_read_before_writing_anything(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "t"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{not json")
    env = {"CTD_RUNS_DIR": str(tmp_path / "runs"), "HF_HUB_OFFLINE": "1"}
    result = run_ctd(
        "eval", "--name", "t", "--expert", "http://127.0.0.1:9/v1", "--expert-model", "m",
        "--budgets", "0.3,0.5", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert_one_line_error(result, "run.json: not a readable run log")
    assert sorted(p.name for p in run.iterdir()) == ["run.json"]


def test_a_bad_progress_interval_is_one_line(tmp_path: Path) -> None:
    result = run_ctd("eval", cwd=tmp_path, env={"CTD_PROGRESS_INTERVAL": "soon"})
    assert_one_line_error(result, "$CTD_PROGRESS_INTERVAL='soon'", "seconds")


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll until `condition` holds (a loaded machine's ticker and redraws come late), or fail."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not shown in time"
        time.sleep(0.05)


def test_plain_progress_prints_at_a_steady_interval_and_never_cuts_lines() -> None:
    """The lines come from a ticker every `interval`, not only at the end: three show the expert
    at work before it is done. Waits are polls with a deadline and the seconds shown any number
    (fixed sleeps and "0s so far" failed on a loaded machine)."""
    out = io.StringIO()
    console = Console(file=out, width=80, soft_wrap=True)  # a file: not a terminal
    assert not console.is_terminal
    detail = "cached 0  in flight 16  retries 0  429s 0  failed 0  " * 3

    def expert_lines() -> list[str]:
        return [line for line in out.getvalue().splitlines() if " expert: " in line]

    with StageProgress(console, interval=0.2) as progress:
        progress.stage_started("query")
        wait_for(lambda: "so far" in out.getvalue())  # no progress reported yet: the stage is named
        for done in range(0, 10):
            progress("expert", done, 10, detail)
            time.sleep(0.1)
        wait_for(lambda: len(expert_lines()) >= 3)
        progress("expert", 10, 10, detail)
        wait_for(lambda: " 10/10 (100%) " in out.getvalue())
        progress.print("[bold]query[/bold] done in 1.5 s: 10 scored")
    lines = out.getvalue().splitlines()
    assert re.match(r"\d\d:\d\d:\d\d query: started$", lines[0]), lines
    assert re.match(r"\d\d:\d\d:\d\d query: working, \d+s so far$", lines[1]), lines
    expert = expert_lines()
    assert len(expert) >= 4 and all(len(line) > 150 for line in expert), lines  # one line each, whole
    assert re.search(r"done in \d+\.\ds$", expert[-1]) and " 10/10 (100%) " in expert[-1]
    assert lines[-1] == "query done in 1.5 s: 10 scored"


def test_live_bars_share_the_console_of_the_stage_lines() -> None:
    out = io.StringIO()
    console = Console(file=out, width=130, force_terminal=True, color_system=None)
    with StageProgress(console) as progress:
        progress("extract train", 5, 10)
        progress.print("[bold]probe[/bold] done in 2.0 s: trained")
        progress("expert", 3, 10, "cached 0")
    text = out.getvalue()
    assert "probe done in 2.0 s: trained" in text
    # The probe's bar was removed with its stage line: the last frame holds the expert bar only.
    last_frame = text.rsplit("probe done in 2.0 s: trained", 1)[1]
    assert "expert" in last_frame and "extract train" not in last_frame


STAGES = ("probe", "query", "dv", "calibrate", "validate", "report")


def test_live_display_names_the_stage_at_work_counts_in_units_and_says_done_in() -> None:
    """In a terminal: the status row says what the run checks before its stages, then the stage
    at work with its counter and slow step; bars count in their unit; a finished bar reads
    "done in", never rich's 0:00:00; a stage line keeps its counter."""
    out = io.StringIO()
    console = Console(file=out, width=150, force_terminal=True, color_system=None)

    def frame_showing(pattern: str) -> str:
        """The last frame drawn, polled until it shows `pattern` (or 20 s: the asserts then say
        what it shows); a loaded machine redraws late (fixed sleeps failed there)."""
        deadline = time.monotonic() + 20
        while True:
            frame = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue()).split("\r")[-1]
            if re.search(pattern, frame) or time.monotonic() > deadline:
                return frame
            time.sleep(0.05)

    with StageProgress(console) as progress:
        progress.status("ctd eval t: checking the data, the model and the expert")
        shown = [frame_showing("checking the data")]
        progress.plan("ctd eval t: 6 stages (probe, ...) in runs/t", STAGES)
        progress.stage_started("probe")
        progress.step("loading the monitored model smollm2")
        shown.append(frame_showing("loading the monitored model"))
        progress("extract train", 0, 2237, unit="tokens")
        time.sleep(0.2)
        progress("extract train", 2237, 2237, unit="tokens")
        progress("extract dev", 0, 2995, unit="tokens")
        shown.append(frame_showing(r"(?s)done in .*extract dev"))  # both bars drawn
        progress.print(f"{progress.counter('probe')}[bold]probe[/bold] done in 1.2s: trained")
    assert "ctd eval t: checking the data, the model and the expert" in shown[0], shown[0]
    assert re.search(r"\[1/6\] probe .*loading the monitored model smollm2", shown[1]), shown[1]
    assert re.search(r"extract train .* 2,237/2,237 tokens +done in \d+\.\ds", shown[2]), shown[2]
    assert re.search(r"extract dev .* 0/2,995 tokens", shown[2]) and "0:00:00" not in shown[2], shown[2]
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "\rctd eval t: 6 stages (probe, ...) in runs/t\n" in text
    assert "[1/6] probe done in 1.2s: trained" in text
    assert "checking the data" not in text.rsplit("[1/6] probe done", 1)[1]  # the status row went


def test_plain_display_logs_stage_starts_and_steps_but_not_the_checks_status() -> None:
    """With output to a file: no status line before the stages (a run its checks refuse prints
    only its error), then the header, a time-stamped line at each stage's start and slow step,
    bars' lines with their unit; with enabled=False, nothing at all."""
    out = io.StringIO()
    with StageProgress(Console(file=out, width=80, soft_wrap=True), interval=60) as progress:
        progress.status("ctd eval t: checking the data, the model and the expert")
        progress.plan("ctd eval t: 6 stages", STAGES)
        progress.stage_started("query")
        progress.step("starting a local llama.cpp server for smollm2")
        progress("expert", 4, 4, unit="examples")
        progress.print(f"{progress.counter('query')}query done in 0.5s: 4 scored")
    lines = out.getvalue().splitlines()
    assert lines[0] == "ctd eval t: 6 stages", lines
    assert re.fullmatch(r"\d\d:\d\d:\d\d \[2/6\] query: started", lines[1]), lines
    assert re.fullmatch(r"\d\d:\d\d:\d\d \[2/6\] query: starting a local llama.cpp server for \w+", lines[2])
    assert re.fullmatch(r"\d\d:\d\d:\d\d expert: 4/4 examples \(100%\)  done in \d\.\ds", lines[3]), lines
    assert lines[4:] == ["[2/6] query done in 0.5s: 4 scored"], lines

    silent = io.StringIO()
    console = Console(file=silent, force_terminal=True)
    with StageProgress(console, enabled=False) as progress:
        progress.status("checking")
        progress.plan("header", STAGES)
        progress.stage_started("probe")
        progress.step("loading")
        progress("extract train", 1, 1, unit="tokens")
        progress.print("probe done")
    assert silent.getvalue() == ""


def test_an_unquoted_data_spec_says_how_to_give_it(tmp_path: Path) -> None:
    """`--data train=A dev=B` unquoted, as the spec reads in the docs: the shell's second word is
    an extra argument, and the line says how to give the spec; a command without --data does not."""
    result = run_ctd("eval", "--data", "train=a.jsonl", "dev=b.jsonl", cwd=tmp_path)
    assert_one_line_error(result, "(dev=b.jsonl)", "one quoted word", "--data for each")
    other = run_ctd("runs", "x=y", cwd=tmp_path)
    assert_one_line_error(other, "(x=y)")
    assert "quoted" not in other.stderr
