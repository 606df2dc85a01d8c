"""One `ExpertClient` for many `score` calls (`async with`): concurrent calls share one limit on
requests in flight and one connection pool, measured at a real loopback server; the client
refuses use once closed, and a call outside `async with` still opens and closes around itself."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from fault_server import FaultServer, item_score

from experts import ConfigError, ExpertClient, ExpertSpec, Item, RateLimit, ScoreCache, list_claims

CONCURRENCY = 3


class GaugedServer(FaultServer):
    """The fault server (no faults) holding each answer `hold` seconds, counting the requests in
    flight at once and the TCP connections (client address and port) they arrived over."""

    def __init__(self, hold: float) -> None:
        super().__init__()
        self.hold = hold
        self.in_flight = 0
        self.peak = 0
        self.connections: set[Any] = set()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        assert request.transport is not None
        self.connections.add(request.transport.get_extra_info("peername"))
        try:
            await asyncio.sleep(self.hold)
            return await super().chat(request)
        finally:
            self.in_flight -= 1


@asynccontextmanager
async def serving(server: FaultServer) -> AsyncIterator[str]:
    """`server` on 127.0.0.1 in the running event loop; yields its base URL."""
    runner = web.AppRunner(server.app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


def spec_for(url: str) -> ExpertSpec:
    return ExpertSpec(
        name="life", base_urls=(url,), model="fault-model", rate=RateLimit(concurrency=CONCURRENCY)
    )


def calls(n_calls: int, per_call: int) -> list[list[Item]]:
    return [[Item(f"c{c}-{i}", f"about item-{c * 100 + i}") for i in range(per_call)] for c in range(n_calls)]


def test_concurrent_calls_share_one_limit_and_one_connection_pool() -> None:
    """Four calls of 12 items at once on one open client: never more than `concurrency` requests
    in flight at the server, over no more than `concurrency` connections, and every answer
    aligned with its own call's items."""
    server = GaugedServer(hold=0.05)
    work = calls(4, 12)

    async def main() -> list[Any]:
        async with serving(server) as url, ExpertClient(spec_for(url), cache=None) as client:
            return await asyncio.gather(*(client.score(items) for items in work))

    outcomes = asyncio.run(main())
    for items, (results, stats) in zip(work, outcomes, strict=True):
        assert [r.id for r in results] == [item.id for item in items]
        assert stats.scored == len(items) and stats.failed == 0
        for item, result in zip(items, results, strict=True):
            number = int(str(item.conversation).rsplit("-", 1)[1])
            assert result.score == pytest.approx(item_score(number), abs=1e-6)
    assert server.peak == CONCURRENCY  # reached, and never passed across the four calls
    assert 1 <= len(server.connections) <= CONCURRENCY  # one pool of that size for all calls


def test_a_closed_client_refuses_use_and_an_unopened_one_opens_per_call() -> None:
    server = GaugedServer(hold=0.0)
    (first, second) = calls(2, 2)

    async def main() -> None:
        async with serving(server) as url:
            client = ExpertClient(spec_for(url), cache=None)
            for items in (first, second):  # each call opens and closes its own resources
                results, _ = await client.score(items)
                assert all(r.source == "expert" for r in results)
            async with client:
                with pytest.raises(RuntimeError, match="already open"):
                    await client.__aenter__()
                results, _ = await client.score(first)
                assert all(r.source == "expert" for r in results)
            with pytest.raises(RuntimeError, match="has been closed"):
                await client.score(second)
            with pytest.raises(RuntimeError, match="has been closed"):
                async with client:
                    pass

    asyncio.run(main())
    assert sum(server.counts.successes.values()) == 6


def test_a_failed_call_frees_its_claims_while_the_client_stays_open(tmp_path: Path) -> None:
    """A call that ends in an error (here every request is over the whole TPM budget, refused
    before anything is sent) leaves no claim behind for the rest of the client's life: another
    run on the cache would otherwise wait for items nobody is asking about."""
    cache = ScoreCache(tmp_path / "cache.db")
    spec = ExpertSpec(
        name="tight", base_urls=("http://unused.test/v1",), model="m", rate=RateLimit(concurrency=2, tpm=1)
    )

    async def main() -> None:
        async with ExpertClient(spec, cache=cache) as client:
            with pytest.raises(ConfigError, match="tpm"):
                await client.score(calls(1, 10)[0])
            assert list_claims(cache) == []

    asyncio.run(main())
