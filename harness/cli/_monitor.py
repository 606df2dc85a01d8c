"""`ctd monitor calibrate|audit|serve` (serve in `_monitor_serve`): the calibrated cascade as a
deployable monitor. Nothing heavy is imported at start-up (torch, the server): each command
imports what it needs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

import calibrate

from .._errors import InputError
from ..run import Roots
from ._common import clean_errors, print_json
from ._monitor_serve import monitor_serve

if TYPE_CHECKING:
    pass  # torch: only for the type

__all__ = ["register"]

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
    stop = _stop_words(result.stopped_at)
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


def _stop_words(stopped_at: int | None) -> str:
    """Where fixed-sequence testing stopped, in the certification line's words."""
    return "no p-value above delta" if stopped_at is None else f"the test stopped at position {stopped_at}"


# What each joint risk counts on D_cal, for the output lines.
_COUNTED = {"budget": ("delegated", "rows"), "error": ("wrong", "rows"), "fnr": ("missed", "positives")}


def _print_joint(written: Any, given: dict[str, float], delta: float) -> None:
    """What joint control certified: each risk's level with its D_cal count and p-value at the
    chosen threshold (or at the first one tested, when nothing was certified: which risk held it
    back), then the threshold and the bundle; exit 1 without a bundle when nothing was."""
    result = written.result
    levels = ", ".join(f"{option[2:]} {value:g}" for option, value in given.items())
    stop = _stop_words(result.stopped_at)
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


# Registered here, after calibrate and audit: `ctd monitor --help` lists them in that order.
monitor_app.command("serve")(clean_errors(monitor_serve))


def register(app: typer.Typer) -> None:
    app.add_typer(monitor_app, name="monitor")
