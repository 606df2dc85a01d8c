"""The one exception the CLI turns into a clean one-line error and exit code 2."""

from __future__ import annotations

__all__ = ["InputError"]


class InputError(Exception):
    """Bad input from the user: a file, a row, an option. The message says what is wrong and
    where, in one line, and is shown without a traceback."""
