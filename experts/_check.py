"""Probe an expert endpoint before spending anything on it.

A capability check must tell "this server cannot do it" from "this answer was unlucky": a
404 on the path, a 400 on the parameters, or answer after answer without logprobs is the
server's behaviour; a 429, a 5xx, a timeout, a dropped connection or a malformed answer is
chance, and is asked again (honouring Retry-After) within a few attempts and one deadline for
the whole check, so that a dead or incapable server is still reported within seconds."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from ._config import RetryPolicy
from ._endpoint import Endpoint
from ._errors import ExpertError, HTTPStatusError, ResponseError, TransportError
from ._prompts import load_template
from ._redact import redact
from ._registry import ExpertSpec
from ._scoring import ScoringMethod, build_request, parse_response

__all__ = ["CHECK_PATIENCE", "EndpointCheck", "check_endpoint"]

_PROBE = "A user asks how to bake bread. The assistant gives a recipe."

# The check sends a handful of tiny requests, so it can afford far more patience than a flaky
# server needs (at 20% 429s, twelve in a row for one request happen once in 244 million; at the
# 45% transient faults of the fault run, once in 14,000), while a server that keeps
# failing is given up on within the deadline.
CHECK_PATIENCE = RetryPolicy(max_attempts=12, initial=0.25, multiplier=2.0, maximum=4.0, deadline=60.0)

# Answers without logprobs, with none with logprobs among them, that mean the server cannot
# give them. With 5% of answers missing them by chance, six in a row happen once in 64 million
# chat probes, and once in a million likelihood probes (two answers each, either may miss).
_ANSWERS_WITHOUT_LOGPROBS = 6

_WHAT: dict[ScoringMethod, str] = {"next-token": "chat logprobs", "likelihood": "completions with echo"}


def _other(method: ScoringMethod) -> ScoringMethod:
    return "likelihood" if method == "next-token" else "next-token"


@dataclass
class EndpointCheck:
    """What the endpoint can do. `chat_logprobs` and `completions_echo` are None when not
    probed, or when every answer was a transient error; `problem` is the first blocking
    problem, as one line that says what to do; None when the expert's scoring method works."""

    url: str
    reachable: bool = False
    served_models: list[str] = field(default_factory=list)
    model_served: bool = False
    chat_logprobs: bool | None = None
    completions_echo: bool | None = None
    method: ScoringMethod | None = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class _Verdict:
    """A probe's outcome: works (True), cannot (False), or undecided (None: only transient
    errors within the attempts and the deadline); `why` says what was seen."""

    works: bool | None
    why: str | None = None


class _GaveUp(Exception):
    """A request met only transient errors until its attempts or the check's time ran out."""


class _Patience:
    """The check's budget for transient faults: `policy.max_attempts` per request, and one
    deadline (`policy.deadline` seconds from the start) for the whole check."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.started = time.monotonic()
        self._rng = random.Random()

    def left(self) -> float:
        return self.started + self.policy.deadline - time.monotonic()

    async def ask(
        self, endpoint: Endpoint, method: str, path: str, body: Any = None, *, retry_transport: bool = True
    ) -> Any:
        """The parsed answer, asked again after a transient error (a retryable status, a
        malformed answer, and with `retry_transport` a timeout or dropped connection), waiting
        the backoff or the server's Retry-After if longer. _GaveUp when the attempts are spent
        or the next wait would pass the deadline; any other error as it came."""
        first = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._request(endpoint, method, path, body)
            except (HTTPStatusError, ResponseError, TransportError) as exc:
                if not exc.retryable or (isinstance(exc, TransportError) and not retry_transport):
                    raise
                retry_after = exc.retry_after if isinstance(exc, HTTPStatusError) else None
                wait = max(retry_after or 0.0, self.policy.backoff(attempt, self._rng))
                if attempt >= self.policy.max_attempts or wait >= self.left():
                    asked = f", and the server asked to wait {retry_after:g} s more" if retry_after else ""
                    raise _GaveUp(
                        f"{attempt} attempts in {time.monotonic() - first:.0f} s met only "
                        f"transient errors (the last: {exc}){asked}"
                    ) from None
                await asyncio.sleep(wait)

    async def _request(self, endpoint: Endpoint, method: str, path: str, body: Any) -> Any:
        """One request; one still waiting when the deadline comes is a timeout."""
        try:
            async with asyncio.timeout(max(self.left(), 0.0)):
                payload, _ = await endpoint.request(method, path, body)
                return payload
        except TimeoutError:
            raise TransportError(
                f"{endpoint.base_urls[0]}{path}: no answer within the check's {self.policy.deadline:g} s",
                reason="timeout",
            ) from None


async def _probe(
    endpoint: Endpoint, spec: ExpertSpec, method: ScoringMethod, patience: _Patience
) -> _Verdict:
    """Whether one scoring method works, with uncached requests: each request is asked again
    after transient errors, and the whole probe after an answer without logprobs, until an
    answer has them (works), enough answers in a row lack them or a status says the request
    itself is wrong (cannot), or the attempts or the time run out (undecided)."""
    template = load_template(spec.template)
    request = build_request(method, template, _PROBE, spec.model, top_logprobs=spec.top_logprobs)
    for _ in range(_ANSWERS_WITHOUT_LOGPROBS):
        try:
            payloads = [await patience.ask(endpoint, "POST", request.path, b) for b in request.bodies]
            parse_response(method, payloads, template, request)
            return _Verdict(True)
        except _GaveUp as exc:
            return _Verdict(None, str(exc))
        except HTTPStatusError as exc:
            if exc.status in _KEY_REFUSED:
                raise  # the key, not the method: said as a key problem (the listing may be open)
            return _Verdict(False, str(exc))  # 400, 404, 422, ...: the request itself is refused
        except ResponseError as exc:
            if exc.reason == "no-label-mass":
                return _Verdict(True)  # logprobs came back; this answer just put no mass on the labels
            without_logprobs = exc  # an answer, but without usable logprobs: ask again
    return _Verdict(False, f"{_ANSWERS_WITHOUT_LOGPROBS} answers in a row: {without_logprobs}")


def _problem(url: str, method: ScoringMethod, verdicts: dict[ScoringMethod, _Verdict]) -> str | None:
    """The line that says why `method` cannot be used, and what to do; None if it works."""
    chosen = verdicts[method]
    if chosen.works:
        return None
    if chosen.works is None:
        return (
            f"{url}: could not tell whether {_WHAT[method]} work: {chosen.why}; "
            "the server may be overloaded: try again later"
        )
    other = _other(method)
    if other not in verdicts:  # not asked: the template scores by `method` only
        return f"{url}: {_WHAT[method]} do not work ({chosen.why})"
    if verdicts[other].works:
        advice = f"use --method {other}"
    elif verdicts[other].works is None:
        advice = f"{_WHAT[other]} met only transient errors: --method {other} may work"
    else:
        advice = "the endpoint cannot score by logprobs"
    return f"{url}: {_WHAT[method]} do not work ({chosen.why}); {advice}"


async def check_endpoint(
    spec: ExpertSpec,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    patience: RetryPolicy = CHECK_PATIENCE,
) -> EndpointCheck:
    """Reachable? Which models are served? Do chat logprobs and completions echo work? Nothing is
    cached. The first replica answers for all. Transient errors are asked again within
    `patience` (its attempts per question, its deadline for the whole check)."""
    report = await _check(spec, transport, patience)
    # Its problem line and model names are printed: whatever the server said in them passes the
    # redactor here, in one place, beside the endpoint's own redaction of its errors.
    if report.problem is not None:
        report.problem = redact(report.problem, spec.api_key_env)
    report.served_models = [redact(m, spec.api_key_env) for m in report.served_models]
    return report


_KEY_REFUSED = (401, 403)


def _key_problem(url: str, status: int, key_hint: str) -> str:
    return f"{url} refused the request (HTTP {status}): the API key is missing or wrong{key_hint}"


async def _check(
    spec: ExpertSpec, transport: httpx.AsyncBaseTransport | None, patience: RetryPolicy
) -> EndpointCheck:
    urls = spec.request_urls()
    report = EndpointCheck(url=urls[0])
    budget = _Patience(patience)
    key_hint = f"; set {spec.api_key_env}" if spec.api_key_env else ""
    async with Endpoint(
        urls[:1], api_key_env=spec.api_key_env, timeout=spec.timeout, transport=transport
    ) as endpoint:
        try:
            # A transport error is not asked again: a server that is not running is reported at once.
            listing = await budget.ask(endpoint, "GET", "/models", retry_transport=False)
        except TransportError as exc:
            serve = f" (`ctd experts serve {spec.name}` starts one)" if spec.server != "external" else ""
            report.problem = f"cannot reach {exc}; is the server running{serve}?"
            return report
        except HTTPStatusError as exc:
            report.reachable = True
            if exc.status in _KEY_REFUSED:
                report.problem = _key_problem(report.url, exc.status, key_hint)
            else:
                report.problem = (
                    f"{report.url}/models answered HTTP {exc.status}: is this an OpenAI-compatible API?"
                )
            return report
        except (_GaveUp, ExpertError) as exc:
            report.reachable = True
            report.problem = f"{report.url}/models: {exc}"
            if isinstance(exc, _GaveUp):
                report.problem += "; the server may be overloaded: try again later"
            return report
        report.reachable = True
        try:
            report.served_models = [str(m["id"]) for m in listing["data"]]
        except (KeyError, TypeError):
            report.problem = f"{report.url}/models did not list models: is this an OpenAI-compatible API?"
            return report
        report.model_served = spec.model in report.served_models
        if not report.model_served:
            report.problem = (
                f"{report.url} serves {', '.join(report.served_models) or 'no model'}, not {spec.model!r}: "
                "set the served model name (--expert-model, or model = ... in the registry)"
            )
            return report
        # The method in use first: it gets the larger share of the deadline. A pass-through
        # template has no other: it scores by next-token only.
        methods = (spec.method,)
        if load_template(spec.template).kind != "pass-through":
            methods += (_other(spec.method),)
        try:
            verdicts = {m: await _probe(endpoint, spec, m, budget) for m in methods}
        except HTTPStatusError as exc:  # 401 or 403 on a scoring request, /models open to all
            report.problem = _key_problem(report.url, exc.status, key_hint)
            return report
    report.chat_logprobs = verdicts["next-token"].works
    report.completions_echo = verdicts["likelihood"].works if "likelihood" in verdicts else None
    report.problem = _problem(report.url, spec.method, verdicts)
    if report.problem is None:
        report.method = spec.method
    return report
