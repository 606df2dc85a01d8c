"""`ctd score --ray` at the acceptance's size (run by hand, not in CI; needs Ray and ../shared):

    PYTHONPATH=. python tests/bench/bench_score.py [--rows 20000] [--actors 2] [--local-rows 2000]

Builds `--rows` conversations by repeating the shared MUP files (../shared/data/mup/**.jsonl, each
copy with new ids) in a temporary folder (never committed), an untrained bundle on the embedded
model (tests/monitor_bundle.py: layer 2, 128 tokens), then:

1. `ctd score --ray local --actors N` is started and killed (SIGKILL, the driver: its local Ray
   dies with it) once a third of the shards are written;
2. the same command is run again: it resumes, and the shards written before the kill must be
   untouched (inode and mtime), every row scored once, no temporary file left;
3. `ctd score` without Ray (`score_local`, one process) scores the first `--local-rows` rows of the
   same file in the same run, for rows/s side by side.

rows/s is given twice: over the command's wall time (Ray's start and the models' loading
included), and steady (rows of the shards after the first one, over the time between the first
and the last shard file's mtime). Prints a Markdown table and what else was running (load average,
the busiest processes) before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from ctd_cli import run_ctd, start_ctd  # noqa: E402

MUP = ROOT.parent / "shared" / "data" / "mup"


def conversations(target: Path, rows: int, mup: Path) -> int:
    """`rows` rows cycled from the MUP files into `target` (JSONL), copy k's ids suffixed -rk."""
    source = []
    for path in sorted(mup.rglob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            source.append(
                {"inputs": row["inputs"], "ids": f"{path.stem}-{row['ids']}", "labels": row.get("labels")}
            )
    if not source:
        sys.exit(f"no .jsonl files under {mup}: pass --mup FOLDER (the shared MUP data)")
    with target.open("w") as handle:
        for n in range(rows):
            row = source[n % len(source)]
            handle.write(json.dumps({**row, "ids": f"{row['ids']}-r{n // len(source)}"}) + "\n")
    return len(source)


def machine_load() -> str:
    """The load average and the five busiest processes (what else was running)."""
    load = Path("/proc/loadavg").read_text().split()[:3]
    top = subprocess.run(
        ["ps", "-eo", "pcpu,comm", "--sort=-pcpu", "--no-headers"], capture_output=True, text=True
    ).stdout.splitlines()[:5]
    return f"load {' '.join(load)}; busiest: " + ", ".join(" ".join(t.split()) for t in top)


def stamps(out: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("shard-*.parquet")}


def steady_rate(out: Path, names: list[str] | None = None) -> float:
    """Rows per second between the first and the last of these shard files' mtimes (the rows of
    the first one left out: its time is the start-up's)."""
    import pyarrow.parquet as pq

    files = sorted(
        (p for p in out.glob("shard-*.parquet") if names is None or p.name in names), key=os.path.getmtime
    )
    if len(files) < 2:
        return float("nan")
    rows = sum(pq.read_metadata(p).num_rows for p in files[1:])
    return rows / (os.path.getmtime(files[-1]) - os.path.getmtime(files[0]))


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--shard-rows", type=int, default=500)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--local-rows", type=int, default=2_000, help="rows scored without Ray, to compare")
    parser.add_argument("--mup", type=Path, default=MUP)
    parser.add_argument(
        "--work", type=Path, default=None, help="keep the files here (default: a temp folder)"
    )
    args = parser.parse_args()
    import monitor_bundle

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-score-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "CTD_RUNS_DIR": str(work / "runs")}
    data = work / "conversations.jsonl"
    distinct = conversations(data, args.rows, args.mup)
    bundle = monitor_bundle.write_untrained_bundle(work / "bundle")
    print(f"{args.rows:,} rows ({distinct:,} distinct MUP conversations cycled) in {data}", flush=True)
    before_load = machine_load()
    common = ["score", "--bundle", str(bundle), "--data", str(data), "--shard-rows", str(args.shard_rows)]
    ray_out = work / "ray"
    on_ray = [*common, "--out", str(ray_out), "--ray", "local", "--actors", str(args.actors)]
    total = -(-args.rows // args.shard_rows)

    # 1. Started, then killed hard once a third of the shards are there.
    started = time.perf_counter()
    process = start_ctd(*on_ray, cwd=work, env=env)
    while len(stamps(ray_out)) < total // 3 and process.poll() is None:
        time.sleep(1)
    assert process.poll() is None, process.communicate()
    process.send_signal(signal.SIGKILL)
    process.communicate()
    killed_after = time.perf_counter() - started
    before = stamps(ray_out)
    temps_left = len(list(ray_out.glob(".shard-*")))
    first_rate = steady_rate(ray_out)
    print(
        f"killed after {killed_after:.0f}s with {len(before)}/{total} shards ({temps_left} temp files)",
        flush=True,
    )

    # 2. Resumed to the end.
    started = time.perf_counter()
    done = run_ctd(*on_ray, "--json", cwd=work, env=env, timeout=6 * 3600)
    assert done.returncode == 0, done.stderr[-3000:]
    resume_wall = time.perf_counter() - started
    resumed = json.loads(done.stdout)
    after = stamps(ray_out)
    rewritten = [name for name in before if after.get(name) != before[name]]
    import pyarrow.parquet as pq

    ids = [
        i
        for p in sorted(ray_out.glob("shard-*.parquet"))
        for i in pq.read_table(p, columns=["id"])["id"].to_pylist()
    ]
    checks = {
        "shards": len(after) == total,
        "no shard written twice": not rewritten and resumed["skipped"] == len(before),
        "every row once": len(ids) == len(set(ids)) == args.rows,
        "no temp file left": not list(ray_out.glob(".shard-*")),
    }
    resumed_rate = steady_rate(ray_out, [n for n in after if n not in before])

    # 3. The same rows in one process, without Ray.
    here_out = work / "here"
    started = time.perf_counter()
    here = run_ctd(
        *common,
        "--out",
        str(here_out),
        "--limit",
        str(args.local_rows),
        "--json",
        cwd=work,
        env=env,
        timeout=6 * 3600,
    )
    assert here.returncode == 0, here.stderr[-3000:]
    here_wall = time.perf_counter() - started
    local = json.loads(here.stdout)
    after_load = machine_load()

    table = [
        ("path", "rows", "wall s", "rows/s (wall)", "rows/s (steady)"),
        (f"Ray local, {args.actors} CPU actors, until killed", len(before) * args.shard_rows, killed_after,
         None, first_rate),
        (f"Ray local, {args.actors} CPU actors, resumed", resumed["rows_scored"], resume_wall,
         resumed["rows_scored"] / resume_wall, resumed_rate),
        ("one process (`score_local`)", local["rows_scored"], here_wall, local["rows_scored"] / here_wall,
         steady_rate(here_out)),
    ]  # fmt: skip
    print()
    for n, line in enumerate(table):
        print("| " + " | ".join(_cell(value) for value in line) + " |")
        if n == 0:
            print("| --- | ---: | ---: | ---: | ---: |")
    print()
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    print(f"tokens: {resumed['tokens']:,} in all; delegated {resumed['delegated']:,}")
    print(f"before: {before_load}")
    print(f"after:  {after_load}")
    print(f"files: {work}")
    if not all(checks.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
