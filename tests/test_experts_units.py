"""Unit tests of the expert stage's pieces: limiter (on a fake clock), retry policy, prompts,
scoring requests and answers, registry, cache keys, the endpoint (over httpx.MockTransport),
and the client's retry loop (fake clock and sleep, no real waiting)."""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import json
import math
import os
import random
import re
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

import experts._cache as cache_module
from experts import (
    BUILTIN_EXPERTS,
    SCHEMA_VERSION,
    CacheKey,
    ConfigError,
    Endpoint,
    EndpointDown,
    ExpertClient,
    ExpertSpec,
    HTTPStatusError,
    InvalidSetting,
    Item,
    Limiter,
    Outage,
    Pacer,
    RateLimit,
    Request,
    ResponseError,
    RetryPolicy,
    ScoreCache,
    Timeout,
    TransportError,
    add_expert,
    build_request,
    check_base_url,
    expert_from_url,
    experts_file,
    load_experts,
    load_template,
    parse_response,
    redact_url,
    render_conversation,
    resolve_expert,
)
from experts._serve import _interrupts_held

STAKES_V1 = Path(__file__).resolve().parents[1] / "experts" / "prompts" / "stakes-v1.toml"


# --------------------------------------------------------------------------- fake time


class FakeTime:
    """A clock that only moves when someone sleeps on it (by exactly the seconds asked). Raises
    after `max_sleeps` sleeps, so that a waiting loop that never ends fails instead of hanging."""

    def __init__(self, start: float = 1000.0, *, max_sleeps: int = 10_000) -> None:
        self.now = start
        self.sleeps: list[float] = []
        self.max_sleeps = max_sleeps

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if len(self.sleeps) > self.max_sleeps:
            raise RuntimeError(f"still waiting after {self.max_sleeps} sleeps: {self.sleeps[-3:]}")
        self.now += seconds
        await asyncio.sleep(0)


# --------------------------------------------------------------------------- Pacer, Limiter


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


# --------------------------------------------------------------------------- settings


class FixedRng(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def test_backoff_exponential_with_jitter_and_cap() -> None:
    policy = RetryPolicy(initial=0.5, multiplier=2.0, maximum=30.0, jitter=0.5)
    assert policy.backoff(1, FixedRng(0.0)) == 0.5
    assert policy.backoff(2, FixedRng(0.0)) == 1.0
    assert policy.backoff(4, FixedRng(0.0)) == 4.0
    assert policy.backoff(4, FixedRng(0.5)) == 3.0
    assert policy.backoff(20, FixedRng(0.0)) == 30.0  # capped
    rng = random.Random(7)
    for attempt in range(1, 40):
        base = min(30.0, 0.5 * 2.0 ** (attempt - 1))
        for _ in range(50):
            wait = policy.backoff(attempt, rng)
            assert base * 0.5 <= wait <= base <= 30.0
    no_jitter = RetryPolicy(initial=0.25, multiplier=3.0, maximum=5.0, jitter=0.0)
    assert [no_jitter.backoff(a, rng) for a in (1, 2, 3, 4)] == [0.25, 0.75, 2.25, 5.0]


@pytest.mark.parametrize(
    ("make", "setting"),
    [
        (lambda: RetryPolicy(max_attempts=0), "max_attempts"),
        (lambda: RetryPolicy(max_attempts=2.5), "max_attempts"),
        (lambda: RetryPolicy(jitter=1.5), "jitter"),
        (lambda: RetryPolicy(jitter=math.nan), "jitter"),
        (lambda: RetryPolicy(multiplier=0.5), "multiplier"),
        (lambda: RetryPolicy(initial=-1.0), "initial"),
        (lambda: RetryPolicy(deadline=math.nan), "deadline"),
        (lambda: RetryPolicy(maximum=math.inf), "maximum"),
        (lambda: RetryPolicy(down_after=-1), "down_after"),
        (lambda: RateLimit(concurrency=0), "concurrency"),
        (lambda: RateLimit(concurrency=True), "concurrency"),
        (lambda: RateLimit(concurrency=1.5), "concurrency"),
        (lambda: RateLimit(rpm=0), "rpm"),
        (lambda: RateLimit(rpm=math.nan), "rpm"),  # NaN compares false: it used to switch the limit off
        (lambda: RateLimit(rpm=math.inf), "rpm"),
        (lambda: RateLimit(rpm="fast"), "rpm"),
        (lambda: RateLimit(tpm=-5), "tpm"),
        (lambda: RateLimit(tpm=math.nan), "tpm"),
        (lambda: Timeout(read=0), "read"),
        (lambda: Timeout(read=math.nan), "read"),
        (lambda: Timeout(connect=math.inf), "connect"),
        (lambda: Timeout(pool="30"), "pool"),
    ],
)
def test_invalid_settings_raise_naming_the_setting(make: Any, setting: str) -> None:
    with pytest.raises(InvalidSetting) as info:
        make()
    assert info.value.setting == setting
    assert isinstance(info.value, ConfigError)
    assert str(info.value).startswith(f"{setting} = ")


def test_a_request_larger_than_the_tpm_is_refused_not_paced() -> None:
    fake = FakeTime(max_sleeps=5)

    async def main() -> None:
        limiter = Limiter(RateLimit(tpm=100), clock=fake.clock, sleep=fake.sleep)
        await limiter.admit(100)  # exactly a minute's budget: admitted
        with pytest.raises(ConfigError, match=r"about 101 tokens .* tpm = 100"):
            await limiter.admit(101)

    asyncio.run(main())
    assert fake.sleeps == []  # refused at once, not after a wait


def test_outage_trips_on_endpoint_failures_in_a_row_only() -> None:
    outage = Outage(limit=3)
    refused = TransportError("refused", reason="connection")
    for _ in range(2):
        outage.failed(refused)
    outage.answered()  # an answer between them: the count starts again
    outage.failed(HTTPStatusError(503, "overloaded"))
    outage.failed(refused)
    outage.failed(ResponseError("no label tokens", reason="no-labels"))  # it answered: up
    outage.failed(HTTPStatusError(404, "no such model"))  # a 4xx is an answer too
    assert outage.streak == 0
    outage.failed(TransportError("slow", reason="timeout"))
    outage.failed(HTTPStatusError(500, "boom"))
    with pytest.raises(EndpointDown, match=r"3 items in a row failed .*HTTP 502"):
        outage.failed(HTTPStatusError(502, "bad gateway"))


def test_an_interrupt_while_a_server_starts_is_held_then_delivered() -> None:
    """Ctrl-C inside the block (where LocalServer forks the server) is not raised there, where
    it would lose the child's handle, but right after the block, in the caller's hands."""
    finished_block = False
    with pytest.raises(KeyboardInterrupt), _interrupts_held():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler has run by now: it only recorded the signal
        finished_block = True
    assert finished_block
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_timeout_to_httpx() -> None:
    t = Timeout(connect=1.0, read=2.0, write=3.0, pool=4.0).to_httpx()
    assert (t.connect, t.read, t.write, t.pool) == (1.0, 2.0, 3.0, 4.0)


# --------------------------------------------------------------------------- prompts


def test_render_string_is_unchanged() -> None:
    text = "  Keep {braces}, trailing spaces  \nand newlines\n"
    assert render_conversation(text) == text


def test_render_messages_with_roles_and_exact_content() -> None:
    messages = [
        {"role": "user", "content": "How do I {format} this?\n  indented"},
        {"role": "assistant", "content": "Like so: {conversation} "},
        {"role": "tool", "content": ""},
    ]
    expected = (
        "[user]\nHow do I {format} this?\n  indented\n\n[assistant]\nLike so: {conversation} \n\n[tool]\n"
    )
    assert render_conversation(messages) == expected
    template = load_template("stakes-v1")
    chat = template.messages(messages)
    assert [m["role"] for m in chat] == ["system", "user"]
    assert chat[0]["content"] == template.system
    assert chat[1]["content"] == template.user.replace("{conversation}", expected)
    prompt = template.completion_prompt(messages)
    assert expected in prompt
    assert prompt.endswith("\n\nAnswer:\n")


@pytest.mark.parametrize(
    "messages",
    [
        [{"content": "no role"}],
        [{"role": "user"}],
        [{"role": "user", "content": 3}],
        [{"role": None, "content": "x"}],
        [{"role": "user", "content": "fine"}, {"role": "user", "content": ["a", "list"]}],
    ],
)
def test_render_bad_messages_raise_value_error(messages: Any) -> None:
    with pytest.raises(ValueError, match="message"):
        render_conversation(messages)


def test_render_non_mapping_message_raises_value_error() -> None:
    with pytest.raises(ValueError):
        render_conversation([{"role": "user", "content": "ok"}, "not a message"])  # type: ignore[list-item]


def test_builtin_template_loads() -> None:
    template = load_template("stakes-v1")
    assert template.name == "stakes-v1"
    assert template.labels == {"high": "high", "low": "low"}
    assert template.answers == {
        "high": "This interaction is high-stakes.",
        "low": "This interaction is low-stakes.",
    }
    assert "{conversation}" in template.user
    assert re.fullmatch(r"[0-9a-f]{64}", template.sha256)
    assert load_template(str(STAKES_V1)).sha256 == template.sha256


def test_template_hash_follows_the_file_bytes(tmp_path: Path) -> None:
    copy = tmp_path / "copy.toml"
    copy.write_text(STAKES_V1.read_text(encoding="utf-8").replace("careful reviewer", "careful judge"))
    changed = load_template(str(copy))
    assert changed.sha256 != load_template("stakes-v1").sha256
    assert "careful judge" in changed.system


def test_load_template_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_template(str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="stakes-v1"):
        load_template("no-such-template")


@pytest.mark.parametrize("drop", ["system", "user", "labels", "answers"])
def test_load_template_missing_key(tmp_path: Path, drop: str) -> None:
    data = {
        "system": 'system = "s"',
        "user": 'user = "u {conversation}"',
        "labels": '[labels]\nhigh = "high"\nlow = "low"',
        "answers": '[answers]\nhigh = "H"\nlow = "L"',
    }
    del data[drop]
    path = tmp_path / f"no-{drop}.toml"
    path.write_text("\n".join(data.values()) + "\n")
    with pytest.raises(ConfigError, match=rf"missing key '{drop}'") as info:
        load_template(str(path))
    assert str(path) in str(info.value)


def test_load_template_without_conversation_slot(tmp_path: Path) -> None:
    path = tmp_path / "noslot.toml"
    path.write_text(STAKES_V1.read_text(encoding="utf-8").replace("{conversation}", "{convo}"))
    with pytest.raises(ConfigError, match="conversation") as info:
        load_template(str(path))
    assert str(path) in str(info.value)


def test_load_template_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('system = "s"\nuser = \n')
    with pytest.raises(ConfigError, match="line 2") as info:
        load_template(str(path))
    assert str(path) in str(info.value)


# --------------------------------------------------------------------------- build_request


def test_build_request_next_token() -> None:
    template = load_template("stakes-v1")
    request = build_request("next-token", template, "item text", "served/model", top_logprobs=7)
    assert request.path == "/chat/completions"
    expected = {
        "model": "served/model",
        "messages": template.messages("item text"),
        "max_tokens": 1,
        "temperature": 0.0,
        "logprobs": True,
        "top_logprobs": 7,
    }
    assert request.bodies == (expected,)
    assert request.body == expected
    chars = sum(len(m["content"]) for m in template.messages("item text"))
    assert request.prompt_chars == chars
    assert request.tokens == chars // 4 + 1


def test_build_request_likelihood() -> None:
    template = load_template("stakes-v1")
    request = build_request("likelihood", template, "item text", "served/model", top_logprobs=7)
    prompt = template.completion_prompt("item text")
    assert request.path == "/completions"
    # One completions request per answer (high first), each echoing the prompt's logprobs.
    assert request.bodies == tuple(
        {
            "model": "served/model",
            "prompt": prompt + answer,
            "max_tokens": 1,
            "temperature": 0.0,
            "echo": True,
            "logprobs": 1,
        }
        for answer in ("This interaction is high-stakes.", "This interaction is low-stakes.")
    )
    assert request.prompt_chars == len(prompt)
    assert request.tokens == 2 * (len(prompt) // 4 + 16)


def test_build_request_unknown_method() -> None:
    with pytest.raises(ValueError, match="unknown scoring method"):
        build_request("vibes", load_template("stakes-v1"), "x", "m", top_logprobs=5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- parse_response


def chat_answer(top: list[dict[str, Any]]) -> dict[str, Any]:
    return {"choices": [{"index": 0, "logprobs": {"content": [{"token": "x", "top_logprobs": top}]}}]}


def test_next_token_aggregates_label_variants() -> None:
    template = load_template("stakes-v1")
    request = build_request("next-token", template, "x", "m", top_logprobs=20)
    top = [
        {"token": " high", "logprob": math.log(0.20)},
        {"token": "High", "logprob": math.log(0.10)},
        {"token": "HIGH", "logprob": math.log(0.05)},
        {"token": "Ġhigh", "logprob": math.log(0.05)},
        {"token": "▁low", "logprob": math.log(0.25)},
        {"token": "low", "logprob": math.log(0.05)},
        {"token": "highly", "logprob": math.log(0.10)},  # not a label
        {"token": " lower", "logprob": math.log(0.10)},  # not a label
        {"token": "medium", "logprob": math.log(0.10)},
    ]
    score = parse_response("next-token", [chat_answer(top)], template, request)
    assert score.p == pytest.approx(0.4 / 0.7, abs=1e-12)
    assert score.label_mass == pytest.approx(0.7, abs=1e-12)


def test_next_token_only_one_label_present() -> None:
    template = load_template("stakes-v1")
    request = build_request("next-token", template, "x", "m", top_logprobs=20)
    score = parse_response(
        "next-token", [chat_answer([{"token": "Low", "logprob": -0.5}])], template, request
    )
    assert score.p == 0.0
    assert score.label_mass == pytest.approx(math.exp(-0.5))


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (
            chat_answer([{"token": "maybe", "logprob": -0.1}, {"token": "perhaps", "logprob": -2.0}]),
            "no-label-mass",
        ),
        (chat_answer([]), "no-label-mass"),
        ({"choices": [{"message": {"content": "high"}}]}, "no-logprobs"),
        ({"choices": [{"logprobs": None}]}, "no-logprobs"),
        ({"choices": [{"logprobs": {"content": []}}]}, "no-logprobs"),
        ({"choices": []}, "no-logprobs"),
        ({}, "no-logprobs"),
        ([], "no-logprobs"),
        (None, "no-logprobs"),
        (chat_answer([{"token": "high"}]), "no-logprobs"),
        (chat_answer([{"token": "high", "logprob": "not a number"}]), "no-logprobs"),
    ],
)
def test_next_token_errors(payload: Any, reason: str) -> None:
    template = load_template("stakes-v1")
    request = build_request("next-token", template, "x", "m", top_logprobs=20)
    with pytest.raises(ResponseError) as info:
        parse_response("next-token", [payload], template, request)
    assert info.value.reason == reason
    assert info.value.retryable


def likelihood_answer(prompt_chars: int, answer: str, token_lls: list[float]) -> dict[str, Any]:
    """An echo answer: a prompt token at 0 (no logprob), one ending just before the answer, the
    answer's words, then the generated token (which scoring must ignore)."""
    words = re.findall(r"\S+\s*", answer)
    assert len(words) == len(token_lls)
    offsets = [0, prompt_chars - 3]
    offsets += [prompt_chars + sum(len(w) for w in words[:k]) for k in range(len(words))]
    offsets.append(prompt_chars + len(answer))
    choice = {
        "index": 0,
        "logprobs": {
            "tokens": ["<p>", "<p2>", *words, "gen"],
            "text_offset": offsets,
            "token_logprobs": [None, -50.0, *token_lls, -99.0],
        },
    }
    return {"choices": [choice]}


def likelihood_answers(request: Request, high: list[float], low: list[float]) -> list[dict[str, Any]]:
    template = load_template("stakes-v1")
    return [
        likelihood_answer(request.prompt_chars, template.answers["high"], high),
        likelihood_answer(request.prompt_chars, template.answers["low"], low),
    ]


def test_likelihood_softmax_over_the_answer_tokens() -> None:
    template = load_template("stakes-v1")
    request = build_request("likelihood", template, "x", "m", top_logprobs=20)
    high = [-0.1, -0.2, -0.3, -1.0]
    low = [-0.1, -0.2, -0.3, -2.5]
    score = parse_response("likelihood", likelihood_answers(request, high, low), template, request)
    expected = math.exp(sum(high)) / (math.exp(sum(high)) + math.exp(sum(low)))
    assert score.p == pytest.approx(expected, abs=1e-12)
    assert score.label_mass is None
    # The answers are matched by position (high first), not by their text.
    swapped = parse_response("likelihood", likelihood_answers(request, low, high), template, request)
    assert swapped.p == pytest.approx(1 - expected, abs=1e-12)


def test_likelihood_extreme_differences_do_not_overflow() -> None:
    template = load_template("stakes-v1")
    request = build_request("likelihood", template, "x", "m", top_logprobs=20)

    def p(high: float, low: float) -> float:
        answers = likelihood_answers(request, [high, 0.0, 0.0, 0.0], [low, 0.0, 0.0, 0.0])
        return parse_response("likelihood", answers, template, request).p

    assert p(-2000.0, -1.0) == pytest.approx(0.0)
    assert p(-1.0, -2000.0) == 1.0


@pytest.mark.parametrize(
    "case", ["no-logprobs", "one-answer", "no-choices", "none-in-answer", "no-answer-tokens", "not-objects"]
)
def test_likelihood_errors(case: str) -> None:
    template = load_template("stakes-v1")
    request = build_request("likelihood", template, "x", "m", top_logprobs=20)
    answers: list[Any] = likelihood_answers(request, [-1.0] * 4, [-1.0] * 4)
    if case == "no-logprobs":
        del answers[1]["choices"][0]["logprobs"]
    elif case == "one-answer":
        answers = answers[:1]
    elif case == "no-choices":
        answers[0] = {"choices": []}
    elif case == "none-in-answer":
        answers[1]["choices"][0]["logprobs"]["token_logprobs"][3] = None
    elif case == "no-answer-tokens":  # every echoed token lies in the prompt
        logprobs = answers[0]["choices"][0]["logprobs"]
        logprobs["text_offset"] = [0] * len(logprobs["text_offset"])
    else:
        answers = [{"choices": ["not", "objects"]}, {"choices": ["x"]}]
    with pytest.raises(ResponseError) as info:
        parse_response("likelihood", answers, template, request)
    assert info.value.reason == "no-logprobs"


# --------------------------------------------------------------------------- registry


@pytest.fixture
def experts_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config" / "experts.toml"
    monkeypatch.setenv("CTD_EXPERTS_FILE", str(path))
    for spec in BUILTIN_EXPERTS.values():
        if spec.base_url_env:
            monkeypatch.delenv(spec.base_url_env, raising=False)
    return path


def test_builtin_experts(experts_toml: Path) -> None:
    assert experts_file() == experts_toml
    experts = load_experts()  # the file does not exist: built-ins only
    assert set(experts) == {"gemma-27b", "llama-1b", "smollm2"}
    assert experts["gemma-27b"].model == "google/gemma-3-27b-it"
    assert experts["llama-1b"].model == "meta-llama/Llama-3.2-1B-Instruct"
    assert experts["smollm2"].model == "smollm2"
    for spec in experts.values():
        assert spec.method in ("next-token", "likelihood")
        assert spec.base_urls and all(u.startswith("http://127.0.0.1:") for u in spec.base_urls)
        load_template(spec.template)
    with pytest.raises(ConfigError, match="unknown expert 'nope'"):
        resolve_expert("nope")


def test_base_url_override_by_environment(experts_toml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = resolve_expert("gemma-27b")
    assert spec.base_url_env == "CTD_GEMMA_27B_URL"
    assert spec.resolved_urls() == ("http://127.0.0.1:8000/v1",)
    monkeypatch.setenv("CTD_GEMMA_27B_URL", "http://10.0.0.2:9000/v1/, http://10.0.0.1:9000/v1")
    assert spec.resolved_urls() == ("http://10.0.0.2:9000/v1/", "http://10.0.0.1:9000/v1")
    assert spec.endpoint_id() == "http://10.0.0.1:9000/v1,http://10.0.0.2:9000/v1"


def test_user_file_adds_and_overrides(experts_toml: Path) -> None:
    experts_toml.parent.mkdir(parents=True)
    experts_toml.write_text(
        "[experts.judge]\n"
        'base_urls = ["http://127.0.0.1:9001/v1", "http://127.0.0.1:9002/v1"]\n'
        'model = "Qwen/Qwen2.5-7B-Instruct"\n'
        'api_key_env = "MY_JUDGE_KEY"\n'
        'method = "likelihood"\n'
        "concurrency = 32\n"
        "rpm = 600\n"
        "tpm = 500000\n"
        "timeout = 5.5\n"
        "max_attempts = 3\n"
        "\n"
        '[experts."smollm2"]\n'
        'base_url = "http://127.0.0.1:7777/v1"\n'
        'model = "other"\n'
    )
    experts = load_experts()
    judge = experts["judge"]
    assert judge.base_urls == ("http://127.0.0.1:9001/v1", "http://127.0.0.1:9002/v1")
    assert judge.model == "Qwen/Qwen2.5-7B-Instruct"
    assert judge.api_key_env == "MY_JUDGE_KEY"
    assert judge.method == "likelihood"
    assert judge.rate == RateLimit(concurrency=32, rpm=600, tpm=500000)
    assert judge.timeout.read == 5.5
    assert judge.retry.max_attempts == 3
    assert judge.source == str(experts_toml)
    assert experts["smollm2"].base_urls == ("http://127.0.0.1:7777/v1",)
    assert experts["smollm2"].model == "other"
    assert experts["gemma-27b"] == BUILTIN_EXPERTS["gemma-27b"]


GOOD_ENTRY = '[experts.good]\nbase_url = "http://127.0.0.1:1/v1"\nmodel = "m"\n\n'


@pytest.mark.parametrize(
    ("bad", "line", "match"),
    [
        # line numbers count GOOD_ENTRY's four lines
        (
            '[experts.bad]\nbase_url = "http://x/v1"\nmodel = "m"\ncolour = "blue"\n',
            8,
            "unknown key 'colour'",
        ),
        ('[experts.bad]\nbase_url = "http://x/v1"\nmethod = "next-token"\n', 5, "missing 'model'"),
        ('[experts.bad]\nmodel = "m"\n', 5, "missing 'base_url'"),
        ('[experts.bad]\nbase_url = "http://x/v1"\nmodel = "m"\n\nmethod = "vibes"\n', 9, "method = 'vibes'"),
        ('[experts.bad]\nbase_url = "http://x/v1"\nmodel = \n', 7, "Invalid value"),
        ('[experts.bad]\nbase_url = "http://x/v1"\nmodel = "m"\nconcurrency = 0\n', 8, "concurrency = 0"),
        ("[other]\nx = 1\n", None, r"unknown section \[other\]"),
        *[
            ('[experts.bad]\nbase_url = "http://x/v1"\nmodel = "m"\n' + setting + "\n", 8, match)
            for setting, match in [
                ("rpm = nan", r"rpm = nan: must be a number per minute above 0"),
                ("tpm = inf", r"tpm = inf: must be a number per minute above 0"),
                ('rpm = "fast"', r"rpm = 'fast': must be a number"),
                ("timeout = nan", r"timeout = nan: must be a number of seconds above 0"),
                ("concurrency = 2.5", r"concurrency = 2.5: must be a whole number"),
                ("top_logprobs = 0", r"top_logprobs = 0"),
                ("max_attempts = true", r"max_attempts = True"),
                ('api_key_env = "sk-live-123"', r"api_key_env = '\*\*\*': must name an environment variable"),
                ('server = "docker"', r"server = 'docker'"),
            ]
        ],
        ('[experts.bad]\nmodel = "m"\nbase_url = 5\n', 7, r"base_url = 5: must be a URL like http://"),
        (
            '[experts.bad]\nmodel = "m"\nbase_url = "ftp//nope"\n',
            7,
            r"base_url = 'ftp//nope': must start with",
        ),
        ('[experts.bad]\nmodel = "m"\nbase_urls = "http://x/v1"\n', 7, r"base_urls = .*must be a list"),
        ('[experts.bad]\nmodel = "m"\nbase_urls = ["http://x/v1", "x"]\n', 7, r"base_urls = 'x'"),
        ('[experts.bad]\nmodel = "m"\nbase_url = "http://x/v1?key=1"\n', 7, r"no \?query"),
        (
            '[experts.bad]\nmodel = "m"\nbase_url = "http://me:s3cret@x:8000/v1"\n',
            7,
            r"base_url = 'http://\*\*\*@x:8000/v1': credentials in the URL are refused.*--api-key-env",
        ),
    ],
)
def test_user_file_errors_name_file_and_line(
    experts_toml: Path, bad: str, line: int | None, match: str
) -> None:
    experts_toml.parent.mkdir(parents=True)
    experts_toml.write_text(GOOD_ENTRY + bad)
    with pytest.raises(ConfigError, match=match) as info:
        load_experts()
    message = str(info.value)
    assert str(experts_toml) in message and "s3cret" not in message and "sk-live" not in message
    assert "\n" not in message
    if line is not None:
        assert re.search(rf"(:{line}:|line {line}\b)", message), message


def test_add_expert_round_trip(experts_toml: Path) -> None:
    add_expert("alpha", {"base_url": "http://127.0.0.1:9001/v1", "model": "a-model", "rpm": 600})
    add_expert(
        "beta",
        {
            "base_urls": ["http://127.0.0.1:9002/v1", "http://127.0.0.1:9003/v1"],
            "model": 'quote"d\\model',
            "api_key_env": "BETA_KEY",
            "method": "likelihood",
            "tpm": None,  # None values are left out
        },
    )
    experts = load_experts()
    assert experts["alpha"].model == "a-model"
    assert experts["alpha"].rate.rpm == 600
    assert experts["beta"].model == 'quote"d\\model'
    assert experts["beta"].base_urls == ("http://127.0.0.1:9002/v1", "http://127.0.0.1:9003/v1")
    assert experts["beta"].method == "likelihood"
    assert experts["beta"].rate.tpm is None
    before_beta = load_experts()["beta"]

    # Replace alpha: beta stays as it was; alpha appears once, with its new values.
    add_expert("alpha", {"base_url": "http://127.0.0.1:9009/v1", "model": "a2", "concurrency": 3})
    text = experts_toml.read_text()
    assert text.count('[experts."alpha"]') == 1
    assert text.count('[experts."beta"]') == 1
    experts = load_experts()
    assert experts["alpha"].model == "a2"
    assert experts["alpha"].base_urls == ("http://127.0.0.1:9009/v1",)
    assert experts["alpha"].rate == RateLimit(concurrency=3)
    assert experts["beta"] == before_beta
    assert set(experts) == {"gemma-27b", "llama-1b", "smollm2", "alpha", "beta"}


def test_add_expert_rejects_bad_entries_and_leaves_the_file(experts_toml: Path) -> None:
    add_expert("keep", {"base_url": "http://127.0.0.1:9001/v1", "model": "m"})
    before = experts_toml.read_bytes()
    with pytest.raises(ConfigError, match="unknown key"):
        add_expert("bad", {"base_url": "http://127.0.0.1:9001/v1", "model": "m", "colour": "red"})
    with pytest.raises(ConfigError, match="method"):
        add_expert("bad", {"base_url": "http://127.0.0.1:9001/v1", "model": "m", "method": "vibes"})
    with pytest.raises(ConfigError, match="expert name"):
        add_expert("bad name!", {"base_url": "http://127.0.0.1:9001/v1", "model": "m"})
    assert experts_toml.read_bytes() == before


@pytest.mark.parametrize(
    ("change", "setting"),
    [
        ({"rpm": math.nan}, "rpm"),
        ({"tpm": -1}, "tpm"),
        ({"concurrency": 0}, "concurrency"),
        ({"template": "nosuch"}, "template"),
        ({"template": "missing.toml"}, "template"),
        ({"base_urls": ["ftp//nope"]}, "base_urls"),
        ({"base_urls": ["http://ok/v1", "http://user:pw@host/v1"]}, "base_urls"),
        ({"base_urls": []}, "base_urls"),
        ({"model": ""}, "model"),
        ({"model": "a\nb", "rpm": "fast"}, "rpm"),
    ],
)
def test_add_expert_refuses_a_bad_value_and_writes_nothing(
    experts_toml: Path, change: dict[str, Any], setting: str
) -> None:
    add_expert("keep", {"base_url": "http://127.0.0.1:9001/v1", "model": "m"})
    before = experts_toml.read_bytes()
    entry = {"base_urls": ["http://127.0.0.1:9002/v1"], "model": "m", **change}
    with pytest.raises(InvalidSetting) as info:
        add_expert("new", entry)
    assert info.value.setting == setting
    assert "pw" not in str(info.value)
    assert experts_toml.read_bytes() == before
    assert not experts_toml.with_suffix(".toml.tmp").exists()


def test_add_expert_writes_a_template_path_absolute(
    experts_toml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mine.toml").write_bytes(STAKES_V1.read_bytes())
    monkeypatch.chdir(tmp_path)
    add_expert("mine", {"base_url": "http://127.0.0.1:9001/v1", "model": "m", "template": "mine.toml"})
    monkeypatch.chdir(experts_toml.parent.parent.parent)  # elsewhere: the entry still loads
    assert load_experts()["mine"].template == str(tmp_path / "mine.toml")
    add_expert("builtin", {"base_url": "http://127.0.0.1:9001/v1", "model": "m", "template": "stakes-v1"})
    assert load_experts()["builtin"].template == "stakes-v1"


def test_add_expert_escapes_control_characters(experts_toml: Path) -> None:
    add_expert("odd", {"base_url": "http://127.0.0.1:9001/v1", "model": 'a\tb\x7f"c\\'})
    assert load_experts()["odd"].model == 'a\tb\x7f"c\\'


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:pass@host:8000/v1", "http://***@host:8000/v1"),
        ("https://token@host/v1", "https://***@host/v1"),
        ("http://user:pa/ss@host/v1", "http://***@host/v1"),  # a '/' in the password
        ("user:pass@host/v1", "***@host/v1"),  # no scheme at all
        ("http://host:8000/v1", "http://host:8000/v1"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://user:pass@host:8000/v1", "credentials in the URL are refused"),
        ("https://token@host/v1", "credentials"),
        ("http://user:pa/ss@host/v1", "credentials"),
        ("ftp//nope", "must start with http:// or https://"),
        ("ftp://host/v1", "must start with http"),
        ("http:///v1", "and a host"),
        ("http://host:port/v1", "not a valid URL"),
        ("http://[::1/v1", "not a valid URL"),
        ("http://host/v1?api_key=abc", "no ?query"),
        ("http://host/v1#x", "#fragment"),
        (5, "must be a URL"),
        (None, "must be a URL"),
    ],
)
def test_check_base_url_refuses(url: Any, problem: str) -> None:
    with pytest.raises(InvalidSetting) as info:
        check_base_url(url, "--url")
    assert problem in info.value.problem
    assert str(info.value).startswith("--url ")
    assert "pass" not in str(info.value) and "ss@" not in str(info.value)


def test_urls_with_credentials_are_refused_where_they_enter(
    experts_toml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for url in ("http://127.0.0.1:8000/v1", "HTTPS://[::1]:8443/v1/", "http://host/"):
        assert check_base_url(url) == url
    with pytest.raises(InvalidSetting, match=r"base_urls = 'http://\*\*\*@h/v1'"):
        expert_from_url("http://u:secret@h/v1", "m")
    with pytest.raises(InvalidSetting, match="credentials"):
        Endpoint(["http://u:secret@h/v1"])
    monkeypatch.setenv("CTD_GEMMA_27B_URL", "http://10.0.0.1:9000/v1, http://u:secret@10.0.0.2/v1")
    with pytest.raises(InvalidSetting, match=r"\$CTD_GEMMA_27B_URL = 'http://\*\*\*@10.0.0.2/v1'"):
        resolve_expert("gemma-27b").resolved_urls()
    monkeypatch.setenv("CTD_GEMMA_27B_URL", " , ")
    with pytest.raises(InvalidSetting, match="names no URL"):
        resolve_expert("gemma-27b").resolved_urls()


def test_add_expert_with_a_dotted_name(experts_toml: Path) -> None:
    add_expert("my.judge", {"base_url": "http://127.0.0.1:9001/v1", "model": "m"})
    assert load_experts()["my.judge"].model == "m"


# --------------------------------------------------------------------------- CacheKey


def key_fields(**changes: Any) -> dict[str, Any]:
    fields = {
        "endpoint": "http://127.0.0.1:8000/v1",
        "model": "served/model",
        "method": "next-token",
        "labels": {"high": "high", "low": "low"},
        "template_sha256": "a" * 64,
        "body": {"model": "served/model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    }
    fields.update(changes)
    return fields


def test_cache_key_is_stable() -> None:
    a = CacheKey(**key_fields()).digest()
    b = CacheKey(**key_fields()).digest()
    assert a == b
    assert re.fullmatch(r"[0-9a-f]{64}", a)
    # Dict order does not matter.
    reordered = key_fields(
        body={"max_tokens": 1, "messages": [{"content": "hi", "role": "user"}], "model": "served/model"},
        labels={"low": "low", "high": "high"},
    )
    assert CacheKey(**reordered).digest() == a


@pytest.mark.parametrize(
    "change",
    [
        {"endpoint": "http://127.0.0.1:8001/v1"},
        {"endpoint": "http://127.0.0.1:8000/v1,http://127.0.0.1:8001/v1"},
        {"model": "other/model"},
        {"method": "likelihood"},
        {"labels": {"high": "yes", "low": "no"}},
        {"template_sha256": "b" * 64},
        {
            "body": {
                "model": "served/model",
                "messages": [{"role": "user", "content": "hi!"}],
                "max_tokens": 1,
            }
        },
        {"body": {"model": "served/model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}},
    ],
)
def test_cache_key_changes_with_each_field(change: dict[str, Any]) -> None:
    assert CacheKey(**key_fields(**change)).digest() != CacheKey(**key_fields()).digest()


def test_cache_key_changes_with_schema_version(monkeypatch: pytest.MonkeyPatch) -> None:
    before = CacheKey(**key_fields()).digest()
    monkeypatch.setattr(cache_module, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    assert CacheKey(**key_fields()).digest() != before


def test_cache_key_has_no_field_for_an_api_key() -> None:
    names = {f.name for f in dataclasses.fields(CacheKey)}
    assert names == {"endpoint", "model", "method", "labels", "template_sha256", "body"}


def test_client_cache_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    template_copy = tmp_path / "stakes-copy.toml"
    template_copy.write_bytes(STAKES_V1.read_bytes() + b"\n# a comment changes the hash\n")
    base = ExpertSpec(
        name="k", base_urls=("http://127.0.0.1:9/v1",), model="m", api_key_env="CTD_UNIT_TEST_KEY"
    )
    item = Item("i", "some input")

    def key(spec: ExpertSpec) -> str:
        return ExpertClient(spec, cache=None).request_for(item)[1]

    monkeypatch.setenv("CTD_UNIT_TEST_KEY", "sk-one")
    first = key(base)
    monkeypatch.setenv("CTD_UNIT_TEST_KEY", "sk-two")
    assert key(base) == first
    monkeypatch.delenv("CTD_UNIT_TEST_KEY")
    assert key(base) == first
    # Settings that do not change the answer do not change the key.
    same = dataclasses.replace(
        base,
        name="other-name",
        api_key_env="ANOTHER_VAR",
        rate=RateLimit(concurrency=1, rpm=5),
        timeout=Timeout(read=1.0),
        retry=RetryPolicy(max_attempts=1),
    )
    assert key(same) == first
    # What can change the answer does.
    for changed in (
        dataclasses.replace(base, model="m2"),
        dataclasses.replace(base, method="likelihood"),
        dataclasses.replace(base, base_urls=("http://127.0.0.1:10/v1",)),
        dataclasses.replace(base, top_logprobs=5),
        dataclasses.replace(base, base_urls=("http://127.0.0.1:9/v1", "http://127.0.0.1:8/v1")),
        dataclasses.replace(base, template=str(template_copy)),
    ):
        assert key(changed) != first
    assert ExpertClient(base, cache=None).request_for(Item("i", "other input"))[1] != first
    # The item id is not part of the key: the same input under another id is the same request.
    assert ExpertClient(base, cache=None).request_for(Item("j", "some input"))[1] == first
    monkeypatch.setenv("CTD_UNIT_TEST_URL", "http://127.0.0.1:11/v1")
    assert key(dataclasses.replace(base, base_url_env="CTD_UNIT_TEST_URL")) != first


# --------------------------------------------------------------------------- Endpoint


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def one_request(handler: Any, **kwargs: Any) -> Any:
    async with Endpoint(["http://a.test/v1/"], transport=httpx.MockTransport(handler), **kwargs) as endpoint:
        return await endpoint.request("POST", "/chat/completions", {"x": 1})


def test_endpoint_returns_parsed_json_and_posts_the_body() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True})

    payload, seconds = run(one_request(handler))
    assert payload == {"ok": True}
    assert seconds >= 0
    assert str(seen[0].url) == "http://a.test/v1/chat/completions"
    assert seen[0].method == "POST"
    assert json.loads(seen[0].content) == {"x": 1}


@pytest.mark.parametrize("value", ["7", "7.5"])
def test_429_retry_after_seconds(value: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, json={"error": "slow down"}, headers={"Retry-After": value})

    with pytest.raises(HTTPStatusError) as info:
        run(one_request(handler))
    assert info.value.status == 429
    assert info.value.retryable
    assert info.value.reason == "http-429"
    assert info.value.retry_after == float(value)


def test_429_retry_after_http_date() -> None:
    when = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": when})

    with pytest.raises(HTTPStatusError) as info:
        run(one_request(handler))
    assert info.value.retry_after is not None
    assert 27.0 <= info.value.retry_after <= 30.5

    past = email.utils.format_datetime(datetime.now(UTC) - timedelta(seconds=30), usegmt=True)
    with pytest.raises(HTTPStatusError) as info:
        run(one_request(lambda r: httpx.Response(429, headers={"Retry-After": past})))
    assert info.value.retry_after == 0.0
    with pytest.raises(HTTPStatusError) as info:
        run(one_request(lambda r: httpx.Response(429, headers={"Retry-After": "soon"})))
    assert info.value.retry_after is None
    with pytest.raises(HTTPStatusError) as info:
        run(one_request(lambda r: httpx.Response(429)))
    assert info.value.retry_after is None


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (400, False),
        (401, False),
        (404, False),
        (408, True),
        (500, True),
        (502, True),
        (503, True),
        (504, True),
    ],
)
def test_status_errors(status: int, retryable: bool) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, text="detail text")

    with pytest.raises(HTTPStatusError) as info:
        run(one_request(handler))
    assert info.value.status == status
    assert info.value.retryable is retryable
    assert info.value.reason == f"http-{status}"
    assert "detail text" in str(info.value)


def test_non_json_body_is_malformed() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b'{"choices": [', headers={"content-type": "application/json"})

    with pytest.raises(ResponseError) as info:
        run(one_request(handler))
    assert info.value.reason == "malformed-json"
    assert info.value.retryable


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (httpx.ConnectError("refused"), "connection"),
        (httpx.RemoteProtocolError("server disconnected"), "connection"),
        (httpx.ReadError("reset"), "connection"),
        (httpx.ReadTimeout("slow"), "timeout"),
        (httpx.ConnectTimeout("slow"), "timeout"),
        (httpx.PoolTimeout("busy"), "timeout"),
    ],
)
def test_transport_errors(exc: Exception, reason: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    with pytest.raises(TransportError) as info:
        run(one_request(handler))
    assert info.value.reason == reason
    assert info.value.retryable


def test_authorization_header_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    headers: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        headers.append(request.headers.get("authorization"))
        return httpx.Response(200, json={})

    monkeypatch.setenv("CTD_UNIT_TEST_KEY", "sk-unit-1")
    run(one_request(handler, api_key_env="CTD_UNIT_TEST_KEY"))
    monkeypatch.setenv("CTD_UNIT_TEST_KEY", "sk-unit-2")
    run(one_request(handler, api_key_env="CTD_UNIT_TEST_KEY"))
    monkeypatch.delenv("CTD_UNIT_TEST_KEY")
    run(one_request(handler, api_key_env="CTD_UNIT_TEST_KEY"))
    monkeypatch.setenv("CTD_UNIT_TEST_KEY", "")
    run(one_request(handler, api_key_env="CTD_UNIT_TEST_KEY"))
    run(one_request(handler))
    assert headers == ["Bearer sk-unit-1", "Bearer sk-unit-2", None, None, None]


def test_endpoint_reads_the_key_at_each_request_and_stores_it_nowhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={})

    async def main() -> None:
        monkeypatch.setenv("CTD_UNIT_TEST_KEY", "sk-first")
        async with Endpoint(
            ["http://a.test/v1"], api_key_env="CTD_UNIT_TEST_KEY", transport=httpx.MockTransport(handler)
        ) as endpoint:
            await endpoint.request("POST", "/x", {})
            assert "sk-first" not in repr(vars(endpoint))
            monkeypatch.setenv("CTD_UNIT_TEST_KEY", "sk-second")
            await endpoint.request("POST", "/x", {})

    run(main())
    assert seen == ["Bearer sk-first", "Bearer sk-second"]


def test_replicas_alternate_when_idle() -> None:
    hosts: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host)
        return httpx.Response(200, json={})

    async def main() -> None:
        async with Endpoint(
            ["http://a.test/v1", "http://b.test/v1"], transport=httpx.MockTransport(handler)
        ) as endpoint:
            for _ in range(6):
                await endpoint.request("POST", "/chat/completions", {})

    run(main())
    assert hosts == ["a.test", "b.test"] * 3


def test_replicas_prefer_the_least_busy() -> None:
    hosts: list[str] = []

    async def main() -> None:
        gate = asyncio.Event()
        entered = asyncio.Event()

        async def handler(request: httpx.Request) -> httpx.Response:
            hosts.append(request.url.host)
            if request.url.host == "a.test":
                entered.set()
                await gate.wait()
            return httpx.Response(200, json={})

        async with Endpoint(
            ["http://a.test/v1", "http://b.test/v1"], transport=httpx.MockTransport(handler)
        ) as endpoint:
            slow = asyncio.create_task(endpoint.request("POST", "/chat/completions", {}))
            await asyncio.wait_for(entered.wait(), 5)
            # a.test holds one request: round-robin would send every other request there.
            for _ in range(4):
                await endpoint.request("POST", "/chat/completions", {})
            gate.set()
            await asyncio.wait_for(slow, 5)
            await endpoint.request("POST", "/chat/completions", {})
            await endpoint.request("POST", "/chat/completions", {})

    run(main())
    assert hosts[:5] == ["a.test", "b.test", "b.test", "b.test", "b.test"]
    assert sorted(hosts[5:]) == ["a.test", "b.test"]


def test_endpoint_needs_a_base_url() -> None:
    with pytest.raises(ConfigError):
        Endpoint([])


# --------------------------------------------------------------------------- the client's retry loop


def chat_ok(p: float) -> dict[str, Any]:
    return {
        "choices": [
            {
                "index": 0,
                "logprobs": {
                    "content": [
                        {
                            "token": "high",
                            "top_logprobs": [
                                {"token": "high", "logprob": math.log(p)},
                                {"token": "low", "logprob": math.log(1 - p)},
                            ],
                        }
                    ]
                },
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1},
    }


def unit_spec(**changes: Any) -> ExpertSpec:
    spec = ExpertSpec(
        name="unit",
        base_urls=("http://a.test/v1",),
        model="m",
        rate=RateLimit(concurrency=2),
        retry=RetryPolicy(
            max_attempts=4, initial=1.0, multiplier=2.0, maximum=10.0, jitter=0.0, deadline=1000
        ),
    )
    return dataclasses.replace(spec, **changes)


def run_client(spec: ExpertSpec, handler: Any, items: list[Item]) -> tuple[Any, Any, FakeTime]:
    fake = FakeTime()
    client = ExpertClient(
        spec, cache=None, transport=httpx.MockTransport(handler), clock=fake.clock, sleep=fake.sleep
    )
    results, stats = asyncio.run(client.score(items))
    return results, stats, fake


def item_of(request: httpx.Request) -> int:
    body = json.loads(request.content)
    text = body["messages"][1]["content"] if "messages" in body else body["prompt"]
    return int(re.search(r"item-(\d+)", text).group(1))  # type: ignore[union-attr]


def test_client_honours_retry_after_and_backoff() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            return httpx.Response(429, headers={"Retry-After": "7"})
        if calls == 2:
            return httpx.Response(503)
        return httpx.Response(200, json=chat_ok(0.25))

    results, stats, fake = run_client(unit_spec(), handler, [Item("a", "item-1")])
    assert calls == 3
    assert fake.sleeps == [7.0, 2.0]  # Retry-After beats backoff 1.0; then backoff of attempt 2
    assert results[0].source == "expert"
    assert results[0].score == pytest.approx(0.25)
    assert results[0].attempts == 3
    assert stats.retries == 2
    assert stats.rate_limited == 1
    assert stats.errors_seen == {"http-429": 1, "http-503": 1}


def test_client_attempt_cap_and_non_retryable_errors() -> None:
    counts: dict[int, int] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        item = item_of(request)
        counts[item] = counts.get(item, 0) + 1
        if item == 1:
            return httpx.Response(500)
        if item == 2:
            return httpx.Response(400, text="bad request")
        if item == 3:
            raise httpx.ConnectError("refused")
        if item == 4:
            return httpx.Response(200, json={"choices": [{"message": {"content": "high"}}]})
        return httpx.Response(200, json=chat_ok(0.5 + item / 100))

    items = [Item(f"id{i}", f"input item-{i}") for i in range(8)]
    results, stats, _ = run_client(unit_spec(), handler, items)
    assert [r.id for r in results] == [f"id{i}" for i in range(8)]
    assert counts == {0: 1, 1: 4, 2: 1, 3: 4, 4: 4, 5: 1, 6: 1, 7: 1}
    by_id = {r.id: r for r in results}
    assert (by_id["id1"].source, by_id["id1"].reason, by_id["id1"].attempts) == ("failed", "http-500", 4)
    assert (by_id["id2"].source, by_id["id2"].reason, by_id["id2"].attempts) == ("failed", "http-400", 1)
    assert (by_id["id3"].source, by_id["id3"].reason) == ("failed", "connection")
    assert (by_id["id4"].source, by_id["id4"].reason) == ("failed", "no-logprobs")
    for i in (0, 5, 6, 7):
        assert by_id[f"id{i}"].score == pytest.approx(0.5 + i / 100)
        assert by_id[f"id{i}"].reason is None
    for i in (1, 2, 3, 4):
        assert by_id[f"id{i}"].score is None
    assert stats.failed == 4
    assert stats.scored == 4
    assert stats.failure_reasons == {"http-500": 1, "http-400": 1, "connection": 1, "no-logprobs": 1}


def test_client_deadline_stops_retrying() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(503)

    spec = unit_spec(
        retry=RetryPolicy(max_attempts=10, initial=4.0, multiplier=2.0, maximum=100, jitter=0.0, deadline=10)
    )
    results, _, fake = run_client(spec, handler, [Item("a", "item-1")])
    # Attempt 1 fails at t=0 and waits 4 s; attempt 2 would wait 8 s more, past the 10 s deadline.
    assert calls == 2
    assert fake.sleeps == [4.0]
    assert results[0].source == "failed"
    assert results[0].attempts == 2


def test_client_releases_slots_when_every_request_fails() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow")

    spec = unit_spec(
        rate=RateLimit(concurrency=1),
        retry=RetryPolicy(max_attempts=3, initial=0.01, jitter=0.0, down_after=1000),
    )
    items = [Item(f"id{i}", f"item-{i}") for i in range(20)]

    async def main() -> Any:
        fake = FakeTime()
        client = ExpertClient(
            spec, cache=None, transport=httpx.MockTransport(handler), clock=fake.clock, sleep=fake.sleep
        )
        return await asyncio.wait_for(client.score(items), 10)

    results, stats = asyncio.run(main())
    assert [r.id for r in results] == [i.id for i in items]
    assert all(r.source == "failed" and r.reason == "timeout" and r.attempts == 3 for r in results)
    assert stats.failed == 20


def test_client_stops_when_the_endpoint_is_down(tmp_path: Path) -> None:
    """Every request refused: after `down_after` items (default max(8, 2 x concurrency)) the run
    ends with EndpointDown instead of paying each remaining item its retries, and the failures
    so far are in the ledger."""
    sent = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal sent
        sent += 1
        raise httpx.ConnectError("connection refused")

    spec = unit_spec(rate=RateLimit(concurrency=1), retry=RetryPolicy(max_attempts=3, initial=0.01))
    items = [Item(f"id{i}", f"item-{i}") for i in range(50)]
    cache = ScoreCache(tmp_path / "cache.db")

    async def main() -> Any:
        fake = FakeTime()
        client = ExpertClient(
            spec, cache=cache, transport=httpx.MockTransport(handler), clock=fake.clock, sleep=fake.sleep
        )
        return await asyncio.wait_for(client.score(items), 10)

    with pytest.raises(EndpointDown, match="8 items in a row failed after their retries"):
        asyncio.run(main())
    assert sent == 8 * 3
    assert sum(c["failures"] for c in cache.counts().values()) == 8
    cache.close()


def test_client_overflowing_logprob_fails_only_that_item() -> None:
    bad = {"choices": [{"logprobs": {"content": [{"top_logprobs": [{"token": "high", "logprob": 800.0}]}]}}]}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=bad if item_of(request) == 1 else chat_ok(0.5))

    spec = unit_spec(retry=RetryPolicy(max_attempts=2, initial=0.01, jitter=0.0))
    results, _, _ = run_client(spec, handler, [Item("a", "item-1"), Item("b", "item-2")])
    assert [r.source for r in results] == ["failed", "expert"]
    assert results[0].reason


def likelihood_ok(request: httpx.Request) -> httpx.Response:
    """A fake /completions echo answer giving p = 0.3 for every item."""
    template = load_template("stakes-v1")
    prompt = json.loads(request.content)["prompt"]
    answer = "high" if prompt.endswith(template.answers["high"]) else "low"
    prompt_chars = len(prompt) - len(template.answers[answer])
    ll = math.log(0.3) if answer == "high" else math.log(0.7)
    return httpx.Response(
        200, json=likelihood_answer(prompt_chars, template.answers[answer], [ll, 0.0, 0.0, 0.0])
    )


def test_client_likelihood_sends_one_request_per_answer() -> None:
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        return likelihood_ok(request)

    results, stats, _ = run_client(unit_spec(method="likelihood"), handler, [Item("a", "item-1")])
    assert paths == ["/v1/completions", "/v1/completions"]
    assert results[0].score == pytest.approx(0.3, abs=1e-12)
    assert results[0].label_mass is None
    assert stats.scored == 1


def test_client_rpm_counts_http_requests_for_likelihood() -> None:
    fake = FakeTime()
    stamps: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        stamps.append(fake.now)
        return likelihood_ok(request)

    spec = unit_spec(method="likelihood", rate=RateLimit(concurrency=4, rpm=60))
    client = ExpertClient(
        spec, cache=None, transport=httpx.MockTransport(handler), clock=fake.clock, sleep=fake.sleep
    )
    results, _ = asyncio.run(client.score([Item(f"id{i}", f"item-{i}") for i in range(100)]))
    assert all(r.source == "expert" for r in results)
    assert len(stamps) == 200
    # Whatever burst the bucket allows at the start (at most a minute's worth, 60 requests), the
    # remaining 140 requests go at one per second.
    assert stamps[-1] - stamps[0] >= 140 - 1


def test_client_rpm_paces_next_token_requests() -> None:
    fake = FakeTime()
    stamps: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        stamps.append(fake.now)
        return httpx.Response(200, json=chat_ok(0.5))

    spec = unit_spec(rate=RateLimit(concurrency=4, rpm=60))
    client = ExpertClient(
        spec, cache=None, transport=httpx.MockTransport(handler), clock=fake.clock, sleep=fake.sleep
    )
    results, _ = asyncio.run(client.score([Item(f"id{i}", f"item-{i}") for i in range(100)]))
    assert all(r.source == "expert" for r in results)
    assert len(stamps) == 100
    assert stamps[-1] - stamps[0] == pytest.approx(99.0)  # one request per second, no burst


def test_request_dataclass_is_frozen() -> None:
    request = Request("/x", {}, 1, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.path = "/y"  # type: ignore[misc]
