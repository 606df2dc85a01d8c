"""Wall time and peak memory of `ctd calibrate` and `ctd report` at scale (run by hand, not in CI):

    python tests/bench/bench_decisions_scale.py [--n 100000] [--seeds 3] [--work DIR]

A simulated run (`ctd simulate --scenario strong`, --n test rows per seed, 2,000 dev rows) is
swept with `ctd calibrate --out RUN/calibrate/simulated` and reported with `ctd report`, each
in its own process; each step's wall seconds and peak resident memory (its own `ru_maxrss`) are
printed. The sweep's per-example decisions (decisions.parquet: one row per policy, budget, seed
and evaluation example: 37 million rows at --n 100000) are what scale: written one mask group at
a time, and read by the report through a filter.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Runs the CLI in this process's interpreter and reports its own peak memory on stderr.
STEP = """
import resource, sys
from harness.cli import main
sys.argv = ["ctd", *sys.argv[1:]]
try:
    main()
finally:
    print(f"maxrss_kb {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", file=sys.stderr)
"""


def step(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, peak GB) of `ctd ARGS` in a fresh process; a failure stops the bench."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", STEP, *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"ctd {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    peak = [line for line in done.stderr.splitlines() if line.startswith("maxrss_kb ")][-1]
    return wall, int(peak.split()[1]) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="test rows per seed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None, help="default: a new temporary folder")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-decisions-"))
    run = work / "runs" / "big"
    run.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CTD_RUNS_DIR": str(work / "runs")}
    scores = run / "scores.parquet"
    simulate = ["simulate", "--scenario", "strong", "--n", str(args.n), "--n-dev", "2000"]
    steps = {
        "simulate": [*simulate, "--seeds", str(args.seeds), "--out", str(scores)],
        "calibrate": ["calibrate", "--scores", str(scores), "--out", str(run / "calibrate" / "simulated")],
        "report": ["report", "big"],
    }
    print(f"{args.n} test rows x {args.seeds} seeds in {work}")
    for name, ctd_args in steps.items():
        wall, peak = step(ctd_args, env)
        print(f"  {name:9s} {wall:7.1f} s, peak {peak:5.2f} GB", flush=True)
    decisions = run / "calibrate" / "simulated" / "decisions.parquet"
    print(f"  decisions.parquet: {decisions.stat().st_size / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
