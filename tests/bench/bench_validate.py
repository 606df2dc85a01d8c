"""Benchmark of `ctd eval`'s validate stage (run by hand, not in CI):

    python tests/bench/bench_validate.py [--repeats 5]

The stage validates, per probe configuration, budget control at every budget of the run (Pareto
and budget-only LTT) and performance control at every error level (against the empirical
selector), 500 trials each, and writes the JSON records and per-trial tables the report reads.
Timed here exactly as `ctd eval` runs it (`harness.stages._validate.run_job` for every job, files
included) on simulated tables of three sizes: the embedded default's test split (160 rows per
seed), the McKenzie example's (898) and the held-out tables of the issue (1,586); 3 seeds and one
probe configuration, as the default run has. Target: the default run's whole validation under
10 s on 2 cores.

Side by side in the same run: the same jobs at one level each (what the stage did before it
validated every level), to show what the levels cost.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from timing import timings

import harness
from harness import RunConfig
from harness.run import JOBS

# Private: the validation jobs, timed one by one.
from harness.stages._validate import run_job

DEFAULT = RunConfig()  # the levels and headline levels of the default run
BUDGETS = DEFAULT.budgets
ERROR_LEVELS = DEFAULT.performance_alphas
HEADLINE = {"budget": DEFAULT.budget_alpha, "performance": DEFAULT.performance_alpha}


def stage(scores: Path, folder: Path, *, every_level: bool) -> None:
    for job in JOBS:
        levels = {"budget": BUDGETS, "performance": ERROR_LEVELS}[job.mode] if every_level else ()
        run_job(
            scores,
            folder,
            job,
            arch="simulated",
            alphas=levels,
            headline_alpha=HEADLINE[job.mode],
            config=DEFAULT.validation_config,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print("| test rows per seed (3 seeds) | levels | min | median | max |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (160, 898, 1586):
            scores = harness.simulate("weak", n, 3, Path(tmp) / f"scores-{n}.parquet")
            for every_level in (True, False):
                folder = Path(tmp) / f"validate-{n}-{every_level}"
                folder.mkdir()
                times = timings(
                    lambda s=scores, f=folder, e=every_level: stage(s, f, every_level=e), args.repeats
                )
                levels = (
                    f"{len(BUDGETS)} budgets x 2 + {len(ERROR_LEVELS)} error levels"
                    if every_level
                    else "1 per job"
                )
                low, middle, high = min(times), statistics.median(times), max(times)
                print(f"| {n} | {levels} | {low:.2f} s | {middle:.2f} s | {high:.2f} s |")


if __name__ == "__main__":
    main()
