"""Why the monitor cannot take a request now: the server answers these with 503 and a
Retry-After header. Bad input is `harness.InputError` (a 4xx); these are the monitor's state."""

from __future__ import annotations

__all__ = ["LogUnavailable", "Overloaded", "Unavailable"]


class Unavailable(Exception):
    """The request was refused before anything was paid for it; `retry_after` (seconds, at least
    1) says when to try again."""

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = max(1.0, float(retry_after))


class Overloaded(Unavailable):
    """The queue in front of the forward pass is full (load shedding)."""


class LogUnavailable(Unavailable):
    """The decision log cannot take the record: the decision would be unrecorded."""
