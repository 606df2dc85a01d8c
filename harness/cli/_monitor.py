"""`ctd monitor calibrate|serve`: the calibrated cascade as a deployable monitor. Nothing heavy is
imported at start-up (torch, the server): each command imports what it needs."""

from __future__ import annotations

import functools
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

import calibrate
from probes import BATCH_TOKENS

from .._errors import InputError
from ..monitor import ServeLimits
from ..run import BundleLayout, Roots
from ._common import clean_errors, print_json

if TYPE_CHECKING:
    from ..monitor import PassCost  # torch: only for the type

__all__ = ["register"]

MAX_BATCH = 1024  # conversations in one forward pass
MAX_BATCH_TOKENS = 1 << 20  # padded tokens in one forward pass
MAX_WAIT_MS = 1000.0  # a batch waits at most a second to fill
MAX_TIMEOUT_S = 600.0  # head and body timeouts
MAX_CONNECTIONS = 65536
# The queue bounds a user may set: below 10 ms nearly every check is shed, above 10 minutes the
# bound no longer protects anything; a count above 100,000 is memory, not a queue.
MIN_QUEUE_MS, MAX_QUEUE_MS = 10.0, 600_000.0
MAX_PENDING_CAP = 100_000

monitor_app = typer.Typer(
    help="Deploy a run's calibrated cascade: calibrate a bundle, serve it over HTTP.", no_args_is_help=True
)


@monitor_app.command("calibrate")
@clean_errors
def monitor_calibrate(
    *,
    run: Annotated[str, typer.Option("--run", help="The run whose probes and test split to use.")],
    budget: Annotated[
        float | None, typer.Option("--budget", help="Certify a delegation rate of at most ALPHA.")
    ] = None,
    accuracy: Annotated[
        float | None, typer.Option("--accuracy", help="Certify a cascade accuracy of at least LEVEL.")
    ] = None,
    fnr: Annotated[
        float | None,
        typer.Option(
            "--fnr",
            help="With --budget and/or --accuracy: also certify a false-negative rate on the "
            "high-stakes class of at most RATE (joint).",
        ),
    ] = None,
    delta: Annotated[
        float, typer.Option("--delta", help="Failure probability of the guarantee.")
    ] = calibrate.DEFAULT_DELTA,
    arch: Annotated[
        str | None, typer.Option("--arch", help="Probe configuration (default: the run's first).")
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Probe seed (default: the run's first).")] = None,
    split_seed: Annotated[
        int, typer.Option("--split-seed", help="Seed of the D_est/D_cal cut.")
    ] = calibrate.DEFAULT_SPLIT_SEED,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            help="Bundle name under runs/RUN/monitor/ (default: MODE-LEVEL, e.g. budget-0.3-accuracy-0.85).",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Replace a bundle of that name (the old one is kept as NAME.replaced-TIME)."
        ),
    ] = False,
    runs_dir: Annotated[
        Path | None, typer.Option("--runs-dir", help="Runs root (default: $CTD_RUNS_DIR or ./runs).")
    ] = None,
) -> None:
    """Calibrate a deployment threshold on the run's whole test split (Pareto filtering on D_est,
    LTT on D_cal) and write a monitor bundle; its path is the last line printed. --budget and
    --accuracy together (and --fnr with either) certify every level at once (joint control)."""
    from ..monitor import calibrate_bundle, check_bundle_name

    given = {
        option: value
        for option, value in (("--budget", budget), ("--accuracy", accuracy), ("--fnr", fnr))
        if value is not None
    }
    if budget is None and accuracy is None:
        raise InputError(
            "give --budget ALPHA or --accuracy LEVEL, or both (and --fnr RATE) to certify them jointly"
            if fnr is None
            else f"--fnr {fnr:g}: give it with --budget ALPHA and/or --accuracy LEVEL (a joint certification)"
        )
    for option, value in given.items():
        if not 0 < value < 1:  # NaN fails too
            raise InputError(f"{option} {value:g}: must lie in (0, 1)")
    error = None if accuracy is None else round(1.0 - accuracy, 12)
    layout = Roots.resolve(runs_dir).run(run)
    if len(given) > 1:
        levels = {
            risk: level
            for risk, level in (("budget", budget), ("error", error), ("fnr", fnr))
            if level is not None
        }
        name = check_bundle_name(
            name or "-".join(f"{option[2:]}-{value:g}" for option, value in given.items())
        )
        written = calibrate_bundle(
            layout, name=name, mode="joint", levels=levels, delta=delta, arch=arch, seed=seed,
            split_seed=split_seed, force=force,
        )  # fmt: skip
        _print_joint(written, given, delta)
        return
    mode = "budget" if budget is not None else "performance"
    alpha = budget if budget is not None else error
    name = check_bundle_name(
        name or (f"budget-{budget:g}" if budget is not None else f"accuracy-{accuracy:g}")
    )
    written = calibrate_bundle(
        layout,
        name=name,
        mode=mode,
        alpha=alpha,
        delta=delta,
        arch=arch,
        seed=seed,
        split_seed=split_seed,
        force=force,
    )
    folder, result = written.folder, written.result
    tested = len(result.order)
    stop = "every one rejected" if result.stopped_at is None else f"stopped at position {result.stopped_at}"
    print(
        f"{mode} control at alpha {alpha:g}, delta {delta:g}: {result.certified.size} of {tested} "
        f"thresholds certified ({stop}); n_est {result.n_est}, n_cal {result.n_cal}"
    )
    if folder is None:
        print(
            f"error: nothing certified: no threshold reaches accuracy {accuracy:g} with probability "
            f"{1 - delta:g} on this run's D_cal; no bundle written (lower --accuracy or raise --delta)",
            file=sys.stderr,
        )
        raise typer.Exit(code=1)
    print(f"threshold {result.threshold:g} (delegate when DV > threshold)")
    if written.replaced is not None:
        print(f"the bundle it replaces is kept as {written.replaced}")
    print(folder)


# What each joint risk counts on D_cal, for the output lines.
_COUNTED = {"budget": ("delegated", "rows"), "error": ("wrong", "rows"), "fnr": ("missed", "positives")}


def _print_joint(written: Any, given: dict[str, float], delta: float) -> None:
    """What joint control certified: each risk's level with its D_cal count and p-value at the
    chosen threshold (or at the first one tested, when nothing was certified: which risk held it
    back), then the threshold and the bundle; exit 1 without a bundle when nothing was."""
    result = written.result
    levels = ", ".join(f"{option[2:]} {value:g}" for option, value in given.items())
    stop = "every one rejected" if result.stopped_at is None else f"stopped at position {result.stopped_at}"
    n_cal = max(result.n_cal.values())  # every D_cal row (the false-negative rate counts positives only)
    print(
        f"joint control of {levels} at delta {delta:g}: {result.certified.size} of {len(result.order)} "
        f"thresholds certified ({stop}); n_est {result.n_est}, n_cal {n_cal}"
    )
    if len(result.order):
        position = 0 if result.selected is None else int(list(result.order).index(result.selected))
        at = "the chosen threshold" if result.selected is not None else "the first threshold tested"
        for m, (risk, level) in enumerate(result.levels.items()):
            what, rows = _COUNTED[risk]
            k, n = int(result.cal_losses[position, m]), result.n_cal[risk]
            print(
                f"  {risk} <= {level:g}: {k} of {n} D_cal {rows} {what} at {at}, "
                f"p-value {result.risk_pvalues[position, m]:.3g}"
            )
    if written.folder is None:
        held = " and ".join(f"{risk} <= {level:g}" for risk, level in result.levels.items())
        print(
            f"error: nothing certified: no threshold holds {held} "
            f"at once with probability {1 - delta:g} on this run's D_cal; no bundle written (loosen a level "
            "or raise --delta)",
            file=sys.stderr,
        )
        raise typer.Exit(code=1)
    print(
        f"threshold {result.threshold:g} (delegate when DV > threshold): every level holds there with "
        f"probability at least {1 - delta:g}"
    )
    if written.replaced is not None:
        print(f"the bundle it replaces is kept as {written.replaced}")
    print(written.folder)


@monitor_app.command("audit")
@clean_errors
def monitor_audit(
    bundle: Annotated[Path, typer.Argument(help="A bundle folder written by `ctd monitor calibrate`.")],
    *,
    run: Annotated[
        str | None,
        typer.Option(
            "--run", help="The run to audit against: a name or a folder (default: the one recorded)."
        ),
    ] = None,
    runs_dir: Annotated[
        Path | None, typer.Option("--runs-dir", help="Runs root (default: $CTD_RUNS_DIR or ./runs).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the audit as one JSON object.")] = False,
) -> None:
    """Redo the bundle's certification from its run's files: the scores table and probes it was
    certified on (sha256), its own probe copies, and the LTT record recomputed from the examples it
    names. Exit code 0 when everything matches, 1 when something differs."""
    from ..monitor import audit_bundle
    from ..run import RunLayout

    layout = None
    if run is not None:
        layout = (
            RunLayout(Path(run)) if Path(run).is_dir() and "/" in run else Roots.resolve(runs_dir).run(run)
        )
        if not layout.root.is_dir():
            raise InputError(f"--run {run}: no run folder {layout.root}")
    audit = audit_bundle(bundle, layout)
    if as_json:
        print_json(audit.to_json())
    else:
        for check in audit.checks:
            print(f"{'ok     ' if check.ok else 'DIFFERS'}  {check.what}: {check.detail}")
        failed = sum(not check.ok for check in audit.checks)
        print(
            f"audit: {bundle} matches its run {audit.run}"
            if audit.matches
            else f"audit: {failed} of {len(audit.checks)} checks differ"
        )
    if not audit.matches:
        raise typer.Exit(code=1)


@monitor_app.command("serve")
@clean_errors
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
            help="Hard cap on expert calls over the last 200 requests (budget bundles).",
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
    if max_delegation_rate is not None and not 0 < max_delegation_rate <= 1:  # NaN fails too
        raise InputError(f"--max-delegation-rate {max_delegation_rate:g}: must lie in (0, 1]")
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
        ready = functools.partial(_say_ready, root.name, address, monitor.scorer.pass_cost)
        await serve(app, listener, limits, on_ready=ready)  # the app's shutdown closes the monitor
    finally:
        loop.remove_signal_handler(signal.SIGHUP)


def _say_ready(name: str, address: str, cost: PassCost | None) -> None:
    # Until now stderr holds nothing, so that a start-up failure is its one line; from now on a
    # request is answered, so a script may wait for this line instead of polling /healthz.
    print(f"ctd monitor: serving {name}; ready: listening on {address}", file=sys.stderr, flush=True)
    if cost is not None:
        per_pass, per_token = cost.per_pass * 1e3, cost.per_token * 1e6
        print(
            f"ctd monitor: a forward pass costs {per_pass:.1f} ms + {per_token:.2f} us per padded token "
            "here (timed at start-up); micro-batches are cut into passes by that",
            file=sys.stderr,
            flush=True,
        )


def register(app: typer.Typer) -> None:
    app.add_typer(monitor_app, name="monitor")
