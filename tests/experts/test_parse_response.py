"""Scoring answers: parse_response for next-token and likelihood answers, and its errors."""

from __future__ import annotations

import math
from typing import Any

import pytest
from expert_fakes import likelihood_answer

from experts import Request, build_request, load_template

# Private: answer parsing and its errors, unit-tested.
from experts._errors import ResponseError
from experts._scoring import parse_response


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


def test_likelihood_with_both_answers_impossible_is_no_score() -> None:
    """Both answers at log-likelihood -inf (a token of each at -Infinity, which JSON readers
    accept): the difference is NaN, so there is no score, not a NaN one (NaN rows are dropped
    by the cache's insert while counted as stored). One impossible answer still scores."""
    template = load_template("stakes-v1")
    request = build_request("likelihood", template, "x", "m", top_logprobs=20)
    both = likelihood_answers(request, [-math.inf, 0.0, 0.0, 0.0], [-1.0, -math.inf, 0.0, 0.0])
    with pytest.raises(ResponseError) as info:
        parse_response("likelihood", both, template, request)
    assert info.value.reason == "bad-logprobs"
    one = likelihood_answers(request, [-1.0, 0.0, 0.0, 0.0], [-math.inf, 0.0, 0.0, 0.0])
    assert parse_response("likelihood", one, template, request).p == 1.0


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
