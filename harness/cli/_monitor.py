"""`ctd monitor calibrate|serve`: the calibrated cascade as a deployable monitor. Nothing heavy is
imported at start-up (torch, the server): each command imports what it needs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from .._errors import InputError
from ..run._layout import Roots
from ._common import clean_errors

__all__ = ["register"]

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
    delta: Annotated[float, typer.Option("--delta", help="Failure probability of the guarantee.")] = 0.1,
    arch: Annotated[
        str | None, typer.Option("--arch", help="Probe configuration (default: the run's first).")
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Probe seed (default: the run's first).")] = None,
    split_seed: Annotated[int, typer.Option("--split-seed", help="Seed of the D_est/D_cal cut.")] = 0,
    name: Annotated[
        str | None, typer.Option("--name", help="Bundle name under runs/RUN/monitor/ (default: MODE-LEVEL).")
    ] = None,
    runs_dir: Annotated[
        Path | None, typer.Option("--runs-dir", help="Runs root (default: $CTD_RUNS_DIR or ./runs).")
    ] = None,
) -> None:
    """Calibrate a deployment threshold on the run's whole test split (Pareto filtering on D_est,
    LTT on D_cal) and write a monitor bundle; its path is the last line printed."""
    from ..monitor._bundle import calibrate_bundle

    if (budget is None) == (accuracy is None):
        raise InputError("give exactly one of --budget ALPHA and --accuracy LEVEL")
    if accuracy is not None and not 0 < accuracy < 1:
        raise InputError(f"--accuracy {accuracy:g}: must lie in (0, 1)")
    mode = "budget" if budget is not None else "performance"
    alpha = budget if budget is not None else round(1.0 - float(accuracy), 12)  # type: ignore[arg-type]
    name = name or (f"budget-{budget:g}" if budget is not None else f"accuracy-{accuracy:g}")
    layout = Roots.resolve(runs_dir).run(run)
    folder, result = calibrate_bundle(
        layout, name=name, mode=mode, alpha=alpha, delta=delta, arch=arch, seed=seed, split_seed=split_seed
    )
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
    print(folder)


@monitor_app.command("serve")
@clean_errors
def monitor_serve(
    bundle: Annotated[Path, typer.Argument(help="A bundle folder written by `ctd monitor calibrate`.")],
    *,
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8400,
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
        typer.Option("--log", help="Decision log, JSONL, appended (default: BUNDLE/decisions.jsonl)."),
    ] = None,
    log_text: Annotated[bool, typer.Option("--log-text", help="Also log each conversation's text.")] = False,
    max_delegation_rate: Annotated[
        float | None,
        typer.Option("--max-delegation-rate", help="Hard cap on expert calls over the last 200 requests."),
    ] = None,
    max_batch: Annotated[
        int, typer.Option("--max-batch", help="Conversations per forward pass at most.")
    ] = 32,
    max_wait_ms: Annotated[
        float, typer.Option("--max-wait-ms", help="How long a forward batch waits to fill.")
    ] = 5.0,
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
    """Serve a bundle: POST /v1/check, POST /v1/feedback, GET /metrics, GET /healthz."""
    import uvicorn

    from ..monitor._admission import MAX_PENDING, MAX_QUEUE_SECONDS
    from ..monitor._bundle import read_bundle
    from ..monitor._monitor import Monitor
    from ..monitor._server import create_app

    read = read_bundle(bundle)
    if expert_url is not None or not no_expert:
        read.expert_spec(expert_url)  # a URL that cannot work is one line now, not at start-up
    if max_delegation_rate is not None and not 0 < max_delegation_rate <= 1:
        raise InputError(f"--max-delegation-rate {max_delegation_rate:g}: must lie in (0, 1]")
    if max_batch < 1 or max_wait_ms < 0 or not 0 < port < 65536:
        raise InputError("--max-batch must be at least 1, --max-wait-ms at least 0, --port in 1..65535")
    max_queue_ms = MAX_QUEUE_SECONDS * 1e3 if max_queue_ms is None else max_queue_ms
    max_pending = MAX_PENDING if max_pending is None else max_pending
    if not MIN_QUEUE_MS <= max_queue_ms <= MAX_QUEUE_MS:
        raise InputError(f"--max-queue-ms {max_queue_ms:g}: must lie in [{MIN_QUEUE_MS:g}, {MAX_QUEUE_MS:g}]")
    if not 1 <= max_pending <= MAX_PENDING_CAP:
        raise InputError(f"--max-pending {max_pending}: must lie in [1, {MAX_PENDING_CAP}]")

    async def load() -> Monitor:
        return await Monitor.load(
            bundle,
            expert_url=expert_url,
            expert=not no_expert,
            expert_cache=expert_cache,
            model=model,
            log_path=log or read.layout.decisions,
            log_text=log_text,
            max_delegation_rate=max_delegation_rate,
            max_batch=max_batch,
            max_wait=max_wait_ms / 1e3,
            max_queue=max_queue_ms / 1e3,
            max_pending=max_pending,
        )

    print(f"ctd monitor: loading {bundle}; serving on http://{host}:{port} once ready", file=sys.stderr)
    uvicorn.run(create_app(load), host=host, port=port, log_level="warning", access_log=False)


def register(app: typer.Typer) -> None:
    app.add_typer(monitor_app, name="monitor")
