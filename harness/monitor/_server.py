"""`ctd monitor serve`: the monitor over HTTP (a Starlette app; the transport is `_http`).

    POST /v1/check     {"messages": [{"role": ..., "content": ...}, ...]} or {"input": "text"}
                       -> the decision: probe, dv, delegated, expert, score, label, reason, latency_ms
    POST /v1/feedback  {"request_id": ..., "label": 0 or 1} -> whether the id was matched
    GET  /metrics      Prometheus text
    GET  /healthz      {"status": "ok", "bundle": its folder's name, "bundle_id": ..., ...}

Every refusal is {"error": one line}. Bad input is a 4xx: 400 malformed JSON or fields, 401 a
missing or wrong bearer token (when the server has one), 408 a body that did not arrive in time,
413 a body over the size limit, 415 not JSON, 422 a conversation the model's chat template
rejects. 503 with Retry-After: the monitor cannot take the request now (queue full, decision log
unwritable). Anything else is a one-line 500, its traceback in the server's log only.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from experts import MESSAGE_FIELDS, ROLE_ALIASES, chat_message

from .._errors import InputError
from ._bundle_record import json_number
from ._errors import Unavailable
from ._metrics import CONTENT_TYPE
from ._monitor import Monitor

__all__ = [
    "MAX_BODY_BYTES",
    "ROLES",
    "BadRequest",
    "create_app",
    "parse_check",
    "parse_feedback",
    "read_json_body",
]

MAX_BODY_BYTES = 1 << 20  # 1 MiB: far above any conversation a probe reads (it keeps max_tokens)
ROLES = ("system", "user", "assistant", "tool")  # the OpenAI chat roles a conversation may hold
log = logging.getLogger("ctd.monitor")


class BadRequest(Exception):
    """A request refused for what it holds: `status` is the 4xx, the message one line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def read_json_body(raw: bytes, content_type: str | None) -> Any:
    """The body as a JSON value, or BadRequest: not JSON, too large, too deep, numbers Python
    will not read (an integer over 4,300 digits), text that is not valid Unicode."""
    if content_type is not None and "json" not in content_type.lower():
        raise BadRequest(415, f"content-type {content_type!r}: send application/json")
    if len(raw) > MAX_BODY_BYTES:
        raise BadRequest(413, f"body of {len(raw)} bytes: the limit is {MAX_BODY_BYTES}")
    if not raw.strip():
        raise BadRequest(400, "empty body: send a JSON object")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadRequest(400, "body is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise BadRequest(
            400, f"malformed JSON at line {error.lineno} column {error.colno}: {error.msg}"
        ) from None
    except RecursionError:
        raise BadRequest(400, "JSON nested too deeply") from None
    except ValueError as error:  # e.g. an integer literal over sys.get_int_max_str_digits()
        what = str(error).splitlines()[0].split(";")[0] if str(error) else type(error).__name__
        raise BadRequest(400, f"malformed JSON: {what}") from None


def _text(value: object, where: str) -> str:
    """`value` if it is a string of valid Unicode (no lone surrogate such as \\ud800)."""
    if not isinstance(value, str):
        raise BadRequest(400, f"{where}: must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise BadRequest(
            400, f"{where}: character {error.start} is a lone surrogate, not Unicode text"
        ) from None
    return value


def parse_check(body: Any) -> str | list[dict[str, str]]:
    """The conversation of a /v1/check body, or BadRequest(400) naming the field that is wrong.
    The body is {"messages": [...]} (OpenAI chat format) or {"input": "..."}; a bare JSON list of
    messages or a bare JSON string is read as the one or the other."""
    if isinstance(body, str):
        body = {"input": body}
    elif isinstance(body, list):
        body = {"messages": body}
    if not isinstance(body, dict):
        raise BadRequest(
            400,
            f"body is a JSON {type(body).__name__}: send an object with 'messages' or 'input', a list of "
            "messages or a string",
        )
    if ("messages" in body) == ("input" in body):
        raise BadRequest(400, "give exactly one of 'messages' (OpenAI chat format) and 'input' (a string)")
    unknown = sorted(set(body) - {"messages", "input"})
    if unknown:
        raise BadRequest(400, f"unknown field {unknown[0]!r}: send 'messages' or 'input'")
    if "input" in body:
        if not isinstance(body["input"], str) or not body["input"].strip():
            raise BadRequest(400, "'input' must be a non-empty string")
        return _text(body["input"], "'input'")
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise BadRequest(400, "'messages' must be a non-empty list of {role, content} objects")
    out: list[dict[str, str]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(400, f"messages[{i}]: must be an object with 'role' and 'content'")
        unknown = sorted(set(message) - MESSAGE_FIELDS)
        if unknown:
            known = "OpenAI's chat message fields are read"
            raise BadRequest(400, f"messages[{i}]: unknown field {unknown[0]!r} ({known})")
        role = message.get("role")
        if not isinstance(role, str) or ROLE_ALIASES.get(role, role) not in ROLES:
            roles = ", ".join([*ROLES, *ROLE_ALIASES])
            raise BadRequest(400, f"messages[{i}].role {role!r}: must be one of {roles}")
        try:
            read = chat_message(message)
        except ValueError as error:
            raise BadRequest(400, f"messages[{i}].{error}") from None
        _text(read["content"], f"messages[{i}].content")
        for label in ("name", "tool_call_id"):  # checked, not read: what the probes see is the text
            if label in message:
                _text(message[label], f"messages[{i}].{label}")
        out.append(read)
    if not any(m["content"].strip() for m in out):
        raise BadRequest(400, "every message is empty: nothing to check")
    return out


def parse_feedback(body: Any) -> tuple[str, int]:
    """(request id, label) of a /v1/feedback body, or BadRequest(400)."""
    if not isinstance(body, dict) or set(body) != {"request_id", "label"}:
        raise BadRequest(400, "send an object with exactly 'request_id' (a string) and 'label' (0 or 1)")
    rid, label = body["request_id"], body["label"]
    if not isinstance(rid, str) or not rid:
        raise BadRequest(400, "'request_id' must be the non-empty string a check returned")
    _text(rid, "'request_id'")
    if isinstance(label, bool) or label not in (0, 1):
        raise BadRequest(400, f"'label' {label!r}: must be 0 or 1")
    return rid, int(label)


def bundle_id(monitor: Monitor) -> str:
    """A short content id of the served bundle: sha256 of its bundle.json, 12 hex digits."""
    return hashlib.sha256(monitor.bundle.layout.record.read_bytes()).hexdigest()[:12]


def create_app(monitor: Monitor, *, auth_token: str | None = None, body_timeout: float = 30.0) -> Starlette:
    """The app over a loaded monitor (closed when the app shuts down). With `auth_token`, POST
    requests need `Authorization: Bearer TOKEN` (compared in constant time); GETs stay open.

    Plain Starlette: every endpoint reads its own body and writes its own response, so a
    framework's validation and dependency layers would only cost time on the check's hot path
    (on an H200 the server's Python work per request, not the GPU, bounds its requests/s)."""
    expected = None if auth_token is None else auth_token.encode("utf-8")
    health_id = bundle_id(monitor)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await monitor.aclose()

    async def routing_error(request: Request, error: HTTPException) -> JSONResponse:
        """An unknown path (404) or method (405), in the same one-line shape as every refusal."""
        return JSONResponse(
            {"error": f"{request.method} {request.url.path}: {error.detail}"},
            status_code=error.status_code,
            headers=error.headers,
        )

    async def client_gone(request: Request, error: ClientDisconnect) -> Response:
        """The client hung up before its body arrived: nothing to answer, nothing to log."""
        return Response(status_code=400)

    async def internal_error(request: Request, error: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=error)
        return JSONResponse({"error": "internal error: the server logged it"}, status_code=500)

    def refuse(error: BadRequest) -> JSONResponse:
        monitor.metrics.bad_requests.inc()
        headers = {"www-authenticate": "Bearer"} if error.status == 401 else None
        return JSONResponse({"error": str(error)}, status_code=error.status, headers=headers)

    def unavailable(error: Unavailable) -> JSONResponse:
        retry = str(math.ceil(error.retry_after))
        message = str(error).splitlines()[0] if str(error) else "the monitor cannot take requests now"
        return JSONResponse({"error": message}, status_code=503, headers={"retry-after": retry})

    def authorise(request: Request) -> None:
        if expected is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        # latin-1 gives back the header's own bytes; compare_digest takes as long whatever they are.
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("latin-1"), expected):
            raise BadRequest(401, "missing or wrong bearer token (send Authorization: Bearer TOKEN)")

    async def body_of(request: Request) -> Any:
        declared = request.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise BadRequest(413, f"body of {declared} bytes: the limit is {MAX_BODY_BYTES}")
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(body_timeout):
                async for chunk in request.stream():
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_BODY_BYTES:
                        raise BadRequest(
                            413, f"body over {MAX_BODY_BYTES} bytes: the limit is {MAX_BODY_BYTES}"
                        )
        except TimeoutError:
            raise BadRequest(408, f"the body did not arrive within {body_timeout:g} s") from None
        return read_json_body(b"".join(chunks), request.headers.get("content-type"))

    async def check(request: Request) -> Response:
        try:
            authorise(request)
            monitor.shed_if_full()  # before the body is read: a refusal under load stays cheap
            conversation = parse_check(await body_of(request))
            decision = await monitor.check(conversation)
        except BadRequest as error:
            return refuse(error)
        except InputError as error:  # the chat template rejects the conversation
            return refuse(BadRequest(422, str(error).splitlines()[0]))
        except Unavailable as error:  # refused before anything was paid: come back later
            return unavailable(error)
        return JSONResponse(decision.to_json())

    async def feedback(request: Request) -> Response:
        try:
            authorise(request)
            rid, label = parse_feedback(await body_of(request))
            matched = await monitor.feedback(rid, label)
        except BadRequest as error:
            return refuse(error)
        except InputError as error:  # a label posted twice for one decision
            return refuse(BadRequest(409, str(error)))
        except Unavailable as error:
            return unavailable(error)
        if not matched:
            return refuse(BadRequest(404, f"request_id {rid!r}: no recent decision has it"))
        return JSONResponse({"matched": True})

    async def metrics(request: Request) -> PlainTextResponse:
        return PlainTextResponse(monitor.prometheus(), media_type=CONTENT_TYPE)

    async def healthz(request: Request) -> JSONResponse:
        # Tried, not remembered: a replica out of service must come back once the disk has room.
        log_problem = (
            None if monitor.decisions is None or monitor.decisions.recheck() else monitor.decisions.problem
        )
        healthy = log_problem is None and monitor.scorer.gone is None
        return JSONResponse(
            {
                "status": "ok" if healthy else "unavailable",
                "log": log_problem or "ok",
                "scorer": monitor.scorer.gone or "ok",
                "bundle": monitor.bundle.layout.root.name,  # never the absolute path
                "bundle_id": health_id,
                "threshold": json_number(monitor.bundle.threshold),  # as bundle.json holds it
                "expert": None if monitor.gate is None else ("down" if monitor.gate.down else "up"),
                "drift_alarm": monitor.delegation.alarm or monitor.errors.alarm,
            },
            status_code=200 if healthy else 503,  # a load balancer stops sending here
        )

    return Starlette(
        routes=[
            Route("/v1/check", check, methods=["POST"]),
            Route("/v1/feedback", feedback, methods=["POST"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        exception_handlers={
            HTTPException: routing_error,
            ClientDisconnect: client_gone,
            Exception: internal_error,
        },
        lifespan=lifespan,
    )
