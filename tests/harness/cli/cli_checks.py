"""Helpers shared by the `ctd` command-line tests (simulate, calibrate, validate): the app run in
process and as the real console script, and checks of a clean run and of a clean one-line error."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from harness.cli import app

runner = CliRunner()

SUMMARY_KEYS = {
    "trials",
    "violation_rate",
    "violation_ci95",
    "selection_rate",
    "selection_ci95",
    "mean_realised_budget",
    "mean_accuracy",
}
SWEEP_KEYS = ("seed", "policy", "merge", "objective", "budget", "batch_size", "auroc", "accuracy", "realised")
LTT_KEYS = {"threshold", "certified", "pvalues", "k", "n", "kstar", "order", "stopped_at"}
FAST_VALIDATE = ("--trials", "20")
FAST_CALIBRATE = ("--budgets", "0.2,0.5", "--batch-sizes", "32", "--policies", "ctd,dv-topk")
# What `ctd calibrate` writes into its output folder, sorted.
CALIBRATE_FILES = [
    "baselines.csv",
    "decisions.parquet",
    "groups.csv",
    "ltt.jsonl",
    "summary.json",
    "sweep.csv",
]


def ctd(*args: object, env: dict[str, str] | None = None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def ctd_process(*args: object) -> subprocess.CompletedProcess[str]:
    """The real console script, in a fresh interpreter."""
    exe = shutil.which("ctd")
    command = [exe] if exe else [sys.executable, "-c", "from harness.cli import main; main()"]
    return subprocess.run(
        [*command, *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


def assert_ok(result) -> None:
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.exception is None
    assert "Traceback" not in result.output


def assert_clean_error(result, *fragments: str, unwritten: tuple[Path, ...] = ()) -> str:
    """Exit code 2, exactly one stderr line 'error: ...' containing every fragment (a regex with
    word boundaries, so 'line 12' does not match 'line 125'), no traceback, nothing written."""
    assert result.exit_code == 2, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit)  # a clean exit, not a crash
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    message = lines[0]
    assert message.startswith("error: "), message
    for fragment in fragments:
        assert re.search(rf"(?<!\w){re.escape(fragment)}(?!\w)", message), (fragment, message)
    for path in unwritten:
        assert not path.exists(), f"{path} was written despite the error"
    return message


def one_json_object(result) -> dict:
    assert_ok(result)
    assert result.stderr == ""
    text = result.stdout
    assert text.endswith("\n") and text.count("\n") == 1, text
    value = json.loads(text)
    assert isinstance(value, dict)
    return value


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def copy(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A writable copy; string columns become object arrays so any new value fits."""
    return {k: v.astype(object) if v.dtype.kind == "U" else v.copy() for k, v in columns.items()}


def where(fmt: str, index: int) -> str:
    """How an error names 0-based data row `index`: CSV physical line (header = 1), Parquet row."""
    return f"line {index + 2}" if fmt == "csv" else f"row {index + 1}"


def check_summary(summary: dict, trials: int) -> None:
    assert set(summary) >= SUMMARY_KEYS
    assert summary["trials"] == trials
    lo, hi = summary["violation_ci95"]
    assert 0 <= lo <= summary["violation_rate"] <= hi <= 1
    lo, hi = summary["selection_ci95"]
    assert 0 <= lo <= summary["selection_rate"] <= hi <= 1


ROW = 123  # planted defects sit in data row 123 (0-based), inside seed 0's test split


def bad_input_commands(tmp_path: Path, path: Path) -> dict[str, tuple[list[object], tuple[Path, ...]]]:
    trials, folder = tmp_path / "trials.csv", tmp_path / "cal"
    return {
        "validate": (["validate", "--scores", path, *FAST_VALIDATE, "--out", trials], (trials,)),
        "calibrate": (["calibrate", "--scores", path, "--out", folder, *FAST_CALIBRATE], (folder,)),
    }


def assert_process_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert proc.stderr.endswith("\n") and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: ")
    for fragment in fragments:
        assert fragment in proc.stderr, (fragment, proc.stderr)
    return proc.stderr
