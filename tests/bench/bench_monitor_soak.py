"""Monitor soak benchmark (run by hand, not in CI): many clients against one `ctd monitor serve`.

    python tests/bench/bench_monitor_soak.py [BUNDLE] [--clients 200] [--seconds 120]
        [--max-queue-ms 1000] [--no-backoff]

Without BUNDLE it first makes one the way a new user would (a small `ctd eval` of the built-in
tagged test data on the embedded model, with a local fault-injecting expert, then
`ctd monitor calibrate --budget 0.5`) in a temporary folder. Then it starts
`ctd monitor serve BUNDLE --no-expert` on 127.0.0.1 (nothing else is ever contacted) and runs
`--clients` closed-loop clients for `--seconds`: each sends a check, waits for the answer, and on a
503 waits the Retry-After it was given (as a well-behaved client does; `--no-backoff` retries at
once). Reported: accepted checks and their p50/p99/max latency, shed (503) and other errors,
accepted checks per second, when the first answer came, and the server's resident memory (RSS,
from /proc) after start-up, after the first minute and at the end.

Bounded: one run of `--seconds` (at most 600), each request times out after 120 s, loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "bench"))
sys.path.insert(0, str(ROOT))  # first: tests/experts/ must not shadow the experts package

from bench_monitor import serve, texts  # noqa: E402
from ctd_cli import free_port, run_ctd  # noqa: E402
from eval_data import FAST, eval_env, write_tagged_data  # noqa: E402
from fault_server import RunningServer  # noqa: E402

REQUEST_TIMEOUT = 120.0
FIRST_MINUTE = 60.0


@dataclass
class Tally:
    """What the clients saw."""

    accepted: list[float] = field(default_factory=list)  # seconds, per 200 answer
    answered_at: list[float] = field(default_factory=list)  # seconds since the start, per 200
    shed: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


def make_bundle(folder: Path) -> Path:
    """A budget bundle of a small run on the embedded model (as tests/harness/test_monitor_serve.py)."""
    env = {**os.environ, **eval_env(folder), "PYTHONPATH": str(ROOT)}
    args = ["eval", "--name", "soak", "--expert-model", "fault-model", *FAST]
    for token in write_tagged_data(folder / "data"):
        args += ["--data", token]
    with RunningServer() as expert:
        done = run_ctd(*args, "--expert", expert.url, cwd=folder, env=env, timeout=1800)
    if done.returncode:
        raise SystemExit(f"ctd eval failed: {done.stderr.strip().splitlines()[-1:]}")
    out = run_ctd(
        "monitor", "calibrate", "--run", "soak", "--budget", "0.5", cwd=folder, env=env, timeout=600
    )
    if out.returncode:
        raise SystemExit(f"ctd monitor calibrate failed: {out.stderr.strip()}")
    return Path(out.stdout.strip().splitlines()[-1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


async def soak(port: int, pid: int, clients: int, seconds: float, backoff: bool) -> tuple[Tally, dict]:
    conversations = texts(256)
    bodies = [{"input": c} if isinstance(c, str) else {"messages": c} for c in conversations]
    tally = Tally()
    memory: dict[str, float] = {"after_start_mib": rss_mib(pid)}
    # aiohttp, not httpx: plain httpx slows down past ~100 requests in flight (NOTES: 139/s at 256),
    # and on 2 shared cores the client's own cost would be measured as the server's latency.
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession(base, connector=connector, timeout=timeout) as client:
        started = time.perf_counter()
        deadline = started + seconds

        async def worker(number: int) -> None:
            turn = number
            while time.perf_counter() < deadline:
                turn += clients
                sent = time.perf_counter()
                try:
                    async with client.post("/v1/check", json=bodies[turn % len(bodies)]) as answer:
                        await answer.read()
                        status, retry_after = answer.status, answer.headers.get("retry-after", "1")
                except (aiohttp.ClientError, TimeoutError) as error:
                    tally.error(type(error).__name__)
                    continue
                now = time.perf_counter()
                if status == 200:
                    tally.accepted.append(now - sent)
                    tally.answered_at.append(now - started)
                elif status == 503:
                    tally.shed += 1
                    if backoff:
                        wait = float(retry_after)
                        await asyncio.sleep(min(wait, max(0.0, deadline - time.perf_counter())))
                else:
                    tally.error(str(status))

        async def sample_memory() -> None:
            await asyncio.sleep(min(FIRST_MINUTE, seconds))
            memory["after_first_minute_mib"] = rss_mib(pid)

        sampler = asyncio.create_task(sample_memory())
        await asyncio.gather(*(worker(i) for i in range(clients)))
        elapsed = time.perf_counter() - started
        await sampler
        memory["at_end_mib"] = rss_mib(pid)
        async with client.get("/metrics") as response:
            metrics = await response.text()
    memory["elapsed_s"] = elapsed
    memory["metrics"] = metrics  # type: ignore[assignment]
    return tally, memory


def server_value(metrics: str, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def server_mean_ms(metrics: str, part: str) -> float | None:
    """The server's own mean latency of one part of a check (its histogram's sum over count)."""
    total = server_value(metrics, "ctd_monitor_latency_seconds_sum", part=part)
    count = server_value(metrics, "ctd_monitor_latency_seconds_count", part=part)
    return None if not count or total is None else round(1e3 * total / count, 1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("bundle", type=Path, nargs="?")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--max-queue-ms", type=float, default=None)
    parser.add_argument("--no-backoff", action="store_true")
    args = parser.parse_args()
    clients = args.clients
    if not 1 <= clients <= 1000 or not 1 <= args.seconds <= 600:
        raise SystemExit("--clients must lie in 1..1000 and --seconds in 1..600")
    with tempfile.TemporaryDirectory(prefix="ctd-soak-") as scratch:
        bundle = args.bundle or make_bundle(Path(scratch))
        extra = ["--no-expert", "--log", str(Path(scratch) / "decisions.jsonl")]  # a real file
        if args.max_queue_ms is not None:
            extra += ["--max-queue-ms", str(args.max_queue_ms)]
        port = free_port()
        process = serve(bundle, port, extra)
        try:
            tally, memory = asyncio.run(soak(port, process.pid, clients, args.seconds, not args.no_backoff))
            report(clients, tally, memory)
        finally:
            stopping = time.perf_counter()
            process.terminate()
            try:
                process.wait(60)
                print(f"the server stopped {time.perf_counter() - stopping:.1f} s after SIGTERM")
            except subprocess.TimeoutExpired:
                process.kill()
                print("the server did not stop within 60 s of SIGTERM: killed")


def report(clients: int, tally: Tally, memory: dict) -> None:
    metrics = str(memory.pop("metrics"))
    ms = np.array(tally.accepted) * 1e3 if tally.accepted else np.array([np.nan])
    growth = memory["at_end_mib"] / memory["after_first_minute_mib"] - 1
    row = {
        "clients": clients,
        "seconds": round(memory["elapsed_s"], 1),
        "accepted": len(tally.accepted),
        "accepted_per_s": round(len(tally.accepted) / memory["elapsed_s"], 2),
        "p50_ms": round(float(np.percentile(ms, 50)), 1),
        "p99_ms": round(float(np.percentile(ms, 99)), 1),
        "max_ms": round(float(ms.max()), 1),
        "first_answer_s": round(min(tally.answered_at), 2) if tally.answered_at else None,
        "shed_503": tally.shed,
        "errors": tally.errors,
        "server_shed_total": server_value(metrics, "ctd_monitor_shed_total"),
        "server_seconds_per_batch": server_value(metrics, "ctd_monitor_forward_seconds_per_batch"),
        "server_seconds_per_item": server_value(metrics, "ctd_monitor_forward_seconds_per_item"),
        "server_mean_probe_ms": server_mean_ms(metrics, "probe"),
        "server_mean_total_ms": server_mean_ms(metrics, "total"),
        "server_forward_batches": server_value(metrics, "ctd_monitor_forward_batches_total"),
        "rss_after_start_mib": round(memory["after_start_mib"], 1),
        "rss_after_first_minute_mib": round(memory["after_first_minute_mib"], 1),
        "rss_at_end_mib": round(memory["at_end_mib"], 1),
        "rss_growth_after_first_minute": round(growth, 4),
        "load_average": os.getloadavg(),
    }
    print(
        f"{clients} clients, {row['seconds']} s: {row['accepted']} accepted "
        f"({row['accepted_per_s']}/s), "
        f"p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, max {row['max_ms']} ms, first answer after "
        f"{row['first_answer_s']} s; {row['shed_503']} shed (503), errors {row['errors'] or 'none'}; "
        f"RSS {row['rss_after_start_mib']} -> {row['rss_after_first_minute_mib']} -> "
        f"{row['rss_at_end_mib']} MiB "
        f"({100 * growth:+.1f}% after the first minute)"
    )
    print(json.dumps(row))


if __name__ == "__main__":
    main()
