"""Items keyed once (`ExpertClient.keyed`): a `ctd query` computes each item's cache key one
time for its checks, its estimate, the client and the top tokens, and a client refuses items
keyed for another expert."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fault_server import RunningServer
from test_client_dedup import DISTINCT, N, repeated_items
from test_experts_engine import make_spec

from experts import ExpertClient, RateLimit, ScoreCache

# Private: the cache key, whose digests the test counts.
from experts._cache import CacheKey
from harness.data import read_table
from harness.stages import query_items


def test_a_query_keys_each_item_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first run and a rerun from the cache, with a tpm (the size check) and the top tokens
    read back (as the query stage does): N keys computed each, not one pass per check."""
    digest = CacheKey.digest
    computed = 0

    def counted(key: CacheKey) -> str:
        nonlocal computed
        computed += 1
        return digest(key)

    monkeypatch.setattr(CacheKey, "digest", counted)
    items = repeated_items()
    tables = []
    with RunningServer() as server:
        spec = make_spec(server.url, rate=RateLimit(concurrency=8, tpm=1e9))
        for run in ("first", "rerun"):
            computed = 0
            out = tmp_path / f"{run}.csv"
            cache = tmp_path / "cache.db"
            labels = [None] * N
            summary = query_items(
                items, labels, spec, out, cache_path=cache, check=False, with_top_tokens=True
            )
            assert computed == N, run
            tables.append(read_table(out).columns)
        assert sum(server.server.counts.requests.values()) == DISTINCT  # the rerun asked nothing
    assert summary.cached == N
    assert list(tables[0]["expert"]) == list(tables[1]["expert"])
    assert list(tables[0]["top_tokens"]) == list(tables[1]["top_tokens"])
    assert all(tables[1]["top_tokens"])  # every answer's alternatives, found by its key


def test_keyed_items_score_as_the_items_do_and_only_for_their_expert(tmp_path: Path) -> None:
    items = repeated_items()
    with RunningServer() as server:
        spec = make_spec(server.url, rate=RateLimit(concurrency=8))
        keyed = ExpertClient(spec, cache=None).keyed(items)
        cache = ScoreCache(tmp_path / "cache.db")
        try:
            plain, _ = asyncio.run(ExpertClient(spec, cache=None).score(items))
            from_keys, stats = asyncio.run(ExpertClient(spec, cache=cache).score(keyed))
            assert from_keys == plain and stats.scored == DISTINCT
            again, stats = asyncio.run(ExpertClient(spec, cache=cache).score(keyed))
            assert [r.score for r in again] == [r.score for r in plain] and stats.cached == N
            asked = sum(server.server.counts.requests.values())
            other = make_spec(server.url, model="another-model")
            with pytest.raises(ValueError, match="keyed for another expert"):
                asyncio.run(ExpertClient(other, cache=cache).score(keyed))
            assert sum(server.server.counts.requests.values()) == asked  # nothing was sent
        finally:
            cache.close()
