"""Shared pieces of the CLI: clean errors, list-valued options, output."""

from __future__ import annotations

import functools
import itertools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

import numpy as np
import typer

import calibrate
from experts import ConfigError, CostLimitReached, EndpointDown, StorageError
from probes import ProbeError

from .._bounds import check_counts, check_list_length
from .._errors import (
    ENVIRONMENT_ERRNOS,
    EXIT_COST,
    EXIT_ENVIRONMENT,
    EXIT_FAILED,
    EXIT_INPUT,
    EnvironmentFailure,
    InputError,
    RunFailed,
    also_lines,
)
from .._workers import WorkerError
from ..data import dumps
from ..run import make_console

P = ParamSpec("P")
R = TypeVar("R")
Name = TypeVar("Name", bound=str)


def shown(value: object) -> str:
    """A default as its option reads it back: an evenly spaced grid as START:STOP:COUNT, another
    tuple as a comma list, a float with %g."""
    if isinstance(value, tuple):
        if len(value) > 2 and all(isinstance(v, float) for v in value):
            steps = {round(b - a, 9) for a, b in itertools.pairwise(value)}
            if len(steps) == 1:
                return f"{value[0]:g}:{value[-1]:g}:{len(value)}"
        return ",".join(shown(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


BUDGETS_TEXT = shown(calibrate.DEFAULT_BUDGETS)

stderr = make_console(stderr=True)
stdout = make_console(stderr=False)


def clean_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Turn bad input into one line on stderr and exit code 2; an expert endpoint that failed
    during the run, or a run whose failures pass --max-failed, into one line and exit code 1;
    and the machine failing the run (a full disk, a read-only or unwritable place, an I/O
    error, a locked or damaged cache) into one line naming the path and exit code 3. No
    traceback in any case."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            try:
                return command(*args, **kwargs)
            except Exception as exc:  # a failure in cleaning up after it: its own line first
                print_also(exc)
                raise
        except (InputError, ProbeError, ConfigError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(code=2) from None
        except EndpointDown as exc:  # not the input: the endpoint failed during the run
            print(f"error: {exc}; the answers so far are cached: rerun to resume", file=sys.stderr)
            raise typer.Exit(code=1) from None
        except CostLimitReached as exc:  # as asked: the next request could have passed the limit
            print(
                f"error: {exc}; the answers so far are cached: rerun with a higher --cost-limit to go on "
                "(answered items cost nothing again)",
                file=sys.stderr,
            )
            raise typer.Exit(code=EXIT_COST) from None
        except StorageError as exc:  # not the input: the file under the cache failed
            print(f"error: {exc}; {exc.remedy}", file=sys.stderr)
            raise typer.Exit(code=EXIT_ENVIRONMENT if exc.environment else EXIT_FAILED) from None
        except EnvironmentFailure as exc:  # the machine refused a path the run needs
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(code=EXIT_ENVIRONMENT) from None
        except RunFailed as exc:  # the work is done and kept, but its result is not usable
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(code=1) from None
        except WorkerError as exc:  # a bug or a crash in a worker process: its last line says which
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else "no message"
            print(f"error: a worker process failed: {last}", file=sys.stderr)
            raise typer.Exit(code=EXIT_FAILED) from None
        except MemoryError:  # the counts are bounded (harness/_bounds.py); the machine may have less
            print(
                "error: out of memory; smaller counts (--trials, --batch-tokens, --limit) need less",
                file=sys.stderr,
            )
            raise typer.Exit(code=EXIT_ENVIRONMENT) from None
        except OSError as exc:  # a file cannot be read or written: the machine's doing, or the input's
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
            code = EXIT_ENVIRONMENT if exc.errno in ENVIRONMENT_ERRNOS else EXIT_INPUT
            raise typer.Exit(code=code) from None

    return wrapper


def print_also(error: BaseException) -> None:
    """The failures noted on `error` as it propagated (`add_also`), a line each on stderr."""
    for line in also_lines(error):
        print(line, file=sys.stderr)


def list_items(text: str, option: str) -> list[str]:
    """A comma-separated option's items, stripped; an empty item (`0.3,,0.5`, a trailing comma)
    is a typo that would silently drop a value, so it is refused. Blank text is no items."""
    if not text.strip():
        return []
    items = [item.strip() for item in text.split(",")]
    if "" in items:
        raise InputError(f"{option} {text!r}: item {items.index('') + 1} is empty")
    return items


def parse_floats(text: str, option: str) -> tuple[float, ...]:
    """'0.1,0.2,0.5' or 'START:STOP:COUNT' (evenly spaced, both ends included)."""
    try:
        if ":" in text:
            start, stop, count = text.split(":")
            check_list_length(option, int(count))  # before linspace allocates them
            values = np.round(np.linspace(float(start), float(stop), int(count)), 6)
        else:
            values = np.array([float(v) for v in list_items(text, option)])
            check_list_length(option, values.size)
    except ValueError:
        raise InputError(f"{option} {text!r}: expected numbers like 0.1,0.2 or START:STOP:COUNT") from None
    if values.size == 0:
        raise InputError(f"{option} {text!r}: no values")
    return tuple(float(v) for v in values)


def parse_ints(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in list_items(text, option))
    except ValueError:
        raise InputError(f"{option} {text!r}: expected integers like 32,64,128") from None
    if not values or min(values) < 1:
        raise InputError(f"{option} {text!r}: expected positive integers")
    check_counts(option, values)
    return values


def parse_seeds(text: str, option: str) -> tuple[int, ...]:
    """Non-negative integers like 0,1,2, each once."""
    parts = list_items(text, option)
    if not parts or not all(p.isdigit() for p in parts) or len(set(parts)) != len(parts):
        raise InputError(f"{option} {text!r}: expected distinct non-negative integers like 0,1,2")
    seeds = tuple(int(p) for p in parts)
    check_counts(option, seeds, at_least=0)
    return seeds


def parse_names(text: str, option: str, allowed: tuple[Name, ...]) -> tuple[Name, ...]:
    """Comma-separated names, each one of `allowed` (typed as they are: a Literal's members), each
    once: a repeated name (`mean,mean`) would run its work twice and write its rows twice, which
    later stages cannot tell apart."""
    names = tuple(list_items(text, option))
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise InputError(
            f"{option}: unknown value {unknown[0] if unknown else text!r}; choose from {', '.join(allowed)}"
        )
    for number, name in enumerate(names, start=1):
        if name in names[: number - 1]:
            raise InputError(f"{option} {text!r}: item {number} repeats {name!r}; name each once")
    return tuple(allowed[allowed.index(n)] for n in names)


def print_json(value: object) -> None:
    """One JSON object on stdout, nothing else."""
    sys.stdout.write(dumps(value) + "\n")


def no_run_folder(name: str, folder: Path) -> InputError:
    """The one line for a run that is not where it was looked for: the whole path, and how to
    look elsewhere (the likeliest cause is a command run in another folder)."""
    return InputError(
        f"run {name!r}: no such run folder ({folder.absolute()}); --runs-dir or $CTD_RUNS_DIR names "
        "the runs folder"
    )
