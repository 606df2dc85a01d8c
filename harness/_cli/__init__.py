"""The `ctd` command line: thin commands over the harness library API."""

from __future__ import annotations

import typer

from ._calibrate import register as _register_calibration

__all__ = ["app", "main"]

app = typer.Typer(
    name="ctd",
    help=(
        "Calibrate-Then-Delegate evaluation harness: calibrate a probe-to-expert cascade so that "
        "the expert-call budget (or the accuracy) is guaranteed with high probability."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_register_calibration(app)


def main() -> None:
    """Console-script entry point."""
    app()
