"""An OpenAI-compatible HTTP endpoint (one served model, one or more replicas)."""

from __future__ import annotations

import email.utils
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import httpx

from ._config import Timeout, check_base_url
from ._errors import ConfigError, HTTPStatusError, ResponseError, TransportError
from ._redact import MASK, redact

__all__ = ["Endpoint", "default_transport"]


def default_transport(max_connections: int) -> httpx.AsyncBaseTransport:
    """httpx over aiohttp: plain httpx slows down as concurrency grows (NOTES: 250 requests/s
    at 64 in flight on 2 cores, against 1,800 with this transport)."""
    from httpx_aiohttp import AiohttpTransport

    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return AiohttpTransport(limits=limits)


_WINDOW = 8192  # characters of an error body redacted for its message (see Endpoint._detail)


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header: a number, or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - time.time())


def _check_key(api_key_env: str | None) -> None:
    """ConfigError, naming the variable and never its value, when the key it holds cannot go
    into an HTTP header: a line break (a .env file saved with Windows line ends leaves a CR at its
    end) or a character outside ASCII."""
    key = os.environ.get(api_key_env) if api_key_env else None
    if not key:
        return
    bad = next((i for i, ch in enumerate(key) if not " " <= ch <= "~"), None)
    if bad is not None:
        where = "ends in" if bad == len(key) - 1 else f"holds at character {bad + 1}"
        kind = "a line break" if key[bad] in "\r\n" else "a control or non-ASCII character"
        raise ConfigError(
            f"${api_key_env} {where} {kind}, which an HTTP header cannot carry (a .env file with "
            "Windows line ends leaves a CR): set the variable to the key alone"
        )


class Endpoint:
    """POSTs JSON to `base_url + path` on the least-busy replica and returns the parsed answer.

    The API key is read from the environment variable `api_key_env` at each request and sent
    as a bearer token; it is never stored. Errors arrive as the `experts` exception tree, their
    text redacted (`experts._redact`): a server that echoes the key puts it in no message.
    """

    def __init__(
        self,
        base_urls: Sequence[str],
        *,
        api_key_env: str | None = None,
        timeout: Timeout | None = None,
        max_connections: int = 64,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not base_urls:
            raise ConfigError("an endpoint needs at least one base URL")
        self.base_urls = tuple(check_base_url(url, "base URL").rstrip("/") for url in base_urls)
        self.api_key_env = api_key_env
        _check_key(api_key_env)
        self._in_flight = [0] * len(self.base_urls)
        self._next = 0
        self._client = httpx.AsyncClient(
            transport=transport or default_transport(max_connections),
            timeout=(timeout or Timeout()).to_httpx(),
        )

    def _key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def _headers(self) -> dict[str, str]:
        key = self._key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _said(self, text: str) -> str:
        """Text built from the server's answer or the network's error, safe to raise."""
        return redact(text, self.api_key_env)

    def _detail(self, content: bytes) -> str:
        """The start of an error body for its message, redacted before it is cut (cut first, a key
        across the cut would leave its start). Only the first 8 KiB are redacted: an HTML error
        page can run to megabytes, at about 0.3 s a megabyte in the event loop. Should redaction
        eat half of them, the whole body is, since a key cut at 8 KiB could then come into view."""
        text = content.decode("utf-8", "replace")
        said = self._said(text[:_WINDOW])
        if len(said) < _WINDOW // 2 < len(text):
            said = self._said(text)
        return said[:200].strip()

    def _unechoed(self, content: bytes) -> bytes:
        """An answer's body without the key, should the server echo it: the caller stores the
        answer (the cache's response column). Only the exact value goes, not shapes, so that
        no token of the answer's logprobs is touched."""
        key = self._key()
        return content.replace(key.encode(), MASK.encode()) if key and key.encode() in content else content

    def _pick(self) -> int:
        """The replica with fewest requests in flight; ties go round-robin."""
        n = len(self.base_urls)
        start = self._next
        best = min(range(n), key=lambda i: (self._in_flight[(start + i) % n], i))
        self._next = (start + 1) % n
        return (start + best) % n

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[Any, float]:
        """(parsed JSON, seconds taken)."""
        replica = self._pick()
        url = self.base_urls[replica] + path
        self._in_flight[replica] += 1
        started = time.perf_counter()
        try:
            response = await self._client.request(method, url, json=body, headers=self._headers())
            content = await response.aread()
        except httpx.TimeoutException as exc:
            # httpx-aiohttp reports a refused connection, and one the server dropped, as
            # ConnectTimeout: tell them apart by the cause, so no one waits out a "timeout".
            cause = exc.__cause__
            if isinstance(cause, aiohttp.ClientConnectorError):
                refused = isinstance(cause.os_error, ConnectionRefusedError)
                why = "connection refused" if refused else cause.os_error.strerror or str(cause.os_error)
                raise TransportError(self._said(f"{url}: {why}"), reason="connection") from None
            if isinstance(cause, aiohttp.ServerDisconnectedError | ConnectionError):
                raise TransportError(
                    f"{url}: the server closed the connection", reason="connection"
                ) from None
            raise TransportError(f"{url}: timed out ({type(exc).__name__})", reason="timeout") from None
        except (TimeoutError, httpx.TransportError, aiohttp.ClientError, ConnectionError) as exc:
            what = self._said(f"{url}: {type(exc).__name__}: {exc}")
            raise TransportError(what, reason="connection") from None
        finally:
            self._in_flight[replica] -= 1
        elapsed = time.perf_counter() - started
        if response.status_code >= 400:
            detail = self._detail(content)
            raise HTTPStatusError(
                response.status_code,
                f"{url}: {detail}",
                retry_after=_retry_after(response.headers.get("retry-after")),
            )
        try:
            return json.loads(self._unechoed(content)), elapsed
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ResponseError(f"{url}: the answer is not JSON", reason="malformed-json") from None

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> Endpoint:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
