"""The monitor server's Python work per check (run by hand, not in CI; 127.0.0.1 only):

    python tests/bench/bench_monitor_cpu.py [--baseline SRC] [--clients 32] [--seconds 8] [--repeats 3]
        [--scorers threads,process] [--model embedded|tiny]

On an H200 the monitor answered about 390 checks/s at 128 clients with its GPU 30% busy: every
thread of the server was waiting most of the time, and the Python work under its one GIL (the
event loop's HTTP parsing, routing and bookkeeping, the tokenizer threads' template rendering, the
scorer thread's kernel launches) bounded it. This measures the first of these where it can be
told apart on any machine: the CPU seconds of the server's main thread (the event loop) per
answered check, from /proc, beside those of all its other threads (tokenizers, the forward pass,
the decision log's writes) and of its scorer process when it has one (`--scorer-process`, which
takes the tokenisation and the forward pass out of the server's process and its GIL).

The server runs `ctd monitor serve` on a bundle of untrained probes over the embedded model
(tests/monitor_bundle.py) with its decision log, the expert disabled and OMP_NUM_THREADS=1 (so
that its forward passes leave the cores to the event loop and the clients); `--clients`
closed-loop clients in this process send short checks for `--seconds`: httpx clients by default (as
earlier rounds measured), or with `--client raw` `bench_monitor.CheckStream`s, whose CPU per check
is a small fraction of httpx's (on two cores httpx was what bounded 128 clients). With `--baseline
SRC` (a source tree such as `git archive main | tar -x -C SRC`) the same runs against that code
too; this code runs with each placement in `--scorers`; all alternate `--repeats` times, so that
they see the same machine.

`--model tiny` serves random weights of a 2-layer Llama shape of width 64 (`bench_gpu.py --tiny`'s,
with the embedded tokenizer) in place of the embedded model: a forward pass then costs next to
nothing, as a GPU's nearly does, and checks/s shows how far the server's own work goes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # first: tests/experts/ must not shadow experts
from bench_monitor import CheckStream, children_cpu_seconds, serve, stat_cpu_seconds, stop
from ctd_cli import free_port
from monitor_bundle import write_untrained_bundle

REPOSITORY = Path(__file__).resolve().parents[2]


def thread_cpu_seconds(pid: int) -> tuple[float, float]:
    """(main thread, all other threads) user + system CPU seconds of process `pid` so far."""
    main = other = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            seconds = stat_cpu_seconds(task / "stat")
        except OSError:  # a thread that ended meanwhile
            continue
        if task.name == str(pid):
            main += seconds
        else:
            other += seconds
    return main, other


async def closed_loop(url: str, clients: int, seconds: float) -> tuple[int, float]:
    """(checks answered, seconds) from `clients` closed-loop clients over `seconds`."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    answered = 0
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        deadline = time.monotonic() + seconds

        async def one(i: int) -> None:
            nonlocal answered
            k = 0
            while time.monotonic() < deadline:
                k += 1
                answer = await client.post("/v1/check", json={"input": f"is message {i}.{k} fine?"})
                answer.raise_for_status()
                answered += 1

        started = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(clients)))
        return answered, time.monotonic() - started


async def raw_closed_loop(url: str, clients: int, seconds: float) -> tuple[int, float]:
    """`closed_loop` over `bench_monitor.CheckStream`s: bare asyncio streams, whose CPU per check
    is a small fraction of httpx's, so that the server is what bounds checks/s."""
    port = int(url.rsplit(":", 1)[1])
    answered = 0
    deadline = time.monotonic() + seconds

    async def one(i: int) -> None:
        nonlocal answered
        stream = await CheckStream.open(port)
        try:
            k = 0
            while time.monotonic() < deadline:
                k += 1
                await stream.check({"input": f"is message {i}.{k} fine?"})
                answered += 1
        finally:
            await stream.aclose()

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(clients)))
    return answered, time.monotonic() - started


def measure(
    source: Path,
    bundle: Path,
    clients: int,
    seconds: float,
    scratch: Path,
    extra: list[str],
    client: str = "httpx",
) -> dict[str, float]:
    port = free_port()
    options = ["--no-expert", "--max-batch", "128", "--max-queue-ms", "600000", "--max-pending", "100000"]
    server = serve(bundle, port, [*options, *extra], scratch, source=source, env={"OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        loop = raw_closed_loop if client == "raw" else closed_loop
        asyncio.run(loop(url, 8, 1.0))  # warm-up, not counted
        main, other = thread_cpu_seconds(server.pid)
        children = children_cpu_seconds(server.pid)
        answered, elapsed = asyncio.run(loop(url, clients, seconds))
        main_after, other_after = thread_cpu_seconds(server.pid)
        return {
            "checks/s": answered / elapsed,
            "main ms/check": (main_after - main) / answered * 1e3,
            "other threads ms/check": (other_after - other) / answered * 1e3,
            "scorer process ms/check": (children_cpu_seconds(server.pid) - children) / answered * 1e3,
        }
    finally:
        stop(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="Another source tree, measured alternately.")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--scorers", default="threads,process", help="this code's scorer placements (--scorer-PLACE)"
    )
    parser.add_argument("--model", choices=("embedded", "tiny"), default="embedded")
    parser.add_argument("--client", choices=("httpx", "raw"), default="httpx", help="raw: raw_closed_loop")
    args = parser.parse_args()
    runs = [
        (f"this code, --scorer-{scorer}", REPOSITORY, [f"--scorer-{scorer}"])
        for scorer in args.scorers.split(",")
    ]
    if args.baseline is not None:
        runs.insert(0, (f"baseline {args.baseline}", args.baseline, []))
    rows: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in runs}
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        if args.model == "tiny":
            from bench_gpu import build_model

            build_model(scratch / "tiny-model", None, True, "cpu")
            bundle = write_untrained_bundle(scratch / "bundle", model=str(scratch / "tiny-model"))
        else:
            bundle = write_untrained_bundle(scratch / "bundle")
        for repeat in range(args.repeats):
            for name, source, extra in runs:
                row = measure(source, bundle, args.clients, args.seconds, scratch, extra, args.client)
                rows[name].append(row)
                shown = ", ".join(f"{key} {value:.2f}" for key, value in row.items())
                print(f"{repeat + 1}/{args.repeats} {name}: {shown}", flush=True)
    for name, measured in rows.items():
        medians = {key: statistics.median(r[key] for r in measured) for key in measured[0]}
        print(f"median of {args.repeats}, {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in medians.items()))


if __name__ == "__main__":
    main()
