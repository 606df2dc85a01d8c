"""`ctd monitor serve`: the monitor over HTTP (FastAPI under uvicorn).

    POST /v1/check     {"messages": [{"role": ..., "content": ...}, ...]} or {"input": "text"}
                       -> the decision: probe, dv, delegated, expert, score, label, reason, latency_ms
    POST /v1/feedback  {"request_id": ..., "label": 0 or 1} -> whether the id was matched
    GET  /metrics      Prometheus text
    GET  /healthz      {"status": "ok", ...}

Bad input is a 4xx with {"error": one line}: 400 malformed JSON or fields, 413 a body over the size
limit, 415 not JSON, 422 a conversation the model's chat template rejects. Never a 500 for input.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from .._errors import InputError
from ._errors import Unavailable
from ._metrics import CONTENT_TYPE
from ._monitor import Monitor

__all__ = ["MAX_BODY_BYTES", "ROLES", "create_app", "parse_check", "parse_feedback"]

MAX_BODY_BYTES = 1 << 20  # 1 MiB: far above any conversation a probe reads (it keeps max_tokens)
ROLES = ("system", "user", "assistant", "tool")  # the OpenAI chat roles a conversation may hold
log = logging.getLogger("ctd.monitor")


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _json_body(raw: bytes, content_type: str | None) -> Any:
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
        return body["input"]
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise BadRequest(400, "'messages' must be a non-empty list of {role, content} objects")
    out: list[dict[str, str]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) - {"role", "content", "name"}:
            raise BadRequest(400, f"messages[{i}]: must be an object with 'role' and 'content' only")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise BadRequest(400, f"messages[{i}].role {role!r}: must be one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise BadRequest(400, f"messages[{i}].content: must be a string")
        out.append({"role": role, "content": content})
    if not any(m["content"].strip() for m in out):
        raise BadRequest(400, "every message is empty: nothing to check")
    return out


def parse_feedback(body: Any) -> tuple[str, int]:
    if not isinstance(body, dict) or set(body) != {"request_id", "label"}:
        raise BadRequest(400, "send an object with exactly 'request_id' (a string) and 'label' (0 or 1)")
    rid, label = body["request_id"], body["label"]
    if not isinstance(rid, str) or not rid:
        raise BadRequest(400, "'request_id' must be the non-empty string a check returned")
    if isinstance(label, bool) or label not in (0, 1):
        raise BadRequest(400, f"'label' {label!r}: must be 0 or 1")
    return rid, int(label)


def create_app(load: Any) -> FastAPI:
    """The app; `load()` is awaited at start-up and returns the Monitor (closed at shutdown)."""
    state: dict[str, Monitor] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state["monitor"] = await load()
        try:
            yield
        finally:
            await state["monitor"].aclose()

    app = FastAPI(title="ctd monitor", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def refuse(error: BadRequest) -> JSONResponse:
        state["monitor"].metrics.bad_requests.inc()
        return JSONResponse({"error": str(error)}, status_code=error.status)

    async def body_of(request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise BadRequest(413, f"body of {declared} bytes: the limit is {MAX_BODY_BYTES}")
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                raise BadRequest(413, f"body over {MAX_BODY_BYTES} bytes: the limit is {MAX_BODY_BYTES}")
        return _json_body(raw, request.headers.get("content-type"))

    @app.post("/v1/check")
    async def check(request: Request) -> JSONResponse:
        monitor = state["monitor"]
        try:
            conversation = parse_check(await body_of(request))
            decision = await monitor.check(conversation)
        except BadRequest as error:
            return refuse(error)
        except InputError as error:  # the chat template rejects the conversation
            return refuse(BadRequest(422, str(error)))
        except Unavailable as error:  # shed or unable to log: nothing was paid for it
            retry = str(math.ceil(error.retry_after))
            return JSONResponse({"error": str(error)}, status_code=503, headers={"Retry-After": retry})
        return JSONResponse(decision.to_json())

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> JSONResponse:
        try:
            rid, label = parse_feedback(await body_of(request))
        except BadRequest as error:
            return refuse(error)
        matched = state["monitor"].feedback(rid, label)
        if not matched:
            return refuse(BadRequest(404, f"request_id {rid!r}: no recent decision has it"))
        return JSONResponse({"matched": True})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state["monitor"].prometheus(), media_type=CONTENT_TYPE)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        monitor = state["monitor"]
        return JSONResponse(
            {
                "status": "ok",
                "bundle": str(monitor.bundle.layout.root),
                "threshold": monitor.bundle.record["threshold"],
                "expert": None if monitor.gate is None else ("down" if monitor.gate.down else "up"),
                "drift_alarm": monitor.delegation.alarm or monitor.errors.alarm,
            }
        )

    return app
