"""The recovery ladder of next-token scoring: what an item whose answer holds no label token gets
asked next, and how the score it ends with was obtained.

A next-token answer fails with `no-label-mass` (neither label token among the top logprobs) or
`no-logprobs` (no top logprobs at all: a refusal, another language, a first token that is an
incomplete UTF-8 byte). Rather than failing such an item, the client sends the rungs below in
order, each built from the item's own request (the base body, so whatever a template put there,
`chat_template_kwargs` included, stays), and the first answer with label mass gives the score:

- `wider-top-k`: the same request with the widest top logprobs a server grants by default (20:
  OpenAI's limit, vLLM's `max_logprobs` default). Same prompt, same greedy step: the score means
  exactly what a plain one means; only the list read is longer.
- `choice-spellings` (vLLM only): the same request with vLLM's `structured_outputs` choice
  among the label words in the spellings a model is likely to answer with (`label_spellings`: lower case,
  capitalised, upper case, each with and without a leading space). vLLM (0.32) masks the
  disallowed tokens in the logits before it computes logprobs, so the answer's logprobs are
  renormalised over the tokens the choice allows: their ratio, and so the score, is the model's
  own, but the mass on them is mass *within the choice*, not over the vocabulary. The row keeps
  no label mass for it (None) for that reason. Rows of caches written before it may say
  `choice`: a choice between the two labels as the template spells them (lower case), which
  masked the capitalised words a model mostly answers with, so their score was the ratio of two
  rarer tokens (off the plain score by up to 0.18 on SmolLM2; `docs/how-to/unanswered-items.md`).
- `named-labels`: the last user message gains one sentence naming the two label tokens, at the
  widest top logprobs. A different prompt: the score is the model's answer to a question that
  names its answers, recorded as such.

`logit_bias` is not a rung: it needs the label tokens' ids, which only the served tokenizer knows
(vLLM's and llama.cpp's `/tokenize`; OpenAI has none), and it adds nothing the `choice` rung does
not: vLLM computes the logprobs it returns before logits processors run (`logprobs_mode`
`raw_logprobs` by default), so a bias moves the sampled token but not the top logprobs, and where
processed logprobs are returned an equal bias on both labels leaves their ratio, the score,
unchanged.

Every rung's body is a pure function of the base body and the template's labels, so the cache
row's `how` and its key name exactly the request that produced its answer. A rung answer is
stored under the item's own key (the plain request's: a rung runs only after that request was
answered without label mass, so no plain answer can exist beside it), with `how` saying which
rung gave it; plain answers say `top-k`, likelihood answers `likelihood`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._errors import ConfigError, HTTPStatusError, ResponseError
from ._prompts import PromptTemplate
from ._scoring import Request, Score, parse_response

if TYPE_CHECKING:
    from ._resources import ClientResources
    from ._spend import Reservation

__all__ = [
    "HOWS",
    "HOW_CHOICE",
    "HOW_LABELS_CHOICE",
    "HOW_LIKELIHOOD",
    "HOW_NAMED_LABELS",
    "HOW_TOP_K",
    "HOW_WIDER_TOP_K",
    "RECOVERABLE",
    "WIDEST_TOP_LOGPROBS",
    "Rung",
    "Scored",
    "choice_rung",
    "label_spellings",
    "ladder",
    "named_labels_rung",
    "plain_how",
    "recover",
    "wider_top_k_rung",
]

HOW_TOP_K = "top-k"  # the plain next-token request (and every row of a cache older than `how`)
HOW_LIKELIHOOD = "likelihood"  # a likelihood-scoring answer (no ladder)
HOW_WIDER_TOP_K = "wider-top-k"
HOW_CHOICE = "choice-spellings"
HOW_LABELS_CHOICE = "choice"  # the rung before `label_spellings`: only in older caches
HOW_NAMED_LABELS = "named-labels"
HOWS: tuple[str, ...] = (
    HOW_TOP_K,
    HOW_WIDER_TOP_K,
    HOW_CHOICE,
    HOW_LABELS_CHOICE,
    HOW_NAMED_LABELS,
    HOW_LIKELIHOOD,
)

RECOVERABLE = frozenset({"no-label-mass", "no-logprobs"})
"""Failure reasons of a plain next-token answer that the ladder tries to recover."""

WIDEST_TOP_LOGPROBS = 20
"""The most top logprobs the rungs ask for: OpenAI's limit and vLLM's `max_logprobs` default
(`experts._serve` starts vLLM with at least this many); llama.cpp grants more."""

NAMED_LABELS_SENTENCE = "Answer with exactly one word: {high} or {low}."
"""What the `named-labels` rung appends to the last user message (a change here changes what its
rows mean: give the rung a new name then)."""


@dataclass(frozen=True)
class Rung:
    """One step of the ladder: its name (the row's `how`) and the request it sends."""

    how: str
    request: Request


def plain_how(method: str) -> str:
    """The `how` of an answer to the item's own request."""
    return HOW_LIKELIHOOD if method == "likelihood" else HOW_TOP_K


def _widest(body: dict[str, Any]) -> int:
    return max(int(body.get("top_logprobs") or 0), WIDEST_TOP_LOGPROBS)


def _with_body(base: Request, body: dict[str, Any], extra_chars: int = 0) -> Request:
    return Request(base.path, (body,), base.tokens + extra_chars // 4 + 1, base.prompt_chars + extra_chars)


def wider_top_k_rung(base: Request, template: PromptTemplate) -> Request | None:
    """The base request at the widest top logprobs; None when it already asks for that many."""
    body = base.body
    if int(body.get("top_logprobs") or 0) >= WIDEST_TOP_LOGPROBS:
        return None
    return _with_body(base, {**body, "top_logprobs": WIDEST_TOP_LOGPROBS})


def label_spellings(label: str) -> list[str]:
    """The spellings of `label` that the next-token parse counts as it and a model is likely to
    answer with: as written, lower case, capitalised and upper case, each with and without a
    leading space (the parse ignores case and leading space markers)."""
    words = dict.fromkeys((label, label.lower(), label.capitalize(), label.upper()))
    return [*words, *(" " + word for word in words)]


def choice_rung(base: Request, template: PromptTemplate) -> Request:
    """The base request with vLLM's structured choice among the label words' spellings."""
    choice = [*label_spellings(template.labels["high"]), *label_spellings(template.labels["low"])]
    return _with_body(
        base, {**base.body, "top_logprobs": _widest(base.body), "structured_outputs": {"choice": choice}}
    )


def named_labels_rung(base: Request, template: PromptTemplate) -> Request | None:
    """The base request whose last user message names the label tokens; None when the last user
    message is not plain text (nothing to append to), and for a pass-through template, whose
    last user message is the conversation being judged: a sentence added there would change it."""
    if template.kind == "pass-through":
        return None
    messages = copy.deepcopy(list(base.body.get("messages") or []))
    users = [i for i, message in enumerate(messages) if message.get("role") == "user"]
    if not users or not isinstance(messages[users[-1]].get("content"), str):
        return None
    sentence = NAMED_LABELS_SENTENCE.format(high=template.labels["high"], low=template.labels["low"])
    messages[users[-1]]["content"] += "\n\n" + sentence
    body = {**base.body, "messages": messages, "top_logprobs": _widest(base.body)}
    return _with_body(base, body, len(sentence) + 2)


_RUNGS: tuple[tuple[str, Callable[[Request, PromptTemplate], Request | None], frozenset[str] | None], ...] = (
    (HOW_WIDER_TOP_K, wider_top_k_rung, None),
    (HOW_CHOICE, choice_rung, frozenset({"vllm"})),  # other servers ignore or refuse the field
    (HOW_NAMED_LABELS, named_labels_rung, None),
)


def ladder(base: Request, template: PromptTemplate, server: str) -> list[Rung]:
    """The rungs to try, in order, for an item whose plain request `base` (a next-token chat
    request) was answered without label mass, on a server of kind `server` (see ExpertSpec)."""
    rungs = []
    for how, build, servers in _RUNGS:
        if servers is not None and server not in servers:
            continue
        request = build(base, template)
        if request is not None:
            rungs.append(Rung(how, request))
    return rungs


@dataclass(frozen=True)
class Scored:
    """An attempt's outcome: its score and `how`, every answer it received (`payloads`: the
    plain one and the rungs', for the token accounting), the answer the score comes from
    (`answer`, what the cache stores), the tokens estimated for all its requests (the limiter
    settles them against the usage) and the seconds the rungs took."""

    score: Score
    how: str
    payloads: tuple[Any, ...]
    answer: tuple[Any, ...]
    estimated_tokens: int
    seconds: float


async def recover(
    failure: ResponseError,
    payloads: Sequence[Any],
    base: Request,
    template: PromptTemplate,
    server: str,
    held: ClientResources,
    reservation: Reservation | None = None,
) -> Scored:
    """Send the ladder's rungs for an answer that failed with `failure`, one at a time through
    the limiter, each marked on the attempt's `reservation` (which holds their bound since the
    attempt began: the limit never stops the ladder half way), and return the first that has
    label mass. A rung the server refuses (an HTTP status that no retry changes: 400, 422), or
    one larger than tpm (which the item's own request was checked against, before the run), is
    passed over; a retryable error (429, 5xx, a timeout: left in flight on the reservation and
    charged its bound) ends the attempt like any other, so the retry asks the item's own request
    again (paid again, as any retry after an answer is). When no rung answers inside the label
    set, the item fails with the plain answer's reason and what each rung got; every request
    was deterministic, so that failure is not retried."""
    if failure.reason not in RECOVERABLE:
        raise failure
    received, estimated, seconds = list(payloads), base.tokens, 0.0
    said: list[str] = []
    for rung in ladder(base, template, server):
        try:
            held.limiter.limit.check_fits(rung.request.tokens)
        except ConfigError:  # larger than tpm, the whole minute's tokens: no wait admits it
            said.append(
                f"{rung.how}: about {rung.request.tokens} tokens, more than tpm = {held.limiter.limit.tpm:g}"
            )
            continue
        await held.limiter.admit(rung.request.tokens)
        estimated += rung.request.tokens
        try:
            async with held.limiter.slot():
                sent = reservation.sending() if reservation is not None else 0
                payload, took = await held.endpoint.request("POST", rung.request.path, rung.request.body)
            if reservation is not None:
                reservation.answered(sent, payload)
        except HTTPStatusError as exc:
            if reservation is not None:
                reservation.refused()  # an error status is not billed
            if exc.retryable:  # a 429, a 5xx: the attempt's error, and its retry asks again
                raise
            said.append(f"{rung.how}: refused (HTTP {exc.status})")
            continue
        seconds += took
        received.append(payload)
        try:
            score = parse_response("next-token", [payload], template, rung.request)
        except ResponseError as exc:
            said.append(f"{rung.how}: {exc.reason}")
            continue
        if rung.how == HOW_CHOICE:  # the mass within the choice, not over the vocabulary
            score = Score(score.p, None)
        return Scored(score, rung.how, tuple(received), (payload,), estimated, seconds)
    tried = "; ".join(said) if said else "no rung applies to this request"
    final = ResponseError(f"{failure} (recovery: {tried})", reason=failure.reason)
    final.retryable = False
    raise final
