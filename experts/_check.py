"""Probe an expert endpoint before spending anything on it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx

from ._endpoint import Endpoint
from ._errors import ExpertError, HTTPStatusError, ResponseError, TransportError
from ._prompts import load_template
from ._registry import ExpertSpec
from ._scoring import ScoringMethod, build_request, parse_response

__all__ = ["EndpointCheck", "check_endpoint"]

_PROBE = "A user asks how to bake bread. The assistant gives a recipe."


@dataclass
class EndpointCheck:
    """What the endpoint can do. `problem` is the first blocking problem, as one line that says
    what to do; None when the expert's scoring method works."""

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


_PROBE_ATTEMPTS = 3


async def _probe(endpoint: Endpoint, spec: ExpertSpec, method: ScoringMethod) -> tuple[bool, str | None]:
    """(works, why not) for one scoring method, with uncached requests. A transient failure
    (429, 5xx, timeout, malformed answer) is retried a few times before it counts as an answer."""
    template = load_template(spec.template)
    request = build_request(method, template, _PROBE, spec.model, top_logprobs=spec.top_logprobs)
    why: str | None = None
    for attempt in range(1, _PROBE_ATTEMPTS + 1):
        try:
            payloads = [(await endpoint.request("POST", request.path, body))[0] for body in request.bodies]
            parse_response(method, payloads, template, request)
            return True, None
        except ResponseError as exc:
            why = str(exc)
            if exc.reason == "no-label-mass":
                return True, None  # logprobs came back; this one answer just put no mass on the labels
            if exc.reason != "malformed-json":
                return False, why  # no logprobs: the endpoint's behaviour, not chance
        except (HTTPStatusError, TransportError) as exc:
            why = str(exc)
            if not exc.retryable:
                return False, why
        await asyncio.sleep(0.2 * attempt)
    return False, why


async def check_endpoint(
    spec: ExpertSpec, *, transport: httpx.AsyncBaseTransport | None = None
) -> EndpointCheck:
    """Reachable? Which models are served? Do chat logprobs and completions echo work? Nothing is
    cached. The first replica answers for all."""
    urls = spec.resolved_urls()
    report = EndpointCheck(url=urls[0])
    key_hint = f"; set {spec.api_key_env}" if spec.api_key_env else ""
    async with Endpoint(
        urls[:1], api_key_env=spec.api_key_env, timeout=spec.timeout, transport=transport
    ) as endpoint:
        try:
            listing, _ = await endpoint.request("GET", "/models")
        except TransportError as exc:
            serve = f" (`ctd experts serve {spec.name}` starts one)" if spec.server != "external" else ""
            report.problem = f"cannot reach {exc}; is the server running{serve}?"
            return report
        except HTTPStatusError as exc:
            report.reachable = True
            if exc.status in (401, 403):
                report.problem = (
                    f"{report.url} refused the request (HTTP {exc.status}): "
                    f"the API key is missing or wrong{key_hint}"
                )
            else:
                report.problem = (
                    f"{report.url}/models answered HTTP {exc.status}: is this an OpenAI-compatible API?"
                )
            return report
        except ExpertError as exc:
            report.reachable = True
            report.problem = f"{report.url}/models: {exc}"
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
        report.chat_logprobs, chat_why = await _probe(endpoint, spec, "next-token")
        report.completions_echo, echo_why = await _probe(endpoint, spec, "likelihood")
    if spec.method == "next-token" and not report.chat_logprobs:
        report.problem = f"{report.url}: chat logprobs do not work ({chat_why}); " + (
            "use --method likelihood" if report.completions_echo else "the endpoint cannot score by logprobs"
        )
    elif spec.method == "likelihood" and not report.completions_echo:
        report.problem = f"{report.url}: completions with echo do not work ({echo_why}); " + (
            "use --method next-token" if report.chat_logprobs else "the endpoint cannot score by logprobs"
        )
    else:
        report.method = spec.method
    return report
