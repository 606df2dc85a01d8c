"""Dollars at the client (experts._spend): a cost limit stops the client before a request would
pass it, with many requests in flight, and the spent dollars are the cache's token counts times
the price; a second client with a higher limit finishes and pays for no answer twice."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from fault_server import FaultPlan, RunningServer
from test_experts_engine import db_rows, make_spec

from experts import (
    BUILTIN_EXPERTS,
    ConfigError,
    CostLimitReached,
    ExpertClient,
    InvalidSetting,
    Item,
    Price,
    RateLimit,
    ScoreCache,
    Spend,
    build_request,
    load_experts,
    load_template,
)

PRICE = Price(input=2.0, output=10.0)  # USD per million tokens


def items(n: int) -> list[Item]:
    return [Item(f"row-{i}", f"Is item-{i} risky? " + "word " * (i % 7)) for i in range(n)]


def cache_usd(path: Path) -> float:
    """What the answers in the cache cost, from the token counts the server reported."""
    ((prompt, completion),) = db_rows(path, "SELECT SUM(prompt_tokens), SUM(completion_tokens) FROM scores")
    return PRICE.usd(prompt or 0, completion or 0)


def score(spec, cache: ScoreCache, spend: Spend, batch: list[Item]):  # type: ignore[no-untyped-def]
    return asyncio.run(ExpertClient(spec, cache=cache, spend=spend).score(batch))


def test_a_cost_limit_stops_before_it_is_passed_and_a_higher_one_finishes(tmp_path: Path) -> None:
    batch = items(120)
    with RunningServer(FaultPlan(delay=0.02)) as server:
        spec = make_spec(server.url, rate=RateLimit(concurrency=32), price=PRICE)
        cache = ScoreCache(tmp_path / "cache.db")
        limit = 0.02  # about 40 of the 120 answers (~250 prompt tokens, 1 generated: ~$0.0005 each)
        spend = Spend(PRICE, limit=limit)
        with pytest.raises(CostLimitReached) as stopped:
            score(spec, cache, spend, batch)
        answered = len(db_rows(tmp_path / "cache.db", "SELECT key FROM scores"))
        assert 0 < answered < len(batch), answered
        assert cache_usd(tmp_path / "cache.db") <= spend.spent <= limit
        assert stopped.value.spent == pytest.approx(spend.total) and stopped.value.limit == limit
        # It stopped only when nothing was in flight and the next request's bound did not fit.
        assert spend.total + stopped.value.needed > limit
        assert spend.reserved == pytest.approx(0.0, abs=1e-12)  # every reservation settled

        again = Spend(PRICE, limit=1.0, before=spend.total)
        results, stats = score(spec, cache, again, batch)
        requests = {k: v for k, v in server.server.counts.requests.items() if k >= 0}
    assert all(r.source != "failed" for r in results) and stats.cached == answered
    assert requests == dict.fromkeys(range(len(batch)), 1)  # every item asked once in all
    assert cache_usd(tmp_path / "cache.db") == pytest.approx(spend.spent + again.spent)
    assert stats.cost_usd == pytest.approx(again.spent)


def test_the_bound_covers_what_the_server_bills() -> None:
    """Byte count plus the learned template overhead is never below the reported prompt tokens
    (the fault server bills characters / 4); before any answer it allows FIRST_OVERHEAD."""
    template = load_template("stakes-v1")
    request = build_request("next-token", template, "item-1 ü€ " * 50, "m", top_logprobs=5)
    spend = Spend(PRICE, limit=1.0)
    first = spend.bound(request)
    assert first.prompt > 1024 and first.completion == 1
    reservation = spend.reserve_now(request)
    reservation.answered(reservation.sending(), {"usage": {"prompt_tokens": 300, "completion_tokens": 1}})
    reservation.close()
    assert (spend.prompt_tokens, spend.completion_tokens) == (300, 1)
    learned = spend.bound(request)
    text = sum(len(m["content"].encode()) for m in request.body["messages"])
    assert 300 <= learned.prompt < first.prompt and learned.prompt >= text


def test_closing_charges_what_may_have_been_billed() -> None:
    template = load_template("stakes-v1")
    request = build_request("next-token", template, "item-1", "m", top_logprobs=5)
    spend = Spend(PRICE, limit=1.0)
    refused = spend.reserve_now(request)
    refused.sending()
    refused.refused()  # an error status: nothing billed
    refused.close()
    assert spend.spent == 0 and spend.reserved == 0
    spend.reserve_now(request).close()  # closed before anything was sent: nothing
    assert spend.spent == 0
    held = spend.reserve_now(request)
    bound = spend.bound(request)
    sent = held.sending()
    held.close()  # cancelled in flight: its bound
    held.answered(sent, {"usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    held.close()  # no effect, already closed
    assert (spend.prompt_tokens, spend.completion_tokens) == (bound.prompt, bound.completion)


def test_a_count_an_answer_does_not_report_is_charged_its_bound() -> None:
    """Likelihood's two bodies, the second answered without usage; a chat answer reporting its
    prompt tokens but not its completion tokens: each missing count is that body's bound."""
    template = load_template("stakes-v1")
    two = build_request("likelihood", template, "item-1", "m", top_logprobs=5)
    spend = Spend(PRICE, limit=1.0)
    bound = spend.bound(two)
    held = spend.reserve_now(two)
    held.answered(held.sending(), {"usage": {"prompt_tokens": 100, "completion_tokens": 1}})
    held.answered(held.sending(), {"choices": []})
    held.close()
    assert (spend.prompt_tokens, spend.completion_tokens) == (
        100 + bound.bodies[1][0],
        1 + bound.bodies[1][1],
    )
    chat = build_request("next-token", template, "item-1", "m", top_logprobs=5)
    spend = Spend(PRICE, limit=1.0)
    held = spend.reserve_now(chat)
    held.answered(held.sending(), {"usage": {"prompt_tokens": 10}})
    held.close()
    assert (spend.prompt_tokens, spend.completion_tokens) == (10, spend.bound(chat).completion)


@pytest.mark.parametrize(
    ("changes", "setting"),
    [
        ({"input": -1.0}, "input"),
        ({"output": float("nan")}, "output"),
        ({"batch_discount": 1.0}, "batch_discount"),
    ],
)
def test_impossible_prices_are_refused(changes: dict[str, float], setting: str) -> None:
    with pytest.raises(InvalidSetting) as refused:
        Price(**changes)
    assert refused.value.setting == setting


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ConfigError, match="cost limit"):
        Spend(PRICE, limit=-1.0)


def test_registry_prices_and_their_errors_name_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "experts.toml"
    path.write_text(
        '[experts.paid]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n'
        "price_input = 0.15\nprice_output = 1\nbatch_discount = 0.5\n"
    )
    paid = load_experts(path)["paid"]
    assert paid.price == Price(input=0.15, output=1.0, batch_discount=0.5)
    assert all(spec.price.free for name, spec in BUILTIN_EXPERTS.items())  # local models cost 0
    assert replace(paid, price=Price()).endpoint_id() == paid.endpoint_id()
    path.write_text(path.read_text().replace("price_output = 1", "price_output = -2"))
    with pytest.raises(ConfigError) as refused:
        load_experts(path)
    assert str(refused.value).startswith(f"{path}:5: expert 'paid': price_output = -2:"), refused.value


def test_the_price_is_not_in_the_cache_key() -> None:
    spec = make_spec("http://127.0.0.1:9/v1")
    item = Item("a", "item-1")
    free = ExpertClient(spec, cache=None).request_for(item)[1]
    paid = ExpertClient(replace(spec, price=PRICE), cache=None).request_for(item)[1]
    assert free == paid


def test_an_attempt_reserves_its_recovery_rungs_so_no_answer_is_paid_twice(tmp_path: Path) -> None:
    """An answer without label mass goes down the ladder (experts._recovery). The attempt's
    reservation holds the rungs' bound too, before the plain request leaves: with no limit the
    dollars are both requests' reported tokens; with a limit that covers the plain request but
    not it and its rung, nothing is sent (a plain answer paid and left without its rung would be
    paid again by the rerun), and the rerun under a higher limit asks each request once."""
    plan = FaultPlan(recover_on={1: "wider-top-k"})
    row_1 = [Item("row-1", "A request about item-1.")]
    with RunningServer(plan) as server:
        spec = make_spec(server.url, top_logprobs=5, price=PRICE)
        spend = Spend(PRICE)
        results, stats = score(spec, ScoreCache(tmp_path / "paid.db"), spend, row_1)
        assert (results[0].source, results[0].how) == ("expert", "wider-top-k")
        assert stats.prompt_tokens > 0 and server.server.counts.requests[1] == 2
        assert spend.spent == pytest.approx(PRICE.usd(stats.prompt_tokens, stats.completion_tokens))

        # A spend that has seen one answer (its template overhead learned), then limited to the
        # plain request's bound and a little: the plain request alone would fit, with its rung not.
        capped = Spend(PRICE)
        cache = ScoreCache(tmp_path / "capped.db")
        score(spec, cache, capped, [Item("row-2", "A request about item-2.")])
        template = load_template(spec.template)
        plain = build_request("next-token", template, "A request about item-1.", spec.model, top_logprobs=5)
        bound = capped.bound(plain)
        limit = capped.limit = capped.total + 1.01 * PRICE.usd(bound.prompt, bound.completion)
        with pytest.raises(CostLimitReached):
            score(spec, cache, capped, row_1)
        assert server.server.counts.requests[1] == 2  # nothing sent
        assert capped.total <= limit and capped.reserved == pytest.approx(0.0, abs=1e-12)

        again = Spend(PRICE, limit=1.0, before=capped.total)
        results, _ = score(spec, cache, again, row_1)
        assert results[0].how == "wider-top-k"
        assert server.server.counts.requests[1] == 4  # the plain request and its rung, once each
