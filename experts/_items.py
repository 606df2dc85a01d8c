"""What one `ExpertClient.score` call takes and gives: items in, one result per item, and the
run's counters (read by a progress sink while it runs)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, Protocol

from ._failure import FailureKind
from ._prompts import Conversation

__all__ = ["Item", "ItemResult", "ProgressSink", "RunStats"]


@dataclass(frozen=True)
class Item:
    """One input to score: an id and the conversation."""

    id: str
    conversation: Conversation


@dataclass(frozen=True)
class ItemResult:
    """The outcome for one item, in input order. `score` is None when `source` is "failed",
    and `reason` then says why (the last error's tag, e.g. "http-429", "timeout", "no-label-mass",
    as stored in the cache's failures table) and `failure` what kind of failure that is.

    Items of one call with the same input (the same cache key) share one request: each gets
    the result of the item that asked (its own id aside), its source and attempts included;
    `RunStats.shared` counts the answers so shared."""

    id: str
    score: float | None
    label_mass: float | None
    source: Literal["cache", "expert", "failed"]
    reason: str | None = None
    attempts: int = 0
    failure: FailureKind | None = None  # the typed kind of `reason`, for decisions (not display)
    how: str | None = None  # how the score was obtained (`experts._recovery`); None when failed


@dataclass
class RunStats:
    """Counters of one run, for progress and the final report. Each item ends in exactly one
    of `cached`, `scored`, `shared` and `failed`."""

    total: int = 0
    cached: int = 0
    scored: int = 0  # answered by a request of their own
    shared: int = 0  # answered by the request of an earlier item with the same input (no request)
    failed: int = 0
    retries: int = 0
    rate_limited: int = 0  # answers with status 429
    in_flight: int = 0
    waiting: int = 0  # items another run on the same cache is asking about right now
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0  # dollars spent by the client's requests so far (with a Spend)
    started: float = field(default_factory=time.monotonic)
    failure_reasons: Counter[str] = field(default_factory=Counter)
    errors_seen: Counter[str] = field(default_factory=Counter)

    @property
    def done(self) -> int:
        return self.cached + self.scored + self.shared + self.failed

    def count_failure(self, reason: str) -> None:
        """One more item ended failed, for `reason` (its tag)."""
        self.failed += 1
        self.failure_reasons[reason] += 1


class ProgressSink(Protocol):
    def update(self, stats: RunStats) -> None: ...
