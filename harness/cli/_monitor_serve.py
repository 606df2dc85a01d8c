"""`ctd monitor serve`: the bundle's cascade over HTTP. Every option is checked, and the port bound,
before the model loads (seconds to minutes); torch and the server are imported only then."""

from __future__ import annotations

import functools
import gc
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from probes import BATCH_TOKENS, MAX_BATCH_TOKENS

from .._errors import InputError
from ..monitor import ServeLimits
from ..run import BundleLayout

if TYPE_CHECKING:
    from ..monitor import RestartingScorer, ThreadScorer

__all__ = ["monitor_serve"]

MAX_BATCH = 1024  # conversations in one forward pass
MAX_WAIT_MS = 1000.0  # a batch waits at most a second to fill
MAX_TIMEOUT_S = 600.0  # head and body timeouts
MAX_CONNECTIONS = 65536
# The queue bounds a user may set: below 10 ms nearly every check is shed, above 10 minutes the
# bound no longer protects anything; a count above 100,000 is memory, not a queue.
MIN_QUEUE_MS, MAX_QUEUE_MS = 10.0, 600_000.0
MAX_PENDING_CAP = 100_000


def monitor_serve(
    bundle: Annotated[Path, typer.Argument(help="A bundle folder written by `ctd monitor calibrate`.")],
    *,
    port: Annotated[int, typer.Option("--port", help="TCP port (1-65535).")] = 8400,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    expert_url: Annotated[
        str | None, typer.Option("--expert-url", help="Ask the bundle's expert at this base URL instead.")
    ] = None,
    no_expert: Annotated[
        bool,
        typer.Option("--no-expert", help="Never ask the expert (delegated requests keep the probe score)."),
    ] = False,
    expert_cache: Annotated[
        Path | None, typer.Option("--expert-cache", help="An expert cache (SQLite) to read and fill.")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Another copy of the probes' model (same weights).")
    ] = None,
    log: Annotated[
        Path | None,
        typer.Option(
            "--log",
            help=f"Decision log, JSONL, appended (default: {BundleLayout(Path('BUNDLE')).decisions}).",
        ),
    ] = None,
    log_text: Annotated[bool, typer.Option("--log-text", help="Also log each conversation's text.")] = False,
    max_delegation_rate: Annotated[
        float | None,
        typer.Option(
            "--max-delegation-rate",
            help="Hard cap on expert calls over the last 200 requests, or 1/R where longer (budget bundles).",
        ),
    ] = None,
    max_batch: Annotated[
        int, typer.Option("--max-batch", help=f"Conversations per forward pass at most (1-{MAX_BATCH}).")
    ] = 32,
    max_wait_ms: Annotated[
        float,
        typer.Option("--max-wait-ms", help=f"How long a forward batch waits to fill (0-{MAX_WAIT_MS:g})."),
    ] = 5.0,
    batch_tokens: Annotated[
        int | None,
        typer.Option(
            "--batch-tokens",
            help=f"Padded tokens in one forward pass at most (bounds its memory; default {BATCH_TOKENS}, "
            f"at most {MAX_BATCH_TOKENS:,}; below the probes' token limit it is raised to it).",
        ),
    ] = None,
    scorer_process: Annotated[
        bool | None,
        typer.Option(
            "--scorer-process/--scorer-threads",
            help="Tokenise and score in a process of its own, or in threads of the server's "
            "(default: a process when there is a GPU, whose kernel launches would otherwise take "
            "turns with the HTTP work under one GIL; threads on a CPU).",
        ),
    ] = None,
    drift_mtfa: Annotated[
        float | None,
        typer.Option(
            "--drift-mtfa",
            help="Mean requests to a false drift alarm at the certified rate, 100 to 1e12 (default 1e8).",
        ),
    ] = None,
    auth_token_env: Annotated[
        str | None,
        typer.Option(
            "--auth-token-env",
            help="Require `Authorization: Bearer TOKEN` on POSTs, TOKEN read from this environment variable.",
        ),
    ] = None,
    head_timeout: Annotated[
        float, typer.Option("--head-timeout", help="Seconds a connection has to send each request's headers.")
    ] = ServeLimits.head_timeout,
    body_timeout: Annotated[
        float, typer.Option("--body-timeout", help="Seconds a request has to send its body.")
    ] = ServeLimits.body_timeout,
    max_connections: Annotated[
        int, typer.Option("--max-connections", help="Open connections at most (idle ones are closed first).")
    ] = ServeLimits.max_connections,
    max_queue_ms: Annotated[
        float | None,
        typer.Option(
            "--max-queue-ms",
            help="Shed a check (503, Retry-After) when its expected wait in the queue is longer "
            "(default 1000).",
        ),
    ] = None,
    max_pending: Annotated[
        int | None,
        typer.Option("--max-pending", help="Shed a check when this many are already queued (default 512)."),
    ] = None,
) -> None:
    """Serve a bundle: POST /v1/check, POST /v1/feedback, GET /metrics, GET /healthz.

    SIGTERM or Ctrl-C stops it gracefully; SIGHUP starts a new decision log
    at the same path once the old one was renamed away (log rotation)."""
    import asyncio

    from ..monitor import (
        DEFAULT_MTFA,
        MAX_PENDING,
        MAX_QUEUE_SECONDS,
        bind_listener,
        check_delegation_rate,
        check_mtfa,
        raise_open_file_limit,
        read_bundle,
    )

    # Everything the user can get wrong is checked here, before the model loads (seconds).
    _check_range("--port", port, 1, 65535)
    _check_range("--max-batch", max_batch, 1, MAX_BATCH)
    _check_range("--max-wait-ms", max_wait_ms, 0, MAX_WAIT_MS)
    if batch_tokens is not None:
        _check_range("--batch-tokens", batch_tokens, 1, MAX_BATCH_TOKENS)
    _check_range("--head-timeout", head_timeout, 0.1, MAX_TIMEOUT_S)
    _check_range("--body-timeout", body_timeout, 0.1, MAX_TIMEOUT_S)
    _check_range("--max-connections", max_connections, 1, MAX_CONNECTIONS)
    if max_delegation_rate is not None:
        check_delegation_rate(max_delegation_rate)
    mtfa = check_mtfa(DEFAULT_MTFA if drift_mtfa is None else drift_mtfa)
    token = _auth_token(auth_token_env)
    read = read_bundle(bundle)
    if expert_url is not None or not no_expert:
        read.expert_spec(expert_url)  # a URL that cannot work is one line now, not at start-up
    read.check_cap(max_delegation_rate)
    max_queue_ms = MAX_QUEUE_SECONDS * 1e3 if max_queue_ms is None else max_queue_ms
    max_pending = MAX_PENDING if max_pending is None else max_pending
    if not MIN_QUEUE_MS <= max_queue_ms <= MAX_QUEUE_MS:
        raise InputError(f"--max-queue-ms {max_queue_ms:g}: must lie in [{MIN_QUEUE_MS:g}, {MAX_QUEUE_MS:g}]")
    if not 1 <= max_pending <= MAX_PENDING_CAP:
        raise InputError(f"--max-pending {max_pending}: must lie in [1, {MAX_PENDING_CAP}]")
    log_path = log or read.layout.decisions
    _check_log_path(log_path)
    raise_open_file_limit(max_connections)
    limits = ServeLimits(
        head_timeout=head_timeout, body_timeout=body_timeout, max_connections=max_connections
    )
    listener = bind_listener(host, port)  # a port in use is one line now, before the model loads
    address = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"  # IPv6 in brackets
    try:
        asyncio.run(
            _load_and_serve(
                read.layout.root,
                listener,
                address,
                limits,
                token,
                expert_url=expert_url,
                expert=not no_expert,
                expert_cache=expert_cache,
                model=model,
                log_path=log_path,
                log_text=log_text,
                max_delegation_rate=max_delegation_rate,
                max_batch=max_batch,
                max_wait=max_wait_ms / 1e3,
                batch_tokens=batch_tokens,
                scorer_process=scorer_process,
                drift_mtfa=mtfa,
                max_queue=max_queue_ms / 1e3,
                max_pending=max_pending,
            )
        )
    finally:
        listener.close()


def _check_range(option: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:  # NaN is refused too: every comparison with it is false
        raise InputError(f"{option} {_number(value)}: must lie in {_number(low)}..{_number(high)}")


def _number(x: float) -> str:
    """Integers as integers (1048576, not 1.04858e+06), other values as %g."""
    return str(x) if isinstance(x, int) else f"{x:g}"


def _auth_token(variable: str | None) -> str | None:
    """The bearer token from the environment variable `variable` (None: no authentication)."""
    if variable is None:
        return None
    if not variable or "=" in variable:
        raise InputError(f"--auth-token-env {variable!r}: give the name of an environment variable")
    token = os.environ.get(variable, "").strip()
    if not token:
        raise InputError(
            f"--auth-token-env {variable}: the variable is unset or empty (export the token in it)"
        )
    if not token.isascii() or not token.isprintable() or " " in token:
        raise InputError(f"--auth-token-env {variable}: the token must be printable ASCII without spaces")
    return token


def _check_log_path(path: Path) -> None:
    """The decision log can be appended to: checked without creating it or its folder, so that a
    refusal at start-up writes nothing (the monitor creates it once everything has loaded)."""
    if path.is_dir():
        raise InputError(f"--log {path}: is a folder; give a file path")
    if path.exists():
        writable = os.access(path, os.W_OK)
    else:  # the nearest folder that exists must let the missing part be made in it
        folder = next(p for p in path.absolute().parents if p.exists())
        writable = folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)
    if not writable:
        raise InputError(f"--log {path}: cannot be appended to (not writable here); give --log elsewhere")


async def _load_and_serve(
    root: Path, listener: socket.socket, address: str, limits: ServeLimits, token: str | None, **options: Any
) -> None:
    """Load the monitor in this event loop (a load failure is an ordinary error here, before any
    request is accepted), then serve on the bound socket until SIGINT/SIGTERM. SIGHUP reopens
    the decision log (log rotation) instead of killing the server, as daemons do; one that comes
    while the model loads is acted on once it has."""
    import asyncio
    import signal

    from ..monitor import Monitor, create_app, serve

    monitor: Monitor | None = None
    hung_up = False

    def on_hangup() -> None:
        nonlocal hung_up
        if monitor is None:
            hung_up = True
        else:
            monitor.reopen_log()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, on_hangup)
    try:
        monitor = await Monitor.load(root, **options)
        if hung_up:
            monitor.reopen_log()
        try:
            app = create_app(monitor, auth_token=token, body_timeout=limits.body_timeout)
        except BaseException:
            await monitor.aclose()
            raise
        ready = functools.partial(_say_ready, root.name, address, monitor.scorer)
        # What is loaded by now (torch and the model in threads mode, the server's modules) lives as
        # long as the server: out of the collector's way, so that its full collections, which scan
        # every tracked object while holding the GIL, stop scanning it.
        gc.collect()
        gc.freeze()
        await serve(app, listener, limits, on_ready=ready)  # the app's shutdown closes the monitor
    finally:
        loop.remove_signal_handler(signal.SIGHUP)


def _say_ready(name: str, address: str, scorer: ThreadScorer | RestartingScorer) -> None:
    # Until now stderr holds nothing, so that a start-up failure is its one line; from now on a
    # request is answered, so a script may wait for this line instead of polling /healthz.
    print(f"ctd monitor: serving {name}; ready: listening on {address}", file=sys.stderr, flush=True)
    cost = scorer.pass_cost
    if cost is not None:
        per_pass, per_token = cost.per_pass * 1e3, cost.per_token * 1e6
        print(
            f"ctd monitor: scoring {scorer.where}; a forward pass costs {per_pass:.1f} ms + "
            f"{per_token:.2f} us per padded token here (timed at start-up); micro-batches are cut into "
            "passes by that",
            file=sys.stderr,
            flush=True,
        )
