"""`ctd query` at scale, its first run and its rerun from the cache (run by hand, not in CI;
127.0.0.1 only):

    python tests/bench/bench_query_rerun.py [--items 100000] [--baseline SRC] [--rounds 2]

Writes `--items` distinct conversations (about 500 characters each) and a registry entry with a
tpm, as an API's entry has (so the run checks every request's size first), for a stand-in expert
that answers at once (`bench_experts.SERVER`, in a process of its own). Then, in a fresh cache
each round, times `ctd query` asking for every item (the first run), and the same command again
(the rerun: every answer in the cache, nothing sent): what is left of a rerun is the passes over
the items before and after the client's, which is what keying each item once saves. With
`--baseline SRC` (a source tree, such as `git archive REV | tar -x -C SRC`) the same runs against
that code, alternating; the tables of both must hold the same scores. Prints the wall times, each
run's peak resident memory (`/usr/bin/time`) and what else was running.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
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
sys.path.insert(0, str(ROOT / "tests" / "bench"))

from bench_experts import SERVER  # noqa: E402
from bench_score import machine_load  # noqa: E402

ENTRY = "from harness.cli import main; main()"


def query(source: Path, work: Path, out: str) -> tuple[float, float]:
    """(wall seconds, peak resident MB) of one `ctd query` run from the tree `source` over the
    items in `work`."""
    command = ["/usr/bin/time", "-f", "%M", sys.executable, "-c", ENTRY, "query",
               "--data", str(work / "data.jsonl"), "--expert", "stand-in", "--out", str(work / out),
               "--no-check"]  # fmt: skip
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
            f"bench_query_rerun: ctd query failed (exit {done.returncode}):\n{done.stderr[-2000:]}"
        )
    return wall, int(done.stderr.strip().splitlines()[-1]) / 1024  # time -f %M: KB


def scores_digest(table: Path) -> str:
    """The sha256 of the table's id and expert columns: the same answers, whatever else differs."""
    with table.open(newline="") as handle:
        rows = [(row["id"], row["expert"]) for row in csv.DictReader(handle)]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--baseline", type=Path, help="a source tree to compare with")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-query-rerun-"))
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())  # type: ignore[union-attr]
        data = scratch / "data.jsonl"
        with data.open("w") as handle:
            for i in range(args.items):
                text = f"item-{i}: how do I keep my sourdough starter alive? " + "detail " * 60
                handle.write(json.dumps({"ids": f"ex{i}", "inputs": text}) + "\n")
        sides = {"this code": ROOT}
        if args.baseline is not None:
            sides = {"baseline": args.baseline.resolve(), **sides}
        results: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in sides}
        digests = set()
        print(f"before: {machine_load()}", flush=True)
        for round_ in range(args.rounds):
            for name, source in sides.items():
                work = scratch / f"{name.replace(' ', '-')}-{round_}"
                work.mkdir()
                shutil.copy(data, work / "data.jsonl")
                (work / "experts.toml").write_text(
                    f'[experts.stand-in]\nbase_url = "http://127.0.0.1:{port}/v1"\nmodel = "bench"\n'
                    'method = "next-token"\nconcurrency = 64\ntpm = 1000000000\n'
                )
                first, first_mb = query(source, work, "first.csv")
                rerun, rerun_mb = query(source, work, "rerun.csv")
                digests |= {scores_digest(work / "first.csv"), scores_digest(work / "rerun.csv")}
                results[name].append((first, rerun, first_mb, rerun_mb))
                print(
                    f"round {round_ + 1} {name}: first run {first:.1f} s ({first_mb:.0f} MB), "
                    f"rerun {rerun:.1f} s ({rerun_mb:.0f} MB)",
                    flush=True,
                )
                shutil.rmtree(work)
        if len(digests) != 1:
            raise SystemExit("bench_query_rerun: the runs' tables hold different scores")
        print(f"after: {machine_load()}")
        print(f"\n{args.items:,} items; medians of {args.rounds}; every table the same scores:\n")
        print("| code | first run, s | rerun from the cache, s | peak resident, first / rerun, MB |")
        print("| --- | --- | --- | --- |")
        for name, runs in results.items():
            first, rerun, first_mb, rerun_mb = (statistics.median(r[i] for r in runs) for i in range(4))
            print(f"| {name} | {first:.1f} | {rerun:.1f} | {first_mb:.0f} / {rerun_mb:.0f} |")
    finally:
        server.kill()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
