"""What one HTTP client may hold of `ctd monitor serve` (defaults of its options). Kept apart
from the transport so that the CLI reads the defaults without importing uvicorn."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ACCEPT_BURST", "FD_RESERVE", "LISTEN_BACKLOG", "ServeLimits"]

FD_RESERVE = 64  # file descriptors kept beside the connections: model files, logs, the expert
# Connections asyncio accepts in one go (its accept loop takes up to `backlog` before any of them
# is seen by the protocol), so the open count may pass the cap by this much for a moment. Kept
# inside the open-file limit, or accept() fails with EMFILE and asyncio logs one traceback per
# retry, up to `backlog` of them per burst.
ACCEPT_BURST = 128
# Connections the kernel queues before they are accepted: they hold no descriptor of ours, so
# the queue can be long (asyncio sets it to ACCEPT_BURST; the server sets it back once started).
LISTEN_BACKLOG = 2048


@dataclass(frozen=True)
class ServeLimits:
    """Seconds to send a request head and a body, open connections in all, seconds an idle
    keep-alive connection stays open, seconds SIGTERM waits for running requests."""

    head_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 512
    keep_alive: float = 5.0
    graceful_shutdown: float = 10.0
