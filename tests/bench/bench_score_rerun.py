"""`ctd score`'s rerun after expert failures (run by hand, not in CI; needs ../shared):

    python tests/bench/bench_score_rerun.py --baseline SRC [--rows 2000] [--shard-rows 250] [--rounds 2]

A job whose expert failed on delegated rows leaves shards that are not done; rerunning the same
command asks the expert again for exactly those rows. What else the rerun costs is the question:
before, every such shard met the monitored model again (tokenised, every row's forward pass);
now its probe side is read back from the shard file and the model is not loaded at all.

Builds `--rows` conversations from the shared MUP files (copies with new ids, in a temporary
folder), an untrained bundle with an expert entry on the embedded model (tests/monitor_bundle.py),
then for this code and the `--baseline` source tree (such as `git archive REV | tar -x -C SRC`),
alternating `--rounds` times: `ctd score --expert` against a stand-in expert whose every answer
lacks the label tokens (tests/fault_server.py: each delegated row fails, each shard with one is
left to the rerun), then the same command against a working stand-in at the same URL, timed. Both
must end with the same rows (probe and DV within 1e-5, every delegated row answered) and the same
expert requests. Prints the reruns' wall times side by side and what else was running.
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
sys.path.insert(0, str(ROOT / "tests" / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))  # first: tests/experts/ must not shadow experts

from bench_score import MUP, conversations, machine_load  # noqa: E402
from fault_server import FaultPlan, RunningServer  # noqa: E402
from monitor_bundle import write_untrained_bundle  # noqa: E402

ENTRY = "from harness.cli import main; main()"
EVERY_ITEM = frozenset(range(-1, 100_000))  # MUP texts name no item: the server calls them -1


def ctd_score(
    source: Path, bundle: Path, data: Path, out: Path, url: str, shard_rows: int
) -> tuple[float, dict]:
    """(wall seconds, --json summary) of `ctd score --expert` run from the source tree `source`."""
    command = [
        sys.executable, "-c", ENTRY, "score", "--bundle", str(bundle), "--data", str(data),
        "--out", str(out), "--shard-rows", str(shard_rows), "--expert", "--expert-url", url,
        "--expert-cache", str(out.with_suffix(".sqlite")), "--json",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(source), os.environ.get("PYTHONPATH", "")])}
    started = time.perf_counter()
    # cwd: `python -c` puts its folder first on sys.path, ahead of PYTHONPATH.
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=source)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):  # 1: more than --max-failed of the delegated rows failed
        raise SystemExit(
            f"bench_score_rerun: ctd score failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
        )
    return wall, json.loads(done.stdout) if done.returncode == 0 else {}


def rows_of(out: Path) -> dict[str, dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.concat_tables(pq.read_table(p) for p in sorted(out.glob("shard-*.parquet")))
    return {row["id"]: row for row in table.to_pylist()}


def one_job(source: Path, bundle: Path, data: Path, out: Path, shard_rows: int) -> dict[str, object]:
    """A job whose expert fails, then its rerun against a working one: the rerun's numbers."""
    with RunningServer(FaultPlan(broken=EVERY_ITEM)) as broken:
        first, _ = ctd_score(source, bundle, data, out, broken.url, shard_rows)
    with RunningServer(port=broken.port) as working:  # the same URL: the same job
        wall, summary = ctd_score(source, bundle, data, out, working.url, shard_rows)
        asked = sum(working.server.counts.requests.values())
    if summary.get("expert_failed", 1) != 0:
        raise SystemExit(f"bench_score_rerun: the rerun left expert failures: {summary}")
    return {
        "first": first,
        "rerun": wall,
        "written": summary["written"],
        "asked": asked,
        "rows": rows_of(out),
    }


def same_rows(a: dict[str, dict], b: dict[str, dict]) -> bool:
    return a.keys() == b.keys() and all(
        a[k]["delegated"] == b[k]["delegated"]
        and a[k]["expert"] == b[k]["expert"]
        and all(
            (a[k][c] is None and b[k][c] is None) or abs(a[k][c] - b[k][c]) <= 1e-5
            for c in ("probe", "dv", "score")
        )
        for k in a
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a source tree to compare with")
    parser.add_argument("--rows", type=int, default=2_000)
    parser.add_argument("--shard-rows", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mup", type=Path, default=MUP)
    args = parser.parse_args()
    print(f"before: {machine_load()}", flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-score-rerun-"))
    try:
        data = scratch / "conversations.jsonl"
        conversations(data, args.rows, args.mup)
        bundle = write_untrained_bundle(scratch / "bundle", expert=True)
        sides = {"baseline": args.baseline.resolve(), "this code": ROOT}
        results: dict[str, list[dict[str, object]]] = {name: [] for name in sides}
        for round_ in range(args.rounds):
            for name, source in sides.items():
                out = scratch / f"{name.replace(' ', '-')}-{round_}"
                result = one_job(source, bundle, data, out, args.shard_rows)
                results[name].append(result)
                print(
                    f"round {round_ + 1} {name}: first job {result['first']:.1f} s, "
                    f"rerun {result['rerun']:.1f} s "
                    f"({result['written']} shards rewritten, {result['asked']} expert requests)",
                    flush=True,
                )
        reference = results["baseline"][0]
        for name, runs in results.items():
            for run in runs:
                if not same_rows(run["rows"], reference["rows"]) or run["asked"] != reference["asked"]:  # type: ignore[arg-type]
                    raise SystemExit(
                        f"bench_score_rerun: {name}'s rows or expert requests differ from the baseline's"
                    )
        print(
            f"\n{args.rows:,} rows, shards of {args.shard_rows}: "
            "the rows and expert requests of every run equal\n"
        )
        print("| code | first job, s | rerun, s (each round) | rerun, median |")
        print("| --- | --- | --- | --- |")
        for name, runs in results.items():
            reruns = [float(r["rerun"]) for r in runs]  # type: ignore[arg-type]
            firsts = " / ".join(f"{float(r['first']):.1f}" for r in runs)  # type: ignore[arg-type]
            each = " / ".join(f"{x:.1f}" for x in reruns)
            print(f"| {name} | {firsts} | {each} | {statistics.median(reruns):.1f} |")
        print(f"\nafter: {machine_load()}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
