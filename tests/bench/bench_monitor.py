"""Monitor load benchmark (run by hand, not in CI):

    python tests/bench/bench_monitor.py BUNDLE [--n 64] [--clients 1,8,32] [--max-seconds 120]
        [--model PATH] [--delegate-all]

Starts `ctd monitor serve BUNDLE` on 127.0.0.1 (and nothing else is ever contacted), then, for
each number of concurrent clients C, sends `--n` checks of the same texts from C closed-loop
clients (each sends its next request when the last one is answered) and reports requests per
second and the p50/p99 latency seen by the clients; once with the expert disabled (--no-expert)
and once with a local fault-injecting expert (tests/fault_server.py, answering at once) in the
bundle's place. The offline reference is `probes.extract` of the same texts into a fresh store
(the probe stage's own path) in this process: conversations per second.

--delegate-all serves a copy of the bundle whose threshold delegates every request, so that the
"expert enabled" rows measure the expert path at full load (the bundle's own threshold may
delegate few). Bounded: --n requests per level, and a level stops sending after --max-seconds.
Texts: the built-in data set's test split, cycled until there are --n conversations.

The model is the one the bundle's probes record (a hub id, a folder, or the embedded GGUF), or
`--model`, another copy of the same weights, passed to `ctd monitor serve --model` and loaded for
the offline reference.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))  # first: tests/experts/ must not shadow the experts package

from ctd_cli import CTD, free_port  # noqa: E402
from fault_server import RunningServer  # noqa: E402


def texts(n: int) -> list[object]:
    """`n` conversations: the built-in test split, again from its start as often as needed."""
    from harness.data.builtin import builtin_dir

    rows = [json.loads(line) for line in (builtin_dir() / "test.jsonl").read_text().splitlines()]
    rows = list(itertools.islice(itertools.cycle(rows), n))
    return [json.loads(r["inputs"]) if r["inputs"].startswith("[") else r["inputs"] for r in rows]


def offline_rate(bundle: Path, conversations: list[object], model_name: str | None) -> tuple[float, int]:
    """Conversations per second of `probes.extract` into a fresh store, and the tokens."""
    from probes import extract, load_model, read_artifact

    reads = read_artifact(bundle / "safety")
    model = load_model(model_name or reads.model)
    best = 0.0
    tokens = 0
    for _ in range(2):  # the first pass warms the allocator
        with tempfile.TemporaryDirectory() as store:
            started = time.perf_counter()
            _, stats = extract(
                model, conversations, layer=reads.layer, max_tokens=reads.max_tokens,
                data_hash=f"bench-{time.time_ns()}", store_root=Path(store),
            )  # fmt: skip
            best = max(best, len(conversations) / (time.perf_counter() - started))
            tokens = stats.tokens
    return best, tokens


def serve(
    bundle: Path,
    port: int,
    extra: list[str],
    log_dir: Path | None = None,
    *,
    source: Path = ROOT,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """`ctd monitor serve` of `bundle` once it answers; its decision log in a fresh folder under
    `log_dir` (default: the temporary directory; each record is synced there before its answer).
    `source`: the source tree it runs (default this one); `env`: more environment variables."""
    process = subprocess.Popen(
        [sys.executable, "-c", CTD, "monitor", "serve", str(bundle.resolve()), "--port", str(port),
         "--log", str(Path(tempfile.mkdtemp(prefix="monitor-log-", dir=log_dir)) / "decisions.jsonl"),
         *extra],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(source), os.environ.get("PYTHONPATH", "")]),
             **(env or {})},
        cwd=source,  # `python -c` puts its folder first on sys.path, ahead of PYTHONPATH
        text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit("the monitor exited before it was ready")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.5)
    process.kill()
    raise SystemExit("the monitor did not start within 600 s")


async def load(port: int, conversations: list[object], clients: int, max_seconds: float) -> dict:
    """`len(conversations)` checks from `clients` closed-loop clients; rps and latency percentiles."""
    latencies, delegated, elapsed = await _closed_loop(port, conversations, clients, max_seconds)
    return _summary(clients, latencies, delegated, elapsed)


def load_spread(
    pool: ProcessPoolExecutor,
    processes: int,
    port: int,
    conversations: list[object],
    clients: int,
    max_seconds: float,
) -> dict:
    """`load` with the clients spread over `processes` processes of `pool`, started together.

    A client process spends CPU too (little over `CheckStream`, but a fast server's many clients
    add up), so one client process can be what bounds a fast server's number; `client_cpu`, the
    busiest client process's CPU share (its set-up and teardown included), says whether it was.
    `elapsed` is the longest process's time from the common start to its last answer; `started`
    the start on this process's `time.monotonic()` clock.
    """
    processes = max(1, min(processes, clients))
    # A second for the pool to hand every process its part (the pool's processes are up once the
    # first call has run); connections open after the start, as a new client's would.
    start_at = time.time() + 1.0
    started = time.monotonic() + 1.0
    parts = [
        pool.submit(
            _load_part,
            port,
            conversations[i::processes],
            len(range(i, clients, processes)),
            max_seconds,
            start_at,
        )
        for i in range(processes)
    ]
    results = [part.result() for part in parts]
    latencies = [x for r in results for x in r["latencies"]]
    elapsed = max(r["elapsed"] for r in results)
    summary = _summary(clients, latencies, sum(r["delegated"] for r in results), elapsed)
    return {
        **summary,
        "processes": processes,
        "started": started,
        "elapsed": elapsed,
        "client_cpu": max(r["cpu"] / r["elapsed"] for r in results),
    }


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc; its threads included)."""
    return stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def children_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds so far of the live child processes of `pid` (the monitor's
    scorer process and multiprocessing's resource tracker)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:  # a thread that ended meanwhile
            continue
        for child in children:
            try:
                total += process_cpu_seconds(int(child))
            except OSError:
                continue
    return total


def stat_cpu_seconds(stat: Path) -> float:
    """User + system CPU seconds in a /proc `stat` file, a process's or one thread's (task/TID/stat)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()  # after the name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within a minute."""
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def _load_part(
    port: int, conversations: list[object], clients: int, max_seconds: float, start_at: float
) -> dict:
    """One process's share of `load_spread`: waits for `start_at` (wall clock), then runs."""
    time.sleep(max(0.0, start_at - time.time()))
    cpu = time.process_time()
    latencies, delegated, elapsed = asyncio.run(_closed_loop(port, conversations, clients, max_seconds))
    return {
        "latencies": latencies,
        "delegated": delegated,
        "elapsed": elapsed,
        "cpu": time.process_time() - cpu,
    }


def _summary(clients: int, latencies: list[float], delegated: int, elapsed: float) -> dict:
    ms = np.array(latencies) * 1e3
    return {
        "clients": clients,
        "requests": len(latencies),
        "rps": len(latencies) / elapsed,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "delegated": delegated,
    }


CHECK_TIMEOUT = 60.0  # seconds for one check's answer: far above a loaded server's slowest


class CheckStream:
    """One client's kept-alive connection to the monitor, HTTP/1.1 written and read on bare asyncio
    streams. httpx's pool was what a load of many clients measured: on two cores one httpx client
    of 128 connections took a whole core for 104 checks/s (9.5 ms of CPU a check; 2.7 ms at 32
    connections), more than the server spent answering them. This spends tens of microseconds."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> CheckStream:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def check(self, body: dict[str, object]) -> dict[str, object]:
        """POST /v1/check with `body`; the decision (an answer other than 200 raises)."""
        data = json.dumps(body).encode()
        self._writer.write(
            b"POST /v1/check HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        async with asyncio.timeout(CHECK_TIMEOUT):  # a stalled server fails the bench, not hangs it
            head = await self._reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            answer = await self._reader.readexactly(int(length.group(1)) if length else 0)
        if not head.startswith(b"HTTP/1.1 200 "):
            raise RuntimeError(f"the monitor answered {head.splitlines()[0]!r}: {answer[:200]!r}")
        return json.loads(answer)

    async def aclose(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


async def _closed_loop(
    port: int, conversations: list[object], clients: int, max_seconds: float
) -> tuple[list[float], int, float]:
    todo = list(range(len(conversations)))
    latencies: list[float] = []
    delegated = 0
    deadline = time.perf_counter() + max_seconds

    async def worker() -> None:
        nonlocal delegated
        stream = await CheckStream.open(port)
        try:
            while todo and time.perf_counter() < deadline:
                said = conversations[todo.pop()]
                body = {"input": said} if isinstance(said, str) else {"messages": said}
                started = time.perf_counter()
                answer = await stream.check(body)
                latencies.append(time.perf_counter() - started)
                delegated += bool(answer["delegated"])
        finally:
            await stream.aclose()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    return latencies, delegated, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--delegate-all", action="store_true")
    parser.add_argument("--model", help="Another copy of the probes' model (same weights).")
    args = parser.parse_args()
    if args.n < 1:
        parser.error("--n must be at least 1")
    if args.delegate_all:
        copy = Path(tempfile.mkdtemp(prefix="bundle-all-"))
        for path in args.bundle.iterdir():
            if path.suffix in (".json", ".safetensors"):
                (copy / path.name).write_bytes(path.read_bytes())
        record = json.loads((args.bundle / "bundle.json").read_text())
        (copy / "bundle.json").write_text(json.dumps({**record, "threshold": -1e9}))
        args.bundle = copy
    conversations = texts(args.n)
    levels = [int(c) for c in args.clients.split(",")]
    offline, tokens = offline_rate(args.bundle, conversations, args.model)
    print(f"offline extraction: {offline:.1f} conversations/s ({len(conversations)} texts, {tokens} tokens)")
    rows = []
    model = ["--model", args.model] if args.model else []
    with RunningServer() as expert:
        # Throughput at a fixed number of clients: no load shedding (bench_monitor_soak.py has it).
        no_shedding = ["--max-queue-ms", "600000", "--max-pending", "100000"]
        for mode, extra in (
            ("disabled", ["--no-expert", *no_shedding, *model]),
            ("enabled", ["--expert-url", expert.url, *no_shedding, *model]),
        ):
            port = free_port()
            process = serve(args.bundle, port, extra)
            try:
                asyncio.run(load(port, conversations[:8], 8, args.max_seconds))  # warm-up, not counted
                for clients in levels:
                    row = {
                        "expert": mode,
                        **asyncio.run(load(port, conversations, clients, args.max_seconds)),
                    }
                    rows.append(row)
                    print(
                        f"expert {mode:8s} clients {clients:3d}: {row['rps']:7.1f} req/s, "
                        f"p50 {row['p50_ms']:8.1f} ms, p99 {row['p99_ms']:8.1f} ms "
                        f"({row['requests']} requests, {row['delegated']} delegated)",
                        flush=True,
                    )
            finally:
                process.terminate()
                process.wait(30)
    top = max(levels)
    at_top = next(r for r in rows if r["expert"] == "disabled" and r["clients"] == top)
    print(f"expert disabled, {top} clients: {at_top['rps'] / offline:.2f}x the offline extraction rate")
    print(json.dumps({"offline_per_s": offline, "levels": rows}))


if __name__ == "__main__":
    main()
