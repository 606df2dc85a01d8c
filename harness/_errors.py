"""The exceptions the CLI turns into one clean line: bad input (exit code 2) and a run that
finished its work but produced too many failures to be used (exit code 1)."""

from __future__ import annotations

import math
from fractions import Fraction

__all__ = ["MAX_FAILED", "InputError", "RunFailed", "check_failed_fraction", "check_max_failed"]

MAX_FAILED = 0.01
"""The default --max-failed: the fraction of items that may fail at the expert before a run
stops (`ctd query` exits 1; `ctd eval` stops before calibration)."""


class InputError(Exception):
    """Bad input from the user: a file, a row, an option. The message says what is wrong and
    where, in one line, and is shown without a traceback."""


class RunFailed(Exception):
    """The run did its work, but what it produced cannot be used as it is (for example too
    many expert answers failed). Everything it did is kept; the message says what to do."""


def check_failed_fraction(failed: int, total: int, limit: float, *, what: str, remedy: str) -> None:
    """Raise RunFailed when more than `limit` (a fraction, --max-failed) of `total` items of
    `what` failed. Decided on integers: failed > floor(limit * total), with the limit read as
    the decimal the user wrote (0.29 is 29/100, not the float just below it)."""
    check_max_failed(limit)
    allowed = math.floor(Fraction(repr(limit)) * total)
    if failed > allowed:
        raise RunFailed(
            f"{what}: {failed} of {total} failed ({failed / total:.1%}), more than --max-failed "
            f"{limit:g} allows ({allowed}); {remedy}"
        )


def check_max_failed(limit: float) -> None:
    """A --max-failed value must be a fraction in [0, 1) (NaN is not); checked before any work."""
    if not 0 <= limit < 1:
        raise InputError(f"--max-failed {limit:g}: must lie in [0, 1)")
