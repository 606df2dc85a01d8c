"""The `ctd` command line: thin commands over the harness library API (`harness.cli._app` builds
them). This module imports nothing else, so that `ctd eval` in a terminal can say that it is
starting before the commands' imports (numpy, pyarrow, typer, rich: about a second on a loaded
2-core machine)."""

from __future__ import annotations

from typing import Any

from ._starting import say_eval_is_starting

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point (`ctd`, `python -m harness.cli`)."""
    say_eval_is_starting()
    from ._app import main as run

    run()


def __getattr__(name: str) -> Any:
    """`app`, the Typer app (for tests and embedding), built on first use."""
    if name == "app":
        from ._app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
