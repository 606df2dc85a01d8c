"""The exceptions the CLI turns into one clean line, and the exit code each one means:

1  EXIT_FAILED       the run failed (an endpoint went down, too many items failed)
2  EXIT_INPUT        bad input: an option, a file the user named that is missing or wrong
3  EXIT_ENVIRONMENT  the machine failed the run: a full disk or quota, a read-only or
                     unwritable place, an I/O error, a locked or damaged cache; the line
                     names the path. Fix the machine and rerun: the inputs were fine.
4  EXIT_COST         the cost limit (--cost-limit) stopped the run before a request would
                     have passed it; the answers so far are cached. Rerun with a higher
                     limit to go on: answered items cost nothing again.
"""

from __future__ import annotations

import errno
import math
import os
from fractions import Fraction
from pathlib import Path

__all__ = [
    "ENVIRONMENT_ERRNOS",
    "EXIT_COST",
    "EXIT_ENVIRONMENT",
    "EXIT_FAILED",
    "EXIT_INPUT",
    "MAX_FAILED",
    "EnvironmentFailure",
    "InputError",
    "RunFailed",
    "check_cost_limit",
    "check_failed_fraction",
    "check_max_failed",
    "named",
]

EXIT_FAILED = 1
"""The exit code of a run that failed: its endpoint went down, or too many items failed."""

EXIT_INPUT = 2
"""The exit code of bad input (an option, a file the user named), found before any work."""

EXIT_ENVIRONMENT = 3
"""The exit code of a run its machine failed: a full disk or quota, a read-only or unwritable
place, an I/O error, a locked or damaged cache. A script may retry it once the machine is fixed,
unlike bad input (2), and need not look at the run's results, unlike a failed run (1)."""

EXIT_COST = 4
"""The exit code of a run stopped by its cost limit (--cost-limit) before a request would have
passed it. Nothing is wrong: a rerun with a higher limit goes on from the cache."""

ENVIRONMENT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}
)
"""The OSError numbers that are the machine's doing, not the input's: exit code 3."""

MAX_FAILED = 0.01
"""The default --max-failed: the fraction of items that may fail at the expert before a run
stops (`ctd query` exits 1; `ctd eval` stops before calibration)."""


class InputError(Exception):
    """Bad input from the user: a file, a row, an option. The message says what is wrong and
    where, in one line, and is shown without a traceback."""


class EnvironmentFailure(Exception):
    """The machine refused the run a path it needs (no space, read-only, no permission, an I/O
    error): one line naming the path and what to do, exit code 3."""


def named(error: OSError, path: Path | str, *, unless_named: str | None = None) -> OSError:
    """`error` naming `path` when it names no file (or only `unless_named`, a temporary file the
    user never heard of): a full disk met at a write, a flush or a close (pyarrow's, json's,
    matplotlib's) says only "No space left on device", and the command line must say where."""
    if error.filename not in (None, unless_named) or error.errno is None:
        return error
    return type(error)(error.errno, os.strerror(error.errno), str(path))


ALSO = "error, too: "  # the start of a note on an error: a second failure the command line prints


def add_also(error: BaseException, line: str) -> None:
    """Note on `error` a failure that came after it (cleaning up): `error` stays the one raised,
    and the command line prints this line before its own."""
    error.add_note(ALSO + line)


def also_lines(error: BaseException) -> list[str]:
    """The lines `add_also` noted on `error`."""
    return [note for note in getattr(error, "__notes__", ()) if note.startswith(ALSO)]


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


def check_cost_limit(limit: float | None) -> None:
    """A --cost-limit must be a finite number of dollars, 0 or more (NaN is not); checked before
    any work."""
    if limit is not None and not 0 <= limit < math.inf:
        raise InputError(f"--cost-limit {limit:g}: must be a number of US dollars, 0 or more")
