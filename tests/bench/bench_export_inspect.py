"""Wall time and peak memory of `ctd export inspect` (run by hand, not in CI; needs the inspect extra):

    python tests/bench/bench_export_inspect.py [--n 100000] [--seeds 3] [--single 2500,5000,10000]

A simulated run (`ctd simulate --scenario strong`, --n test rows per seed, 2,000 dev rows) is
swept with `ctd calibrate --run` and exported at three budgets with the default --samples-per-log
(logs in parts, one worker process per CPU up to 8). Then, on runs of the --single sizes (samples:
test rows x seeds), each exported as one log (--samples-per-log above its size) and in parts of
2,500, side by side: inspect_ai's writer slows with the square of a log's samples. Each export runs
in its own process; printed: wall seconds, the exporting process's peak resident memory and the
largest resident memory seen in one of its worker processes (sampled every 0.2 s).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_decisions_scale import STEP  # the CLI in a fresh interpreter, with its peak memory

BUDGETS = "0.1,0.2,0.3"
PAGE = os.sysconf("SC_PAGE_SIZE")


def largest_descendant(pid: int) -> int:
    """The largest resident set (bytes) among the processes below `pid` now (Linux /proc)."""
    parents, rss = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            statm = (stat.parent / "statm").read_text().split()
        except OSError:  # gone meanwhile
            continue
        child = int(stat.parent.name)
        parents[child], rss[child] = int(fields[1]), int(statm[1]) * PAGE
    below, frontier = set(), {pid}
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier} - below
        below |= frontier
    return max((rss[c] for c in below), default=0)


def step(args: list[str], env: dict[str, str]) -> tuple[float, float, float, str]:
    """(wall seconds, own peak GB, largest worker's resident GB seen, stdout) of `ctd ARGS` in a
    fresh process; its workers' memory sampled every 0.2 s."""
    started = time.perf_counter()
    command = [sys.executable, "-c", STEP, *args]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = 0
    answer: list[tuple[str, str]] = []
    reader = threading.Thread(target=lambda: answer.append(process.communicate()))
    reader.start()
    while reader.is_alive():
        seen = max(seen, largest_descendant(process.pid))
        reader.join(0.2)
    wall = time.perf_counter() - started
    out, err = answer[0]
    if process.returncode != 0:
        raise SystemExit(f"ctd {' '.join(args)} failed:\n{err[-2000:]}")
    line = [x for x in err.splitlines() if x.startswith("maxrss_kb ")][-1]
    return wall, int(line.split()[1]) / 1e6, seen / 1e9, out


def make_run(work: Path, name: str, n: int, seeds: int) -> dict[str, str]:
    """A swept simulated run `name` under work/runs; the environment that finds it."""
    env = {**os.environ, "CTD_RUNS_DIR": str(work / "runs")}
    run = work / "runs" / name
    run.mkdir(parents=True, exist_ok=True)
    simulate = ["simulate", "--scenario", "strong", "--n", str(n), "--n-dev", "2000", "--seeds", str(seeds)]
    step([*simulate, "--out", str(run / "scores.parquet")], env)
    step(["calibrate", "--run", name, "--budgets", BUDGETS], env)
    return env


def export(name: str, env: dict[str, str], samples_per_log: int | None) -> None:
    args = ["export", "inspect", name, "--budgets", BUDGETS, "--force"]
    if samples_per_log is not None:
        args += ["--samples-per-log", str(samples_per_log)]
    wall, own, workers, out = step(args, env)
    logs = out.split()
    size = sum(Path(p).stat().st_size for p in logs) / 1e6
    how = "default" if samples_per_log is None else f"--samples-per-log {samples_per_log}"
    print(
        f"  {how:28s} {len(logs):3d} logs, {size:6.0f} MB: {wall:7.1f} s, peak {own:5.2f} GB, "
        f"largest worker {workers:5.2f} GB",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="large run's test rows per seed, 0: none")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--single", default="2500,5000,10000", help="samples of the side-by-side runs")
    parser.add_argument("--work", type=Path, default=None, help="default: a new temporary folder")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-export-"))
    print(f"in {work}; {os.cpu_count()} CPUs")
    for samples in (int(s) for s in args.single.split(",") if s):
        name = f"single-{samples}"
        env = make_run(work, name, samples // args.seeds, args.seeds)
        print(f"{samples // args.seeds} test rows x {args.seeds} seeds:")
        export(name, env, samples + 1)  # one log
        export(name, env, 2_500)
    if args.n > 0:
        env = make_run(work, "large", args.n, args.seeds)
        print(f"{args.n} test rows x {args.seeds} seeds:")
        export("large", env, None)


if __name__ == "__main__":
    main()
