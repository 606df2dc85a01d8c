"""Scoring requests: build_request for each method, and the Request it returns."""

from __future__ import annotations

import dataclasses

import pytest

from experts import (
    Request,
    build_request,
    load_template,
)


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


def test_request_dataclass_is_frozen() -> None:
    request = Request("/x", {}, 1, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.path = "/y"  # type: ignore[misc]
