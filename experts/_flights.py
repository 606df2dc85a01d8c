"""In-run de-duplication: the cache keys one `score` call is asking about, each with the items
that wait for its answer instead of sending the same request again.

The first item with a key (its leader) is claimed and queried as usual; a later item with the
same key, met while the leader is still in flight (queued, asking, waiting on another run, or
committing), follows it and sends nothing. When the leader's outcome is in, each follower gets
it under its own id. A key leaves the table as soon as its outcome is stored, so the table holds
the keys in flight only and memory stays flat in the item count: an item with that key met
later (beyond the lookahead of one lookup chunk) is looked up in the cache like any other, a
hit when the leader was answered (counted as `cached`), asked again when it failed (failures
are never cached, and remembering every failed key would grow with the run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ._items import Item, ItemResult, RunStats

__all__ = ["Flights"]


class Flights:
    """Followers by key, for the keys in flight in one call; fills in `results` as leaders land."""

    def __init__(self, items: Sequence[Item], results: list[ItemResult | None], stats: RunStats) -> None:
        self._items = items
        self._results = results
        self._stats = stats
        self._followers: dict[str, list[int]] = {}  # key in flight -> indices of its followers

    def lead(self, key: str, index: int) -> bool:
        """True when no item of this call is asking for `key`: the item at `index` will. False
        when one is: the item follows it."""
        followers = self._followers.get(key)
        if followers is None:
            self._followers[key] = []
            return True
        followers.append(index)
        return False

    def land(self, key: str, result: ItemResult) -> None:
        """The leader's outcome is in (and stored): each follower gets it, counted as what it
        is to the follower (a score it did not pay for, a cache hit, or a failure)."""
        stats = self._stats
        for index in self._followers.pop(key, ()):
            self._results[index] = replace(result, id=self._items[index].id)
            if result.source == "expert":
                stats.shared += 1
            elif result.source == "cache":
                stats.cached += 1
            else:
                stats.count_failure(result.reason or "error")
