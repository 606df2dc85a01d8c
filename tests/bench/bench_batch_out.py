"""`ctd query --batch-out` at scale (run by hand, not in CI; 127.0.0.1 only, nothing is sent):

    python tests/bench/bench_batch_out.py [--items 100000] [--baseline SRC] [--rounds 2]

Writes `--items` distinct conversations and a registry entry for a stand-in expert (never asked:
a batch file sends nothing), then times, in a fresh cache each round, the first `--batch-out` (every
request written, and since the batch-out record, each recorded as out in the cache) and a second
one on the same data (with the record: every request left out as still out; before it, every
request written again). With `--baseline SRC` (a source tree, such as `git archive REV | tar -x -C
SRC`) the same runs against that code, alternating. Prints the wall times, the lines each wrote,
and the cache's size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENTRY = "from harness.cli import main; main()"


def batch_out(source: Path, work: Path, name: str) -> tuple[float, dict]:
    """(wall seconds, --json summary) of one `ctd query --batch-out` run from the tree `source`."""
    command = [sys.executable, "-c", ENTRY, "query", "--data", str(work / "data.jsonl"),
               "--expert", "stand-in", "--batch-out", str(work / name), "--json"]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(source), os.environ.get("PYTHONPATH", "")]),
        "CTD_CACHE": str(work / "cache.sqlite"),
        "CTD_EXPERTS_FILE": str(work / "experts.toml"),
    }
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=source)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(
            f"bench_batch_out: --batch-out failed (exit {done.returncode}):\n{done.stderr[-2000:]}"
        )
    return wall, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--baseline", type=Path, help="a source tree to compare with")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-batch-out-"))
    try:
        data = scratch / "data.jsonl"
        with data.open("w") as handle:
            for i in range(args.items):
                handle.write(json.dumps({"ids": f"ex{i}", "inputs": f"item-{i}: is this risky?"}) + "\n")
        sides = {"this code": ROOT}
        if args.baseline is not None:
            sides = {"baseline": args.baseline.resolve(), **sides}
        results: dict[str, list[tuple[float, float, int, int, float]]] = {name: [] for name in sides}
        for round_ in range(args.rounds):
            for name, source in sides.items():
                work = scratch / f"{name.replace(' ', '-')}-{round_}"
                work.mkdir()
                shutil.copy(data, work / "data.jsonl")
                (work / "experts.toml").write_text(
                    '[experts.stand-in]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n'
                    'method = "next-token"\n'
                )
                first_s, first = batch_out(source, work, "first.jsonl")
                second_s, second = batch_out(source, work, "second.jsonl")
                megabytes = (work / "cache.sqlite").stat().st_size / 1e6
                results[name].append((first_s, second_s, first["written"], second["written"], megabytes))
                print(
                    f"round {round_ + 1} {name}: first {first_s:.1f} s ({first['written']:,} written), "
                    f"second {second_s:.1f} s ({second['written']:,} written, "
                    f"{second.get('pending', 0):,} left out as out), cache {megabytes:.1f} MB",
                    flush=True,
                )
        print(f"\n{args.items:,} items; medians of {args.rounds}:\n")
        print("| code | first --batch-out, s | second, s | second writes | cache, MB |")
        print("| --- | --- | --- | --- | --- |")
        for name, runs in results.items():
            first_s = statistics.median(r[0] for r in runs)
            second_s = statistics.median(r[1] for r in runs)
            print(f"| {name} | {first_s:.1f} | {second_s:.1f} | {runs[0][3]:,} | {runs[0][4]:.1f} |")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
