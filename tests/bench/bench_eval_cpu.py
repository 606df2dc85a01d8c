"""`ctd eval`'s own CPU costs, the part of its wall time a GPU cannot shorten (run by hand, not in CI):

    python tests/bench/bench_eval_cpu.py --baseline SRC [--data DIR] [--limit N] [--rounds 3]

On the third GPU session `ctd eval` of the MUP files kept the GPU busy in 40% of its wall time:
what is not GPU work there is Python's (imports, the interpreter's collector, calibration,
validation, the report), and it is the same on any machine. This runs the real command line
(`python -c "...main()" eval`) on the McKenzie-format files of DIR (default ../shared/data/mup)
with `bench_gpu.py`'s tiny stand-in model (2 layers of width 64: the probe stage is short, the
rest is as with a 1B model) and a local fault-free stand-in expert (tests/fault_server.py), by
URL, so the query stage runs beside the probe stage. With `--baseline SRC` (a source tree such as
`git archive REV | tar -x -C SRC`) the same runs against that code, first on PYTHONPATH, the two
alternating `--rounds` times after a short warm-up run of each (bytecode); each run has its own
runs folder, expert cache and activation store.

Prints, per run: the wall time; the stages' seconds from log.txt (the query stage is beside the
probe stage and not counted); "outside", the wall time no stage accounts for (the interpreter's
start, imports, the data, the exit); and "exit", from the command's last line of output to the
end of its process. Stops if two runs' scores, sweep or validation tables differ (by sha256).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "bench"), str(ROOT / "tests")]

from bench_eval_overlap import tables  # noqa: E402
from bench_gpu import build_model  # noqa: E402
from fault_server import RunningServer  # noqa: E402

STAGES = ("probe", "dv", "calibrate", "validate", "report")
ENTRY = "from harness.cli import main; main()"


@dataclass(frozen=True)
class RunResult:
    wall: float  # seconds from the start of the process to its end
    stages: dict[str, float]  # each stage's seconds, from log.txt
    outside: float  # the wall time no stage accounts for
    exit: float  # from the command's last line of output to the end of its process
    tables: dict[str, str]  # the computed tables' sha256


def one_run(tree: Path | None, model: Path, data: Path, limit: int | None, url: str) -> RunResult:
    """One `ctd eval` of `tree`'s code (None: this checkout's), in a folder of its own, removed after."""
    work = Path(tempfile.mkdtemp(prefix="bench-eval-cpu-"))
    try:
        return _timed_eval(work, tree or ROOT, model, data, limit, url)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _timed_eval(work: Path, source: Path, model: Path, data: Path, limit: int | None, url: str) -> RunResult:
    train = sorted((data / "training").glob("*.jsonl"))
    dev = ",".join(f"{p.stem.split('_')[0]}:{p}" for p in sorted((data / "dev").glob("*.jsonl")))
    rows = ["--limit", str(limit), "--budgets", "0.9"] if limit else []  # few rows certify large budgets only
    command = [
        sys.executable, "-c", ENTRY, "eval", "--name", "bench", "--runs-dir", str(work / "runs"),
        "--model", str(model), "--data", f"train={train[0]}", "--data", f"dev={dev}",
        "--expert", url, "--expert-model", "fault-model", "--serve", "never", *rows, "--json",
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(source), os.environ.get("PYTHONPATH", "")]),
        "CTD_CACHE": str(work / "cache.sqlite"),
        "CTD_STORE": str(work / "store"),
    }
    with (work / "stderr.txt").open("w+") as stderr:  # a file: a pipe read after stdout could fill
        started = time.perf_counter()
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            cwd=source,  # `python -c` puts its folder first on sys.path, ahead of PYTHONPATH
        )
        last_line = started
        assert process.stdout is not None
        for _ in process.stdout:
            last_line = time.perf_counter()
        process.wait()
        ended = time.perf_counter()
        if process.returncode != 0:
            stderr.seek(0)
            raise SystemExit(
                f"bench_eval_cpu: the eval failed (exit {process.returncode}):\n{stderr.read()[-3000:]}"
            )
    run = work / "runs" / "bench"
    log = (run / "log.txt").read_text()
    finished = {name: re.search(rf"{name}: finished in ([0-9.]+) s", log) for name in STAGES}
    stages = {name: float(m.group(1)) for name, m in finished.items() if m}
    wall = ended - started
    return RunResult(wall, stages, wall - sum(stages.values()), ended - last_line, tables(run))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", type=Path, default=None, help="a source tree to compare with")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "mup")
    parser.add_argument("--limit", type=int, default=None, help="rows per file (default: all)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = Path(tempfile.mkdtemp(prefix="bench-eval-cpu-model-")) / "tiny"
    build_model(model, None, tiny=True, device="cpu")
    trees: dict[str, Path | None] = {"this code": None}
    if args.baseline is not None:
        trees = {"baseline": args.baseline.resolve(), **trees}
    results: dict[str, list[RunResult]] = {name: [] for name in trees}
    reference: dict[str, str] | None = None
    with RunningServer() as expert:
        for tree in trees.values():  # bytecode, and the model's file hashes
            one_run(tree, model, args.data, 64, expert.url)
        for round_ in range(1, args.rounds + 1):
            for name, tree in trees.items():
                result = one_run(tree, model, args.data, args.limit, expert.url)
                if reference is None:
                    reference = result.tables
                elif result.tables != reference:
                    raise SystemExit(f"bench_eval_cpu: {name}'s tables differ from the first run's")
                results[name].append(result)
                stages = ", ".join(f"{k} {v:.1f}" for k, v in result.stages.items())
                print(
                    f"{round_}/{args.rounds} {name}: wall {result.wall:.1f} s, outside the stages "
                    f"{result.outside:.1f} s, exit {result.exit:.2f} s ({stages})",
                    flush=True,
                )
    for name, runs in results.items():
        medians = {
            key: statistics.median(getattr(r, key) for r in runs) for key in ("wall", "outside", "exit")
        }
        stages = ", ".join(f"{s} {statistics.median(r.stages.get(s, 0.0) for r in runs):.2f}" for s in STAGES)
        print(
            f"median of {len(runs)}, {name}: wall {medians['wall']:.1f} s, outside the stages "
            f"{medians['outside']:.2f} s, exit {medians['exit']:.2f} s ({stages})"
        )
    print(f"tables: {len(reference or {})} files, the same in every run")


if __name__ == "__main__":
    main()
