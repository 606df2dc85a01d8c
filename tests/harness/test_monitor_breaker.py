"""The monitor's expert gate against an expert that refuses connections (a loopback port nothing
listens on), asked in micro-batches of 1-3 items: the client's one breaker, shared by all
batches, opens after `down_after` (4) items in a row fail; later asks answer "expert-down" at once
and send nothing; after the cooldown exactly one probe request goes out; once a server listens
on the port again, the probe's answer closes the breaker and scores come back."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
from fault_server import RunningServer, item_score

from experts import ExpertSpec, Item

# Private: the default transport and the monitor's expert gate, unit-tested.
from experts._endpoint import default_transport
from harness.monitor._expert import ExpertAnswer, ExpertGate

COOLDOWN = 1.0
FAILED = (None, "expert-failed: connection")
DOWN = (None, "expert-down")


class CountingTransport(httpx.AsyncBaseTransport):
    """The real transport (httpx over aiohttp), counting the requests handed to it."""

    def __init__(self) -> None:
        self.inner = default_transport(16)
        self.sent = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def ask_round(gate: ExpertGate, start: int, size: int) -> list[ExpertAnswer]:
    """`size` requests at once (one micro-batch of up to 3), items numbered from `start`."""
    return list(
        await asyncio.gather(*(gate.ask(Item(f"r{start + i}", f"item-{start + i}")) for i in range(size)))
    )


async def wait_until_half_open(gate: ExpertGate) -> None:
    deadline = time.monotonic() + 10 * COOLDOWN
    while gate.down:
        assert time.monotonic() < deadline, "the breaker never left the open state"
        await asyncio.sleep(0.05)


def test_refused_connections_open_the_shared_breaker_and_a_probe_closes_it() -> None:
    port = free_port()
    spec = ExpertSpec(name="gone", base_urls=(f"http://127.0.0.1:{port}/v1",), model="fault-model")
    transport = CountingTransport()

    async def main() -> None:
        gate = ExpertGate(spec, max_batch=3, max_wait=0.001, cooldown=COOLDOWN, transport=transport)
        async with gate:
            # 3 items in batches of 1 and 2: below the count of 4, each paid its 2 attempts.
            answers = await ask_round(gate, 0, 1) + await ask_round(gate, 1, 2)
            assert answers == [FAILED] * 3 and not gate.down
            assert transport.sent == 3 * 2
            # A batch of 3 brings the count to 4 and beyond: the breaker opens.
            assert await ask_round(gate, 3, 3) == [FAILED] * 3
            assert gate.down
            sent = transport.sent

            # Open: answered at once, nothing sent, whatever the batch sizes.
            started = time.monotonic()
            for size in (1, 2, 3):
                assert await ask_round(gate, 10 * size, size) == [DOWN] * size
            assert time.monotonic() - started < COOLDOWN / 2
            assert transport.sent == sent

            # Half-open: one probe request and only one; it fails, so the breaker opens again.
            await wait_until_half_open(gate)
            probing = await ask_round(gate, 40, 3)
            assert sorted(probing, key=str) == sorted([FAILED, DOWN, DOWN], key=str)
            assert transport.sent == sent + 1 and gate.down

            # The expert is back on the same port: the next probe's answer closes the breaker.
            with RunningServer(port=port) as server:
                await wait_until_half_open(gate)
                (probe,) = await ask_round(gate, 50, 1)
                assert probe[1] is None and probe[0] is not None
                assert abs(probe[0] - item_score(50)) < 1e-6
                assert not gate.down
                again = await ask_round(gate, 60, 3)
                assert [a[1] for a in again] == [None] * 3
                assert sum(server.server.counts.successes.values()) == 4

    asyncio.run(main())
