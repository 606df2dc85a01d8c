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

from experts import ExpertClient, ExpertSpec, Item

# Private: the default transport and the monitor's expert gate, unit-tested.
from experts._endpoint import default_transport
from harness.monitor._expert import ExpertAnswer, ExpertGate

# Long enough that no stall of a loaded machine ends the open state (a 1 s cooldown once did);
# the test's clock jumps over it instead of waiting.
COOLDOWN = 30.0
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


class JumpingClock:
    """time.monotonic, plus whatever `jump` has added: the cooldown passes at the test's word."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skipped

    def jump(self, seconds: float) -> None:
        self.skipped += seconds


def pass_the_cooldown(gate: ExpertGate, clock: JumpingClock) -> None:
    assert gate.down, "the breaker left the open state before its cooldown"
    clock.jump(COOLDOWN)
    assert not gate.down, "the breaker did not leave the open state after its cooldown"


def test_refused_connections_open_the_shared_breaker_and_a_probe_closes_it() -> None:
    port = free_port()
    spec = ExpertSpec(name="gone", base_urls=(f"http://127.0.0.1:{port}/v1",), model="fault-model")
    transport = CountingTransport()
    clock = JumpingClock()

    async def main() -> None:
        gate = ExpertGate(spec, max_batch=3, max_wait=0.001, cooldown=COOLDOWN, transport=transport)
        gate.client = ExpertClient(gate.spec, cache=None, transport=transport, clock=clock)  # on `clock`
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
            assert time.monotonic() - started < 5.0  # no request, no backoff: far from any timeout
            assert transport.sent == sent

            # Half-open: one probe request and only one; it fails, so the breaker opens again.
            pass_the_cooldown(gate, clock)
            probing = await ask_round(gate, 40, 3)
            assert sorted(probing, key=str) == sorted([FAILED, DOWN, DOWN], key=str)
            assert transport.sent == sent + 1 and gate.down

            # The expert is back on the same port: the next probe's answer closes the breaker.
            with RunningServer(port=port) as server:
                pass_the_cooldown(gate, clock)
                (probe,) = await ask_round(gate, 50, 1)
                assert probe[1] is None and probe[0] is not None
                assert abs(probe[0] - item_score(50)) < 1e-6
                assert not gate.down
                again = await ask_round(gate, 60, 3)
                assert [a[1] for a in again] == [None] * 3
                assert sum(server.server.counts.successes.values()) == 4

    asyncio.run(main())
