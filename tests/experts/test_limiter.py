"""The Pacer and the Limiter on a fake clock: RPM and TPM pacing, request weights, give-backs
and concurrency slots (no real waiting)."""

from __future__ import annotations

import asyncio

import pytest
from expert_fakes import FakeTime

from experts import RateLimit

# Private: the pacer and limiter, unit-tested.
from experts._limiter import Limiter, Pacer


def test_pacer_spaces_calls_by_their_weight() -> None:
    fake = FakeTime()

    async def main() -> list[float]:
        pacer = Pacer(60, clock=fake.clock, sleep=fake.sleep)
        stamps = []
        for _ in range(64):
            await pacer.take(1)
            stamps.append(fake.now)
        return stamps

    stamps = asyncio.run(main())
    # One unit per second from the first call on: no burst.
    assert stamps == pytest.approx([1000.0 + k for k in range(64)])
    assert sum(fake.sleeps) == pytest.approx(63.0)


def test_limiter_rpm_pacing_with_concurrent_callers() -> None:
    fake = FakeTime()

    async def main() -> list[float]:
        limiter = Limiter(RateLimit(concurrency=4, rpm=120), clock=fake.clock, sleep=fake.sleep)
        assert limiter.tokens is None  # no TPM limit set
        stamps: list[float] = []

        async def one() -> None:
            await limiter.admit(1000)
            stamps.append(fake.now)

        await asyncio.gather(*(one() for _ in range(130)))
        return sorted(stamps)

    stamps = asyncio.run(main())
    # 2 requests per second, first come first served.
    assert stamps == pytest.approx([1000.0 + 0.5 * k for k in range(130)])


def test_no_sixty_second_window_admits_more_than_rpm() -> None:
    fake = FakeTime()

    async def main() -> list[float]:
        limiter = Limiter(RateLimit(rpm=60), clock=fake.clock, sleep=fake.sleep)
        stamps = []
        for _ in range(150):
            await limiter.admit(1)
            stamps.append(fake.now)
        return stamps

    stamps = asyncio.run(main())
    worst = max(sum(1 for t in stamps if s <= t < s + 60.0 - 1e-9) for s in stamps)
    assert worst <= 60


def test_limiter_counts_every_http_request_of_an_item() -> None:
    fake = FakeTime()

    async def main() -> list[float]:
        limiter = Limiter(RateLimit(rpm=60), clock=fake.clock, sleep=fake.sleep)
        stamps = []
        for _ in range(3):
            await limiter.admit(10, requests=2)  # likelihood scoring sends two requests
            stamps.append(fake.now)
        return stamps

    assert asyncio.run(main()) == pytest.approx([1000.0, 1002.0, 1004.0])


def test_tpm_weight_larger_than_a_minute_waits_its_turn() -> None:
    # 480 per minute = 8 per second: every wait below is an exact binary fraction.
    fake = FakeTime()

    async def main() -> None:
        pacer = Pacer(480, clock=fake.clock, sleep=fake.sleep)
        await pacer.take(240)
        assert fake.now == 1000.0
        # 240 tokens pay for 30 s: 2,000 > a minute's allowance passes then, without error.
        await pacer.take(2000)
        assert fake.now == 1030.0
        # and the next call waits for those 2,000 tokens: 250 s.
        await pacer.take(1)
        assert fake.now == 1280.0

    asyncio.run(main())


def test_pacer_wait_terminates_under_float_rounding() -> None:
    fake = FakeTime(max_sleeps=100)

    async def main() -> None:
        pacer = Pacer(600, clock=fake.clock, sleep=fake.sleep)  # 10 per second
        await pacer.take(300)
        await pacer.take(2000)  # waits 30 s
        await pacer.take(1)  # waits 200 s

    asyncio.run(main())
    assert fake.now == pytest.approx(1000.0 + 30.0 + 200.0)
    assert len(fake.sleeps) == 2


def test_limiter_tpm_and_settle_give_back() -> None:
    fake = FakeTime()

    async def main() -> None:
        limiter = Limiter(RateLimit(tpm=600), clock=fake.clock, sleep=fake.sleep)
        assert limiter.requests is None
        await limiter.admit(600)  # next admission 60 s later
        # The answer used 200 of the estimated 600 tokens: 400 come back, 20 s remain.
        limiter.settle(600, 200)
        await limiter.admit(400)
        assert sum(fake.sleeps) == pytest.approx(20.0)
        # Using more than estimated, or no usage reported: nothing comes back.
        limiter.settle(100, 500)
        limiter.settle(100, None)
        await limiter.admit(10)
        assert sum(fake.sleeps) == pytest.approx(20.0 + 40.0)

    asyncio.run(main())


def test_give_back_never_moves_the_schedule_into_the_past() -> None:
    fake = FakeTime()

    async def main() -> None:
        pacer = Pacer(60, clock=fake.clock, sleep=fake.sleep)
        pacer.give_back(1000)
        await pacer.take(1)
        assert fake.sleeps == []
        await pacer.take(1)
        assert sum(fake.sleeps) == pytest.approx(1.0)

    asyncio.run(main())


def test_concurrency_slots_bound_in_flight_and_are_released_when_the_body_raises() -> None:
    async def main() -> None:
        limiter = Limiter(RateLimit(concurrency=2))
        for _ in range(5):
            with pytest.raises(RuntimeError):
                async with limiter.slot():
                    assert limiter.in_flight == 1
                    raise RuntimeError("request failed")
        assert limiter.in_flight == 0

        gate = asyncio.Event()
        peak = 0

        async def hold() -> None:
            nonlocal peak
            async with limiter.slot():
                peak = max(peak, limiter.in_flight)
                await gate.wait()

        tasks = [asyncio.create_task(hold()) for _ in range(6)]
        for _ in range(10):
            await asyncio.sleep(0)
        assert limiter.in_flight == 2
        gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert peak == 2
        assert limiter.in_flight == 0

    asyncio.run(main())
