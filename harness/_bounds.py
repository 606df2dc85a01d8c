"""The upper bounds of every count option, in one place.

A count past its bound cannot finish on any machine this tool is for: a billion validation trials
or a grid of a hundred million budgets ends in MemoryError after minutes of work, a seed past
2**32 - 1 is refused by numpy deep inside training. Each is refused before any work, with one
line that names the option and its limit. The bounds are generous (100x or more the defaults and
the paper's settings); raise one here, and only here, when a real run needs more.
"""

from __future__ import annotations

from ._errors import InputError

__all__ = ["LIMITS", "check_count", "check_counts", "check_levels", "check_list_length"]

LIMITS: dict[str, int] = {
    "--trials": 100_000,  # validation trials (the paper: 500 to 2,000)
    "--epochs": 100_000,
    "--max-tokens": 1_048_576,  # tokens per input: longer than any model's context
    "--batch-tokens": 16_777_216,
    "--layer": 1_000,
    "--limit": 100_000_000,  # examples per split
    "--batch-sizes": 10_000_000,  # each batch size
    "--seeds": 4_294_967_295,  # each seed: numpy and torch take seeds below 2**32
    "--n": 10_000_000,  # synthetic rows per seed
    "--n-dev": 10_000_000,
    "--cal-size": 100_000_000,
    "rows": 100_000_000,  # synthetic rows in all (seeds x (n + n_dev)): 8 float columns, ~7 GB
    # Experts of a cascade: every configuration of the product grid is tested, (grid + 1)^K of them.
    "stages": 3,
    "--concurrency": 4_096,  # requests in flight to one expert
    "values": 10_000,  # entries of one list option (--budgets START:STOP:COUNT, --seeds, ...)
}


def check_count(option: str, value: int | None, *, at_least: int = 1) -> None:
    """InputError naming `option` when `value` lies outside [at_least, its limit]; None passes."""
    if value is None:
        return
    limit = LIMITS[option]
    if value < at_least:
        raise InputError(f"{option} {value}: must be at least {at_least}")
    if value > limit:
        raise InputError(f"{option} {value}: at most {limit:,}")


def check_counts(option: str, values: tuple[int, ...], *, at_least: int = 1) -> None:
    """Each of a list option's values within bounds, and not more values than any run needs."""
    check_list_length(option, len(values))
    for value in values:
        check_count(option, value, at_least=at_least)


def check_list_length(option: str, count: int) -> None:
    """A list option (or a START:STOP:COUNT grid) holds at most LIMITS['values'] values."""
    if count > LIMITS["values"]:
        raise InputError(f"{option}: {count:,} values, at most {LIMITS['values']:,}")


def check_levels(option: str, values: tuple[float, ...]) -> tuple[float, ...]:
    """Levels (budgets, error levels, delta): at least one, each inside (0, 1). The one check of
    `--budgets`, whether from a flag of `ctd eval` or `ctd calibrate` or from config.toml."""
    bad = [v for v in values if not 0 < v < 1]  # also rejects NaN
    if bad or not values:
        raise InputError(f"{option}: {f'{bad[0]:g}' if bad else 'none'} is outside (0, 1)")
    return values
