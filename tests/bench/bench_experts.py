"""Benchmark of the expert stage (run by hand, not in CI):

    python tests/bench/bench_experts.py

Against a local endpoint that answers at once (a minimal asyncio HTTP server in a child
process, so that it does not share the client's event loop), at 64 requests in flight:

1. a bare asyncio + httpx loop over the same requests (the reference), plain and over the
   aiohttp transport;
2. the full engine: cache writes, RPM/TPM limits and retries armed. Targets: at least 0.8x the
   bare loop and at least 1,000 items/s;
3. replaying the finished 10,000-item run from the cache. Target: at least 20,000 items/s;
4. peak traced memory of the engine for 2,000 and for 10,000 items: flat in the item count.

Everything runs side by side in one process; the table reports medians of 3 runs.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import tracemalloc
from pathlib import Path

import httpx

from experts import ExpertClient, ExpertSpec, Item, RateLimit, RetryPolicy, ScoreCache

# Private: the bare transport, the baseline the client is compared with.
from experts._endpoint import default_transport

ITEMS = 10_000
IN_FLIGHT = 64

SERVER = textwrap.dedent(
    """
    import asyncio, json, sys
    TOP = [{"token": " high", "logprob": -0.4}, {"token": " low", "logprob": -1.2}]
    CHOICE = {"index": 0, "message": {"content": "high"},
              "logprobs": {"content": [{"token": "high", "top_logprobs": TOP}]}}
    BODY = json.dumps({"choices": [CHOICE], "usage": {"prompt_tokens": 120, "completion_tokens": 1}}).encode()
    HEAD = b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(BODY)

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\\r\\n\\r\\n")
                length = 0
                for line in head.split(b"\\r\\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                if length:
                    await reader.readexactly(length)
                if head.startswith(b"GET"):
                    models = json.dumps({"data": [{"id": "bench"}]}).encode()
                    writer.write(b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(models))
                    writer.write(models)
                else:
                    writer.write(HEAD + BODY)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    asyncio.run(main())
    """
)


def items(n: int) -> list[Item]:
    return [
        Item(f"id{i}", f"item-{i}: how do I keep my sourdough starter alive? " + "detail " * 60)
        for i in range(n)
    ]


def spec(url: str) -> ExpertSpec:
    # Limits and retries armed: the RPM and TPM buckets are consulted on every request.
    return ExpertSpec(
        name="bench",
        base_urls=(url,),
        model="bench",
        rate=RateLimit(concurrency=IN_FLIGHT, rpm=1e9, tpm=1e12),
        retry=RetryPolicy(max_attempts=6),
    )


async def bare_loop(url: str, bodies: list[bytes], transport: httpx.AsyncBaseTransport | None) -> float:
    """The reference: IN_FLIGHT tasks posting the same request bodies, parsing the JSON."""
    limits = httpx.Limits(max_connections=IN_FLIGHT, max_keepalive_connections=IN_FLIGHT)
    async with httpx.AsyncClient(transport=transport, limits=limits, timeout=30) as client:
        queue = iter(bodies)

        async def worker() -> None:
            for body in queue:
                response = await client.post(
                    url + "/chat/completions", content=body, headers={"content-type": "application/json"}
                )
                response.json()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
        return len(bodies) / (time.perf_counter() - started)


def engine_run(url: str, work: list[Item], cache_path: Path) -> tuple[float, int]:
    cache = ScoreCache(cache_path)
    started = time.perf_counter()
    results, stats = asyncio.run(ExpertClient(spec(url), cache=cache).score(work))
    rate = len(work) / (time.perf_counter() - started)
    cache.close()
    assert stats.failed == 0 and len(results) == len(work)
    return rate, stats.cached


def peak_memory(url: str, n: int, folder: Path) -> int:
    work = items(n)  # the inputs are the caller's; measure what the engine adds on top
    tracemalloc.start()
    engine_run(url, work, folder / f"memory-{n}.db")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def main() -> None:
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}/v1"
        work = items(ITEMS)
        client = ExpertClient(spec(url), cache=None)
        bodies = [json.dumps(client.request_for(item)[0].body).encode() for item in work]
        rows = {"bare httpx": [], "bare httpx over aiohttp": [], "engine": [], "replay": []}
        with tempfile.TemporaryDirectory() as folder:
            for run in range(3):
                rows["bare httpx"].append(asyncio.run(bare_loop(url, bodies, None)))
                rows["bare httpx over aiohttp"].append(
                    asyncio.run(bare_loop(url, bodies, default_transport(IN_FLIGHT)))
                )
                db = Path(folder) / f"run-{run}.db"
                rows["engine"].append(engine_run(url, work, db)[0])
                rate, cached = engine_run(url, work, db)
                assert cached == ITEMS
                rows["replay"].append(rate)
            small, large = peak_memory(url, 2_000, Path(folder)), peak_memory(url, ITEMS, Path(folder))
    finally:
        server.terminate()
    median = {name: statistics.median(rates) for name, rates in rows.items()}
    print(f"| what | items/s (median of 3), {ITEMS:,} items, {IN_FLIGHT} in flight | ratio / target |")
    print("| --- | --- | --- |")
    print(f"| bare asyncio + httpx loop | {median['bare httpx']:,.0f} | reference |")
    print(f"| bare asyncio + httpx over aiohttp | {median['bare httpx over aiohttp']:,.0f} | reference |")
    print(
        f"| engine: cache writes, limits, retries | {median['engine']:,.0f} | "
        f"{median['engine'] / median['bare httpx']:.2f}x bare httpx, "
        f"{median['engine'] / median['bare httpx over aiohttp']:.2f}x bare httpx over aiohttp; "
        ">= 0.8x and >= 1,000/s |"
    )
    print(f"| replay of the finished run from the cache | {median['replay']:,.0f} | >= 20,000/s |")
    print(
        f"| peak traced memory of a run | {small / 2**20:.1f} MiB at 2,000 items, {large / 2**20:.1f} MiB at "
        f"{ITEMS:,} | {large / small:.2f}x for 5x the items |"
    )


if __name__ == "__main__":
    main()
