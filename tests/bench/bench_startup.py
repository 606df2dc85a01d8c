"""Benchmark of the command line's start-up (run by hand, not in CI):

    python tests/bench/bench_startup.py [--repeats 10] [--code DIR]

Runs each command as a process, the way a user types it (the `ctd` console script beside this
interpreter, else `python -m harness.cli`), `--repeats` times after one untimed warm-up run, and
reports the minimum, median and maximum wall clock, the median CPU time (user + system) and the
peak resident memory of the process (from `os.wait4`'s resource usage of that child, the
per-process form of getrusage(RUSAGE_CHILDREN)):

- `ctd --help` and `ctd calibrate --help`: target under 0.5 s;
- `ctd calibrate --scores T --out D` on a 3-seed table of 1,600 test rows per seed (written once
  by `ctd simulate --scenario weak --n 1600 --seeds 3`): target under 2 s;
- `ctd query --help`: target no torch (what it imports is checked by tests/harness/test_imports.py).

`--code DIR` puts DIR first on PYTHONPATH, to time another checkout of the project (e.g. the
commit before a change) side by side with this one. On a shared machine the minimum is the least
noisy wall-clock figure (other processes only ever add time) and the CPU time, which waiting for
the cores does not inflate, is the closest to a quiet machine's wall clock. The load average is
printed with the table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]
    target: str


@dataclass(frozen=True)
class Measured:
    seconds: list[float]
    cpu_seconds: list[float]  # user + system
    peak_rss_mb: float  # the largest of the runs


def ctd_command() -> list[str]:
    script = Path(sys.executable).with_name("ctd")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "harness.cli"]


def run_once(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS in MB) of one process."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        stderr = process.stderr.read().decode() if process.stderr else ""
        raise SystemExit(f"{' '.join(command)} exited with {process.returncode}: {stderr[-500:]}")
    if process.stderr:
        process.stderr.close()
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # ru_maxrss: KiB on Linux


def measure(case: Case, repeats: int, env: dict[str, str], work: Path) -> Measured:
    seconds, cpu, peaks = [], [], []
    for attempt in range(repeats + 1):
        args = [a.replace("{out}", str(work / f"cal-{attempt}")) for a in case.args]
        wall, cpu_time, peak = run_once([*ctd_command(), *args], env, work)
        shutil.rmtree(work / f"cal-{attempt}", ignore_errors=True)
        if attempt:  # the first run warms the file cache and is not counted
            seconds.append(wall)
            cpu.append(cpu_time)
            peaks.append(peak)
    return Measured(seconds, cpu, max(peaks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--code", type=Path, help="a checkout to time instead of the installed one")
    options = parser.parse_args()
    env = dict(os.environ)
    if options.code:
        paths = [str(options.code.resolve()), env.get("PYTHONPATH")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    with tempfile.TemporaryDirectory(prefix="ctd-bench-startup-") as folder:
        work = Path(folder)
        table = work / "scores.parquet"
        simulate = ("simulate", "--scenario", "weak", "--n", "1600", "--seeds", "3", "--out", str(table))
        run_once([*ctd_command(), *simulate], env, work)
        cases = [
            Case("ctd --help", ("--help",), "< 0.5 s"),
            Case("ctd calibrate --help", ("calibrate", "--help"), "< 0.5 s"),
            Case(
                "ctd calibrate (3 seeds x 1,600 test rows)",
                ("calibrate", "--scores", str(table), "--out", "{out}"),
                "< 2 s",
            ),
            Case("ctd query --help", ("query", "--help"), "no torch"),
        ]
        load_before = os.getloadavg()
        results = {case.name: measure(case, options.repeats, env, work) for case in cases}
        load_after = os.getloadavg()
    code = options.code or "the installed project"
    print(f"code: {code}; command: {' '.join(ctd_command())}; {options.repeats} runs each after a warm-up")
    print(f"load average (1, 5, 15 min): before {load_before}, after {load_after}; cores: {os.cpu_count()}")
    print("| command | min | median | max | CPU (median) | peak RSS | target |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for case in cases:
        m = results[case.name]
        print(
            f"| `{case.name}` | {min(m.seconds):.2f} s | {statistics.median(m.seconds):.2f} s "
            f"| {max(m.seconds):.2f} s | {statistics.median(m.cpu_seconds):.2f} s | {m.peak_rss_mb:.0f} MB "
            f"| {case.target} |"
        )


if __name__ == "__main__":
    main()
