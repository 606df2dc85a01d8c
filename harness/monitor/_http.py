"""The monitor's HTTP transport: a listening socket bound before the model loads, and uvicorn with
a guarded HTTP/1.1 protocol, so that slow or idle clients cannot hold the server's file descriptors.

Guard rule: a connection must deliver each request head (request line and headers) within
`head_timeout` seconds of opening or of its previous response, else it is closed. At most
`max_connections` are open at once; one more evicts the oldest connection that is still waiting
for a head (slow or idle), or, when every open connection is busy with a request, is answered 503
and closed at once. Bodies are timed by the app (`body_timeout`).
"""

from __future__ import annotations

import asyncio
import errno
import resource
import socket
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .._errors import InputError
from ._limits import ACCEPT_BURST, FD_RESERVE, LISTEN_BACKLOG, ServeLimits

__all__ = ["bind_listener", "guarded_protocol", "raise_open_file_limit", "serve"]

REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b"connection: close\r\ncontent-length: 58\r\n\r\n"
    b'{"error": "too many open connections: retry in a second"}\n'
)


def guarded_protocol(limits: ServeLimits) -> type[H11Protocol]:
    """An H11Protocol class enforcing the module's guard rule; one class per server, since the
    connections waiting for a head are shared between its instances."""
    waiting: OrderedDict[GuardedProtocol, asyncio.TimerHandle] = OrderedDict()  # oldest first

    class GuardedProtocol(H11Protocol):
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

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._stop_waiting()  # a head arrived: the request is the app's now

        def on_response_complete(self) -> None:
            # Armed before super(), which may parse a pipelined head and so stop the wait again.
            if not self.transport.is_closing():
                self._await_head()
            super().on_response_complete()

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
