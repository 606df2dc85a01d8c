"""`ctd eval` with the query stage beside the probe stage, against one after the other.

    python tests/bench/bench_eval_overlap.py [--delay 0.4] [--rounds 2] [--data SPEC ...]

Each round runs `harness.run_eval` twice on the same data, alternating which goes first: with
the expert asked while the probe stage works (the default) and with `overlap=False`. Each run has
a runs root and an expert cache of its own, and the expert is a local fault-free stand-in
(tests/fault_server.py) answering each request after `--delay` seconds, as a remote endpoint
would; the activation store is shared (a first, unmeasured run, one stage after the other, fills
it), so both sides load the model and train the same probes. Prints each run's wall time and
stage seconds, and the ratio; stops if a run's scores, sweep or validation tables differ from the
first run's (by sha256).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fault_server import FaultPlan, RunningServer  # noqa: E402

from harness import run_eval  # noqa: E402
from harness.run import load_run_config  # noqa: E402


def tables(run: Path) -> dict[str, str]:
    """sha256 of each table the run computed: the scores, every sweep and validation table."""
    found = [run / "scores.parquet", *sorted((run / "calibrate").rglob("*.parquet"))]
    found += sorted((run / "validate").rglob("*.parquet"))
    return {str(path.relative_to(run)): hashlib.sha256(path.read_bytes()).hexdigest() for path in found}


def one_run(
    url: str, data: list[str] | None, store: Path, overlap: bool, name: str
) -> tuple[float, dict, dict[str, str]]:
    work = Path(tempfile.mkdtemp(prefix="bench-overlap-"))
    try:
        config = load_run_config(
            None,
            {
                "name": name,
                "data": tuple(data) if data else None,
                "expert": url,
                "expert_model": "fault-model",
                "serve": "never",
            },
        )
        os.environ["CTD_STORE"] = str(store)
        os.environ["CTD_CACHE"] = str(work / "experts.sqlite")
        started = time.perf_counter()
        result = run_eval(config, runs_root=work / "runs", overlap=overlap)
        wall = time.perf_counter() - started
        return wall, {o.stage: round(o.seconds, 1) for o in result.stages}, tables(result.run_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--delay", type=float, default=0.4, help="seconds the expert takes per answer")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data", action="append", help="a --data token of `ctd eval` (default: built in)")
    args = parser.parse_args()
    store = Path(tempfile.mkdtemp(prefix="bench-overlap-store-"))
    walls: dict[bool, list[float]] = {True: [], False: []}
    with RunningServer(FaultPlan(delay=args.delay)) as server:
        _, _, first = one_run(server.url, args.data, store, False, "warm")  # fills the store (not measured)
        for round_ in range(args.rounds):
            for overlap in (True, False) if round_ % 2 == 0 else (False, True):
                wall, stages, computed = one_run(server.url, args.data, store, overlap, f"r{round_}")
                walls[overlap].append(wall)
                if computed != first:
                    raise SystemExit(f"round {round_ + 1}: the tables differ from the first run's")
                side = "beside" if overlap else "after "
                print(f"round {round_ + 1}, query {side}: {wall:6.1f} s  {stages}", flush=True)
    shutil.rmtree(store, ignore_errors=True)
    beside, after = statistics.median(walls[True]), statistics.median(walls[False])
    print(f"the {len(first)} tables (scores, sweeps, validation) were identical in every run")
    ratio = after / beside
    print(f"median wall: query beside the probe stage {beside:.1f} s, after it {after:.1f} s: {ratio:.2f}x")


if __name__ == "__main__":
    main()
