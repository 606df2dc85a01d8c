"""The monitor's HTTP transport: a listening socket bound before the model loads, and uvicorn with
a guarded HTTP/1.1 protocol (uvicorn's httptools one), so that slow or idle clients cannot hold
the server's file descriptors.

Guard rule: a connection must deliver each request head (request line and headers) within
`head_timeout` seconds of opening or of its previous response, else it is closed; a head longer
than MAX_HEAD_BYTES is answered 431 and closed (httptools, unlike h11, has no bound of its own). At most
`max_connections` are open at once; one more evicts the oldest connection that is still waiting
for a head (slow or idle), or, when every open connection is busy with a request, is answered 503
and closed at once. Bodies are timed by the app (`body_timeout`).
"""

from __future__ import annotations

import asyncio
import errno
import json
import resource
import socket
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .._errors import InputError
from ._limits import ACCEPT_BURST, FD_RESERVE, LISTEN_BACKLOG, ServeLimits

__all__ = ["MAX_HEAD_BYTES", "bind_listener", "guarded_protocol", "raise_open_file_limit", "serve"]

MAX_HEAD_BYTES = 64 * 1024  # a check's head is a few hundred bytes; h11's own bound was 16 KiB


def _closing_answer(status: str, error: str, *headers: str) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, {"error": ...} as every refusal."""
    body = json.dumps({"error": error}).encode() + b"\n"
    head = [f"HTTP/1.1 {status}", "content-type: application/json", *headers, "connection: close"]
    return ("\r\n".join([*head, f"content-length: {len(body)}", "", ""])).encode() + body


REFUSAL = _closing_answer(
    "503 Service Unavailable", "too many open connections: retry in a second", "retry-after: 1"
)
HEAD_TOO_LARGE = _closing_answer(
    "431 Request Header Fields Too Large", f"request head over {MAX_HEAD_BYTES} bytes: not accepted"
)


def guarded_protocol(limits: ServeLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol enforcing the module's guard rule; one class per server, since
    the connections waiting for a head are shared between its instances. (httptools, a C parser,
    not h11: on the monitor's check h11 was a quarter of the server's main-thread time.)"""
    waiting: OrderedDict[GuardedProtocol, asyncio.TimerHandle] = OrderedDict()  # oldest first

    class GuardedProtocol(HttpToolsProtocol):
        head_bytes: int | None = None  # bytes received of a head begun and not yet complete
        heads_begun = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                oldest = next(iter(waiting), None)
                if oldest is None:  # every other connection is mid-request: refuse this one
                    transport.write(REFUSAL)
                    transport.close()
                    return
                oldest._drop()
            self._await_head()

        def _await_head(self) -> None:
            self._stop_waiting()
            waiting[self] = self.loop.call_later(limits.head_timeout, self._drop)

        def _stop_waiting(self) -> None:
            timer = waiting.pop(self, None)
            if timer is not None:
                timer.cancel()

        def _drop(self) -> None:
            """Close a connection that sent no complete request head in time (no response owed)."""
            self._stop_waiting()
            if not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            begun = self.heads_begun
            super().data_received(data)
            # All of `data` is head when the same head was under way before it and still is after
            # it. The read that begins a head may hold the end of the last request too, so it is
            # not counted: a head is cut at MAX_HEAD_BYTES past its first read (256 KiB at most).
            if self.head_bytes is not None and self.heads_begun == begun:
                self.head_bytes += len(data)
                if self.head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                    self._stop_waiting()
                    self.transport.write(HEAD_TOO_LARGE)
                    self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.head_bytes = 0
            self.heads_begun += 1

        def on_headers_complete(self) -> None:
            self.head_bytes = None
            super().on_headers_complete()
            self._stop_waiting()  # a head arrived: the request is the app's now

        def on_response_complete(self) -> None:
            if not self.transport.is_closing():
                self._await_head()
            super().on_response_complete()  # may start a pipelined request, whose head is here
            if self.cycle is not None and not self.cycle.response_complete:
                self._stop_waiting()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_waiting()
            super().connection_lost(exc)

    return GuardedProtocol


def raise_open_file_limit(max_connections: int) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; InputError when the connections, an accept
    burst and the reserve do not fit in it."""
    needed = max_connections + ACCEPT_BURST + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft != resource.RLIM_INFINITY and needed > soft:
        raise InputError(
            f"--max-connections {max_connections}: the open-file limit is {soft} (ulimit -n), "
            f"which holds at most {max(0, soft - ACCEPT_BURST - FD_RESERVE)} connections"
        )
    return soft


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port, or InputError saying why not (in use, no such host)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise InputError(
            f"--host {host}: not an address this machine can listen on ({error.strerror})"
        ) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise InputError(f"--port {port}: {host}:{port} is already in use (another server?)") from None
        raise InputError(f"--host {host} --port {port}: cannot listen there ({error.strerror})") from None
    sock.setblocking(False)
    return sock


async def serve(
    app: Any, sock: socket.socket, limits: ServeLimits, on_ready: Callable[[], None] | None = None
) -> None:
    """Serve `app` on the bound socket until SIGINT/SIGTERM, which end it within
    `limits.graceful_shutdown` seconds (requests still running then are cancelled). `on_ready`
    is called once the server accepts connections (the app's start-up done)."""
    config = uvicorn.Config(
        app,
        http=guarded_protocol(limits),
        log_level="warning",
        access_log=False,
        timeout_keep_alive=max(1, round(limits.keep_alive)),
        timeout_graceful_shutdown=max(1, round(limits.graceful_shutdown)),
        backlog=ACCEPT_BURST,  # also the accept burst: see ACCEPT_BURST
    )
    await _Server(config, on_ready).serve(sockets=[sock])


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None] | None) -> None:
        super().__init__(config)
        self._on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        for sock in sockets or []:  # asyncio shortened the kernel's queue to the accept burst
            sock.listen(LISTEN_BACKLOG)
        if self.started and not self.should_exit and self._on_ready is not None:
            self._on_ready()
