"""The `ctd` Typer app: every command group registered, the exit codes, and the entry point
behind `harness.cli.main`."""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Annotated

import typer

try:  # typer >= 0.2x ships its own copy of click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
    from typer.exceptions import Abort
except ImportError:  # pragma: no cover - older typer uses the click package
    from click.exceptions import Abort, ClickException, NoArgsIsHelpError, UsageError

from .._errors import EXIT_COST, EXIT_ENVIRONMENT, EXIT_FAILED, EXIT_INPUT
from . import _cache, _calibrate, _eval, _experts, _export, _monitor, _probe, _query, _runs, _score, _validate
from ._redacting import RedactingStream

__all__ = ["app", "main"]

app = typer.Typer(
    name="ctd",
    help=(
        "Calibrate-Then-Delegate evaluation harness: calibrate a probe-to-expert cascade so that "
        "the expert-call budget (or the accuracy) is guaranteed with high probability."
    ),
    epilog=(
        f"Exit codes: 0 done; {EXIT_FAILED} the run failed (an endpoint went down, more than "
        f"--max-failed of the items failed); {EXIT_INPUT} bad input (an option, a file you named); "
        f"{EXIT_ENVIRONMENT} the machine failed the run (a full disk or quota, a read-only or "
        "unwritable path, an I/O error, a locked or damaged cache): the one line names the path; "
        f"{EXIT_COST} --cost-limit reached (rerun with a higher one to go on)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts show defaults as [VALUE]: plain text, not markup tags
)


def _print_version(value: bool) -> None:
    if value:
        from importlib import metadata

        from ..run import git_revision

        revision = git_revision()
        print(
            f"ctd-harness {metadata.version('ctd-harness')}" + (f" (git {revision[:12]})" if revision else "")
        )
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    pass


# `ctd --help` order
for _group in (
    _eval,
    _runs,
    _probe,
    _calibrate,
    _validate,
    _query,
    _experts,
    _cache,
    _monitor,
    _score,
    _export,
):
    _group.register(app)


def _terminate(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (`kill`, a job scheduler's time limit) does what Ctrl-C does: the running stage
    records that it was interrupted and a local expert server the run started is stopped, rather
    than the process dying with the server left running. The SIGINT handler in force is reused
    so that inside asyncio.run the main task is cancelled the same way. The query stage's event
    loop takes both signals itself while it runs (`harness._signals`: the expert client is
    drained, whether SIGINT is ignored or not), so this handler does not raise inside those loops."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:  # SIGINT ignored (a background job of a non-interactive shell): SIGTERM still stops
        raise KeyboardInterrupt


def main() -> None:
    """Console-script entry point. Usage errors (an unknown option, a value that is not one of
    the choices) are one line on stderr with exit code 2, like every other bad input."""
    signal.signal(signal.SIGTERM, _terminate)
    if not isinstance(sys.stderr, RedactingStream):  # a key a server echoed is printed nowhere
        sys.stderr = RedactingStream(sys.stderr)
    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as exc:
        print(exc.ctx.get_help(), file=sys.stderr)
        sys.exit(2)
    except UsageError as exc:
        message = exc.format_message().replace("Value error, ", "")
        takes_data = exc.ctx is not None and any("--data" in p.opts for p in exc.ctx.command.params)
        if takes_data and "unexpected extra argument" in message and "=" in message:
            # `--data train=A dev=B` unquoted: the shell split the spec into two words.
            message += (
                "; a --data spec of several parts is one quoted word ('train=A dev=B'), or a --data for each"
            )
        where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        print(f"error: {message}{where}", file=sys.stderr)
        sys.exit(2)
    except ClickException as exc:
        print(f"error: {exc.format_message()}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except Abort:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
