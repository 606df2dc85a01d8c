"""Scoring methods: the request each one sends and how its answer becomes P(high-stakes | x)."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ._errors import ResponseError
from ._prompts import Conversation, PromptTemplate

__all__ = [
    "SCORING_METHODS",
    "Request",
    "Score",
    "ScoringMethod",
    "build_request",
    "parse_response",
    "top_logprobs",
    "total_usage",
]

ScoringMethod = Literal["next-token", "likelihood"]
SCORING_METHODS: tuple[str, ...] = get_args(ScoringMethod)


@dataclass(frozen=True)
class Request:
    """What scoring one item sends: POSTs of `bodies` to one path under the base URL (next-token:
    one chat request; likelihood: one completions request per answer, since not every server
    takes a list of prompts), and a token estimate for the TPM limit (characters / 4 plus the
    tokens asked for)."""

    path: str
    bodies: tuple[dict[str, Any], ...]
    tokens: int
    prompt_chars: int  # likelihood: where each answer starts in the echoed text

    @property
    def body(self) -> dict[str, Any]:
        """The first body: for next-token scoring, the only one."""
        return self.bodies[0]


@dataclass(frozen=True)
class Score:
    """P(high-stakes | x) and, for next-token scoring, the probability mass on the label tokens."""

    p: float
    label_mass: float | None


def build_request(
    method: ScoringMethod,
    template: PromptTemplate,
    conversation: Conversation,
    model: str,
    *,
    top_logprobs: int,
) -> Request:
    if method == "next-token":
        messages = template.messages(conversation)
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": True,
            "top_logprobs": top_logprobs,
        }
        chars = sum(len(m["content"]) for m in messages)
        tokens = chars // 4 + 1
        if template.chat_template_kwargs is not None:
            # vLLM's extension: keys the model's own chat template reads (a pass-through
            # template's), a copy: a body is the template's for no longer than one request.
            body["chat_template_kwargs"] = copy.deepcopy(template.chat_template_kwargs)
            tokens += len(json.dumps(template.chat_template_kwargs)) // 4
        return Request("/chat/completions", (body,), tokens, chars)
    if method == "likelihood":
        prompt = template.completion_prompt(conversation)
        bodies = tuple(
            {
                "model": model,
                "prompt": prompt + template.answers[label],
                "max_tokens": 1,  # some servers reject 0; the generated token is ignored
                "temperature": 0.0,
                "echo": True,
                "logprobs": 1,
            }
            for label in ("high", "low")
        )
        return Request("/completions", bodies, 2 * (len(prompt) // 4 + 16), len(prompt))
    raise ValueError(f"unknown scoring method {method!r}; choose one of {SCORING_METHODS}")


def _label_of(token: str, labels: Mapping[str, str]) -> str | None:
    """Which label a token spells, ignoring case and leading space markers (' ', 'Ġ', '▁')."""
    word = token.strip().lstrip("Ġ▁").lower()
    for name, label in labels.items():
        if word == label.lower():
            return name
    return None


def _next_token(payload: Mapping[str, Any], template: PromptTemplate) -> Score:
    try:
        top = payload["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        entries = [(str(t["token"]), float(t["logprob"])) for t in top]
    except (KeyError, IndexError, TypeError, ValueError):
        raise ResponseError(
            "the answer has no choices[0].logprobs.content[0].top_logprobs", reason="no-logprobs"
        ) from None
    if any(not (logprob <= 0.0) for _, logprob in entries):  # also catches NaN
        raise ResponseError("a top logprob is positive or not a number", reason="bad-logprobs")
    mass = {"high": 0.0, "low": 0.0}
    for token, logprob in entries:
        label = _label_of(token, template.labels)
        if label is not None:
            mass[label] += math.exp(logprob)
    total = mass["high"] + mass["low"]
    if not total > 0:
        raise ResponseError("no probability mass on the label tokens in top_logprobs", reason="no-label-mass")
    return Score(p=mass["high"] / total, label_mass=total)


def _answer_loglik(choice: Mapping[str, Any], prompt_chars: int, answer_chars: int) -> float:
    """Sum of the echoed token logprobs that lie inside the answer's characters."""
    logprobs = choice["logprobs"]
    total, seen = 0.0, 0
    end = prompt_chars + answer_chars
    for offset, value in zip(logprobs["text_offset"], logprobs["token_logprobs"], strict=False):
        if prompt_chars <= offset < end:
            if value is None:
                raise ResponseError("an answer token has no logprob", reason="no-logprobs")
            if not float(value) <= 0.0:
                raise ResponseError(
                    "an answer token's logprob is positive or not a number", reason="bad-logprobs"
                )
            total += float(value)
            seen += 1
    if seen == 0:
        raise ResponseError("no echoed tokens fall inside the answer", reason="no-logprobs")
    return total


def _likelihood(payloads: Sequence[Mapping[str, Any]], template: PromptTemplate, prompt_chars: int) -> Score:
    for payload in payloads:
        logprobs = _choice_logprobs(payload)
        if isinstance(logprobs, Mapping) and "content" in logprobs and "token_logprobs" not in logprobs:
            # llama.cpp's own server answers `echo` this way (its issue #27174): nothing to score.
            raise ResponseError(
                "the server returned logprobs of the generated token only, not of the echoed prompt "
                "(llama.cpp's own server does not echo them; vLLM and llama-cpp-python's server do)",
                reason="no-logprobs",
            )
    try:
        high = _answer_loglik(payloads[0]["choices"][0], prompt_chars, len(template.answers["high"]))
        low = _answer_loglik(payloads[1]["choices"][0], prompt_chars, len(template.answers["low"]))
    except (KeyError, IndexError, TypeError, ValueError):
        raise ResponseError(
            "the answer lacks echoed prompt logprobs for both answers", reason="no-logprobs"
        ) from None
    if high == low == -math.inf:  # both impossible: their difference, and so the score, is NaN
        raise ResponseError("both answers have log-likelihood -inf", reason="bad-logprobs")
    # Softmax over the two answers, computed from the difference for stability.
    return Score(p=1.0 / (1.0 + math.exp(min(low - high, 700.0))), label_mass=None)


def _choice_logprobs(payload: Mapping[str, Any]) -> Any:
    try:
        return payload["choices"][0]["logprobs"]
    except (KeyError, IndexError, TypeError):
        return None


def parse_response(
    method: ScoringMethod, payloads: Sequence[Mapping[str, Any]], template: PromptTemplate, request: Request
) -> Score:
    """P(high-stakes | x) from the endpoint's JSON answers (one per body of `request`);
    ResponseError if they hold none."""
    if method == "next-token":
        return _next_token(payloads[0], template)
    return _likelihood(payloads, template, request.prompt_chars)


def top_logprobs(response: str) -> list[tuple[str, float]]:
    """The next token's top alternatives and their logprobs in a stored next-token answer (the
    cache's raw JSON), most likely first; empty for answers that hold none (likelihood scoring)."""
    try:
        payload = json.loads(response)
        top = payload["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        return [(str(t["token"]), float(t["logprob"])) for t in top]
    except (json.JSONDecodeError, KeyError, IndexError, TypeError, ValueError):
        return []


def total_usage(payloads: Sequence[Any]) -> dict[str, int]:
    """Token usage summed over the answers that report it ({} if none does)."""
    total: dict[str, int] = {}
    for payload in payloads:
        usage = payload.get("usage") if isinstance(payload, dict) else None
        for name in ("prompt_tokens", "completion_tokens"):
            if isinstance(usage, dict) and isinstance(usage.get(name), int):
                total[name] = total.get(name, 0) + usage[name]
    return total
