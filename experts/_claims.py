"""Claims on items in flight, so that two runs on one cache never pay twice for an item.

A run (one open `ExpertClient`: one `score` call, or all calls of an `async with` block) is an
owner: a uuid, with its host and pid. Before it queries a batch of items it claims their keys in
one transaction: keys nobody holds (or whose claim is stale) become its own, keys already scored
are cache hits, and keys a live run holds are left to that run; the client waits for their
scores, or for the claim to go stale and then takes the item over. Keys out in a batch file
(`ctd query --batch-out`, the `batch_out` table) are nobody's to claim: their answers come
with `--batch-in`, and asking them live would pay twice. A claim is released in the
transaction that commits its item's score or failure (`ScoreCache.put_many`), so another run
always sees an item as claimed or as stored.

A claim is stale when its lease has run out (the holder stopped renewing it: it was killed,
suspended, or its host went away) or, at once, when its holder was a process on this host that
no longer exists: a kill -9 never blocks the next run for the length of a lease.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field

from ._cache import CachedScore, ScoreCache, _immediate, storage_errors
from ._errors import StorageError

__all__ = ["ClaimHolder", "ClaimLedger", "Claimed", "Lease", "list_claims"]

_SQL_CHUNK = 500  # keys per `IN (...)`, below SQLite's oldest limit on bound parameters


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A claim lasts `seconds` unless renewed; a run renews its claims every `renew_every`
    seconds, and looks every `poll` seconds at the items another run is asking about."""

    seconds: float = 60.0
    renew_every: float = 20.0
    poll: float = 0.25

    def __post_init__(self) -> None:
        if not 0 < self.renew_every < self.seconds or not self.poll > 0:
            raise ValueError(f"a lease needs 0 < renew_every < seconds and poll > 0, got {self}")


@dataclass
class Claimed:
    """One claim transaction's answer for a set of keys."""

    mine: set[str] = field(default_factory=set)  # this run holds them now: query them
    scored: dict[str, CachedScore] = field(default_factory=dict)  # another run answered meanwhile
    held: set[str] = field(default_factory=set)  # a live run is asking about them: wait
    out: set[str] = field(default_factory=set)  # out in a batch file: not to be asked live


@dataclass(frozen=True)
class ClaimHolder:
    """The claims one run holds on one expert's items, for `ctd cache stats`."""

    expert: str
    owner: str
    host: str
    pid: int
    live: int
    stale: int
    expires: float  # unix seconds, the latest lease among them


@functools.cache
def this_host() -> str:
    """The host's name and, on Linux, its pid namespace: two containers that share a hostname
    (and a cache volume) but not their process ids must not judge each other's pids."""
    name = socket.gethostname()
    try:
        namespace = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return name
    return f"{name} (pid namespace {namespace.removeprefix('pid:[').removesuffix(']')})"


def process_gone(pid: int) -> bool:
    """Whether no process `pid` runs on this host. A zombie (killed, not yet reaped by its
    parent) is gone: it will never renew or release anything."""
    if pid <= 0:  # os.kill(0, ...) would address our own process group
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it exists, under another user
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[-1].split()[0]
    except FileNotFoundError:  # it ended a moment ago
        return True
    except (OSError, IndexError):  # no /proc (not Linux): the signal said it exists
        return False
    return state == b"Z"


class ClaimLedger:
    """One run's claims in the `claims` table of a cache. The methods block (the client calls
    them in a thread), except `heartbeat`."""

    def __init__(
        self, cache: ScoreCache, *, lease: Lease | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.cache = cache
        self.lease = lease or Lease()
        self._clock = clock  # wall-clock seconds: leases are compared across processes
        self.owner = uuid.uuid4().hex
        self.host = this_host()
        self.pid = os.getpid()

    def claim(self, expert: str, wanted: Mapping[str, str]) -> Claimed:
        """Claim the keys of `wanted` ({key: item id}) that no live run holds, nobody has
        answered and no batch file holds, in one transaction. A key this run already holds (the
        same input twice) is claimed again."""
        claimed = Claimed()
        keys = list(wanted)
        if not keys:
            return claimed
        with _immediate(self.cache) as cursor:
            now, gone = self._clock(), {}
            for chunk in _chunks(keys):
                marks = ",".join("?" * len(chunk))
                columns = f"key, score, label_mass, {self.cache.how_column}"
                cursor.execute(f"SELECT {columns} FROM scores WHERE key IN ({marks})", chunk)
                claimed.scored.update((key, CachedScore(s, m, h)) for key, s, m, h in cursor.fetchall())
                cursor.execute(f"SELECT key FROM batch_out WHERE key IN ({marks})", chunk)
                claimed.out.update(key for (key,) in cursor.fetchall())
                cursor.execute(
                    f"SELECT key, owner, host, pid, expires FROM claims WHERE key IN ({marks})", chunk
                )
                for key, owner, host, pid, expires in cursor.fetchall():
                    if owner != self.owner and not is_stale(host, pid, expires, now=now, gone=gone):
                        claimed.held.add(key)
            claimed.out -= claimed.scored.keys()  # answered meanwhile (by a live run, or merged)
            claimed.held -= claimed.scored.keys() | claimed.out
            claimed.mine = set(keys) - claimed.scored.keys() - claimed.out - claimed.held
            until = now + self.lease.seconds
            cursor.executemany(
                "INSERT OR REPLACE INTO claims (key, expert, item_id, owner, host, pid, expires) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(key, expert, wanted[key], self.owner, self.host, self.pid, until) for key in claimed.mine],
            )
        return claimed

    def renew(self) -> None:
        """Extend the lease of every claim this run still holds."""
        with _immediate(self.cache) as cursor:
            cursor.execute(
                "UPDATE claims SET expires = ? WHERE owner = ?",
                (self._clock() + self.lease.seconds, self.owner),
            )

    def release_all(self) -> None:
        """Drop every claim this run still holds (the run is over: its items are free)."""
        with _immediate(self.cache) as cursor:
            cursor.execute("DELETE FROM claims WHERE owner = ?", (self.owner,))

    async def release(self, keys: Sequence[str]) -> None:
        """Drop this run's claims on `keys` (a call of a long-lived client ended without
        answering them), if the database lets us; if not, they go stale like `close`'s."""

        def drop() -> None:
            with _immediate(self.cache) as cursor:
                for chunk in _chunks(list(keys)):
                    marks = ",".join("?" * len(chunk))
                    cursor.execute(
                        f"DELETE FROM claims WHERE owner = ? AND key IN ({marks})", [self.owner, *chunk]
                    )

        with suppress(StorageError):
            await asyncio.to_thread(drop)

    async def close(self) -> None:
        """Release every claim this run still holds, if the database lets us. If it does not
        (the disk failed), they go stale when this process exits, and the next run on this
        host takes them over at once."""
        with suppress(StorageError):  # the disk failed (storage_errors translates every cause)
            await asyncio.to_thread(self.release_all)

    def sweep(self) -> None:
        """Delete stale claims, so that the table (and `ctd cache stats`) shows the runs in
        progress. Taking over a stale claim needs no sweep: this is tidiness."""
        with _immediate(self.cache) as cursor:
            now, gone = self._clock(), {}
            cursor.execute("SELECT key, owner, host, pid, expires FROM claims")
            stale = [
                (key, owner)
                for key, owner, host, pid, expires in cursor.fetchall()
                if is_stale(host, pid, expires, now=now, gone=gone)
            ]
            cursor.executemany("DELETE FROM claims WHERE key = ? AND owner = ?", stale)

    async def heartbeat(self) -> None:
        """Renew the leases every `renew_every` seconds until cancelled. A failed renewal (the
        database busy past its timeout, say) is tried again at the next beat: a lease outlasts
        a few beats."""
        while True:
            await asyncio.sleep(self.lease.renew_every)
            try:
                await asyncio.to_thread(self.renew)
            except StorageError:  # storage_errors translates every cause
                continue


def is_stale(host: str, pid: int, expires: float, *, now: float, gone: dict[int, bool]) -> bool:
    """Whether a claim no longer protects its item: its lease ran out, or its holder was a
    process on this host that is gone (`gone` memoizes `process_gone` over one look)."""
    if expires <= now:
        return True
    if host != this_host():
        return False
    if pid not in gone:
        gone[pid] = process_gone(pid)
    return gone[pid]


def list_claims(cache: ScoreCache, *, now: float | None = None) -> list[ClaimHolder]:
    """The claims in a cache, grouped by expert and run, live and stale counted apart."""
    now = time.time() if now is None else now
    gone: dict[int, bool] = {}
    groups: dict[tuple[str, str, str, int], list[float]] = {}
    with storage_errors(cache.path):
        connection = cache.engine.raw_connection()
        try:
            cursor = connection.cursor()
            cursor.execute("SELECT expert, owner, host, pid, expires FROM claims")
            for expert, owner, host, pid, expires in cursor.fetchall():
                groups.setdefault((expert, owner, host, pid), []).append(expires)
        finally:
            connection.close()
    holders = []
    for (expert, owner, host, pid), leases in sorted(groups.items()):
        stale = sum(is_stale(host, pid, expires, now=now, gone=gone) for expires in leases)
        holders.append(ClaimHolder(expert, owner, host, pid, len(leases) - stale, stale, max(leases)))
    return holders


def _chunks(keys: Sequence[str]) -> Iterator[list[str]]:
    for start in range(0, len(keys), _SQL_CHUNK):
        yield list(keys[start : start + _SQL_CHUNK])
