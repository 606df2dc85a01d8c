"""The recovery ladder (experts._recovery): an answer outside the label set gets a score from
the first rung the test server answers inside, recorded as its `how` in the result, the cache
row and a rerun's cache hit; a server that never answers inside still fails with the reason;
plain requests keep the keys they had before the ladder; an old cache opens and reads "top-k"."""

from __future__ import annotations

import asyncio
import io
import json
import re
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fault_server import FaultPlan, RunningServer, item_score
from test_experts_engine import db_rows, make_spec

import experts
from experts import ExpertClient, ExpertSpec, Item, ScoreCache, import_answers, merge_caches, salvage_cache

# Private: the ladder's rung names and sentence, which the tests check the bodies against.
from experts._recovery import NAMED_LABELS_SENTENCE, WIDEST_TOP_LOGPROBS, ladder

# Keys computed by the main branch before the ladder existed (ebf8a30, /tmp/golden_key.py in the
# report): a plain request's key must not change, or every stored answer would be paid again.
GOLDEN_INPUT = "item-1 golden input"
GOLDEN_KEYS = {
    "next-token": "0e4e38888a17390c9064c3d1247372c73e1dd7ab50bfb3c365c2d35795bc3615",
    "likelihood": "7cf160c8bed0ea453e9c7805572a047b8868602c5b98e7fb43cee7f0c3a9f43c",
}


def _score(spec: ExpertSpec, items: list[Item], cache: ScoreCache | None) -> tuple[list[Any], Any]:
    return asyncio.run(ExpertClient(spec, cache=cache).score(items))


def _items(*numbers: int) -> list[Item]:
    return [Item(f"row-{n}", f"A request about item-{n}.") for n in numbers]


@pytest.mark.parametrize("method", ["next-token", "likelihood"])
def test_plain_cache_keys_are_those_of_main(method: str) -> None:
    spec = ExpertSpec(name="golden", base_urls=("http://127.0.0.1:9/v1",), model="m", method=method)  # type: ignore[arg-type]
    if method == "next-token":
        spec = replace(spec, top_logprobs=5)
    assert ExpertClient(spec, cache=None).request_for(Item("i", GOLDEN_INPUT))[1] == GOLDEN_KEYS[method]


def test_wider_top_k_recovers_and_is_recorded(tmp_path: Path) -> None:
    cache = ScoreCache(tmp_path / "cache.db")
    plan = FaultPlan(recover_on={1: "wider-top-k"})
    with RunningServer(plan) as server:
        spec = make_spec(server.url, top_logprobs=5)
        results, stats = _score(spec, _items(1, 2), cache)
        bodies = server.server.counts.bodies
        again, _ = _score(spec, _items(1, 2), cache)
        requests = dict(server.server.counts.requests)
    recovered, plain = results
    assert (recovered.source, recovered.how, plain.how) == ("expert", "wider-top-k", "top-k")
    assert recovered.score == pytest.approx(item_score(1), abs=1e-12)  # the same score a plain answer gives
    assert recovered.label_mass == pytest.approx(0.9)
    # The rung's body is the plain body with the widest top logprobs, nothing else changed.
    assert bodies[1][1] == {**bodies[1][0], "top_logprobs": WIDEST_TOP_LOGPROBS}
    assert (stats.scored, stats.failed) == (2, 0)
    # Both requests' tokens are counted (total_usage over the plain answer and the rung's).
    assert stats.prompt_tokens == 2 * (len(" ".join(m["content"] for m in bodies[1][0]["messages"])) // 4) + (
        len(" ".join(m["content"] for m in bodies[2][0]["messages"])) // 4
    )
    assert sorted(db_rows(tmp_path / "cache.db", "SELECT item_id, how FROM scores")) == [
        ("row-1", "wider-top-k"),
        ("row-2", "top-k"),
    ]
    # A rerun reads both from the cache, each with its how, and sends nothing.
    assert [(r.source, r.how) for r in again] == [("cache", "wider-top-k"), ("cache", "top-k")]
    assert requests == {1: 2, 2: 1}


def test_choice_on_vllm_keeps_the_score_and_drops_the_mass(tmp_path: Path) -> None:
    plan = FaultPlan(recover_on={3: "choice-spellings"})
    with RunningServer(plan) as server:
        spec = make_spec(server.url, server="vllm")  # top_logprobs 20: no wider-top-k rung
        (result,), _ = _score(spec, _items(3), ScoreCache(tmp_path / "cache.db"))
        bodies = server.server.counts.bodies[3]
    assert (result.how, result.label_mass) == ("choice-spellings", None)
    assert result.score == pytest.approx(item_score(3), abs=1e-12)
    spellings = ["high", "High", "HIGH", " high", " High", " HIGH"]
    spellings += ["low", "Low", "LOW", " low", " Low", " LOW"]
    assert bodies[1] == {**bodies[0], "structured_outputs": {"choice": spellings}}


def test_named_labels_recovers_an_answer_without_logprobs(tmp_path: Path) -> None:
    plan = FaultPlan(recover_on={4: "named-labels"}, outside="no-logprobs")
    with RunningServer(plan) as server:
        spec = make_spec(server.url, top_logprobs=5)
        (result,), stats = _score(spec, _items(4), ScoreCache(tmp_path / "cache.db"))
        bodies = server.server.counts.bodies[4]
    assert (result.source, result.how) == ("expert", "named-labels")
    assert stats.errors_seen["no-logprobs"] == 0  # recovered within the attempt: no error, no retry
    assert [body["top_logprobs"] for body in bodies] == [5, 20, 20]  # plain, wider-top-k, named-labels
    sentence = NAMED_LABELS_SENTENCE.format(high="high", low="low")
    assert bodies[2]["messages"][:-1] == bodies[0]["messages"][:-1]
    assert bodies[2]["messages"][-1]["content"] == bodies[0]["messages"][-1]["content"] + "\n\n" + sentence


def test_a_guard_template_s_conversation_is_never_changed_by_a_rung() -> None:
    """A pass-through template's last user message is the conversation being judged: the ladder
    widens the top logprobs and constrains the choice, but adds no sentence to it."""
    template = experts.load_template("llama-guard-3")
    base = experts.build_request("next-token", template, "How do I pick a lock?", "guard", top_logprobs=5)
    rungs = ladder(base, template, "vllm")
    assert [rung.how for rung in rungs] == ["wider-top-k", "choice-spellings"]
    assert all(rung.request.body["messages"] == base.body["messages"] for rung in rungs)
    wrapped = experts.load_template("fine-v1")
    plain = experts.build_request("next-token", wrapped, "How do I pick a lock?", "m", top_logprobs=5)
    assert [rung.how for rung in ladder(plain, wrapped, "vllm")][-1] == "named-labels"


def test_a_server_that_never_answers_inside_still_fails(tmp_path: Path) -> None:
    plan = FaultPlan(recover_on={5: "never"})
    with RunningServer(plan) as server:
        spec = make_spec(server.url, top_logprobs=5, server="vllm")
        (result,), stats = _score(spec, _items(5), ScoreCache(tmp_path / "cache.db"))
        requests = server.server.counts.requests[5]
    assert (result.source, result.reason, result.how) == ("failed", "no-label-mass", None)
    assert requests == 4  # plain, wider-top-k, choice, named-labels; deterministic: not retried
    (message,) = db_rows(tmp_path / "cache.db", "SELECT message FROM failures")[0]
    assert "wider-top-k: no-label-mass" in message and "named-labels: no-label-mass" in message
    assert stats.failure_reasons == {"no-label-mass": 1}


def test_a_rung_larger_than_tpm_is_passed_over_not_a_failure_after_paying(tmp_path: Path) -> None:
    """tpm admits the item's own request (checked before the run) but not the named-labels rung,
    which adds a sentence: that rung is passed over and said, as a rung the server refuses is.
    It stopped the attempt with a tpm error after the plain request was paid, and every rerun
    paid again."""
    plan = FaultPlan(recover_on={4: "named-labels"}, outside="no-logprobs")
    (item,) = _items(4)
    with RunningServer(plan) as server:
        spec = make_spec(server.url, top_logprobs=5)
        base = ExpertClient(spec, cache=None).keyed([item]).tokens[0]
        # A few tokens over the item's own: wider-top-k (a larger number in the body) fits, the
        # named-labels sentence (about a dozen tokens) does not.
        spec = replace(spec, rate=replace(spec.rate, tpm=base + 4))
        (result,), _ = _score(spec, [item], ScoreCache(tmp_path / "cache.db"))
        requests = server.server.counts.requests[4]
    assert (result.source, result.reason) == ("failed", "no-logprobs")
    assert requests == 2  # plain and wider-top-k; deterministic, so not retried
    (message,) = db_rows(tmp_path / "cache.db", "SELECT message FROM failures")[0]
    assert re.search(rf"named-labels: about \d+ tokens, more than tpm = {base + 4}\b", message), message


def _old_cache(path: Path, *, failures: bool = False) -> None:
    """A cache in main's schema before `how` (ebf8a30): one next-token and one likelihood answer."""
    with sqlite3.connect(path) as connection:
        connection.execute(OLD_SCORES_TABLE)
        if failures:
            connection.execute(OLD_FAILURES_TABLE)
        for key, method in (("k1", "next-token"), ("k2", "likelihood")):
            connection.execute(
                "INSERT INTO scores VALUES (?, 'e', ?, 'u', 'm', ?, 'sha', 1, 0.25, NULL, '{}', 1, 1, 1.0, "
                "'2026-11-25 10:00:00.000000')",
                (key, key, method),
            )


def test_an_old_cache_opens_and_its_rows_read_as_plain(tmp_path: Path) -> None:
    """A cache written before the `how` column (main's schema, ebf8a30) gains it in place."""
    path = tmp_path / "old.db"
    _old_cache(path, failures=False)
    cache = ScoreCache(path)
    hits = cache.get_many(["k1", "k2"])
    assert (hits["k1"].how, hits["k2"].how, hits["k1"].score) == ("top-k", "likelihood", 0.25)
    assert sorted(row.how for row in cache.rows()) == ["likelihood", "top-k"]
    cache.close()
    assert ScoreCache(path).get_many(["k1"])["k1"].how == "top-k"  # opened again: migrated once


def test_an_old_cache_merged_salvaged_or_exported_keeps_its_rows_how(tmp_path: Path) -> None:
    """The other ways answers enter a cache read an old cache's rows as its migration would."""
    old = tmp_path / "old.db"
    _old_cache(old, failures=True)
    expected = {"k1": "top-k", "k2": "likelihood"}
    merged = ScoreCache(tmp_path / "merged.db")
    merge_caches(merged, [old])
    assert {k: hit.how for k, hit in merged.get_many(["k1", "k2"]).items()} == expected
    salvage_cache(old, tmp_path / "salvaged.db")
    assert {
        k: hit.how for k, hit in ScoreCache(tmp_path / "salvaged.db").get_many(["k1", "k2"]).items()
    } == expected
    lines = tmp_path / "old.jsonl"  # an export written before `how`: every field but it
    with sqlite3.connect(old) as connection:
        connection.row_factory = sqlite3.Row
        rows = [dict(row) for row in connection.execute("SELECT * FROM scores")]
    lines.write_text("".join(json.dumps(row) + "\n" for row in rows))
    import_answers(tmp_path / "imported.db", [lines])
    assert {
        k: hit.how for k, hit in ScoreCache(tmp_path / "imported.db").get_many(["k1", "k2"]).items()
    } == expected


OLD_FAILURES_TABLE = """CREATE TABLE failures (id INTEGER NOT NULL, "key" VARCHAR NOT NULL,
    expert VARCHAR NOT NULL, item_id VARCHAR NOT NULL, reason VARCHAR NOT NULL, message VARCHAR NOT NULL,
    attempts INTEGER NOT NULL, created DATETIME NOT NULL, PRIMARY KEY (id))"""

OLD_SCORES_TABLE = """CREATE TABLE scores (
    "key" VARCHAR NOT NULL, expert VARCHAR NOT NULL, item_id VARCHAR NOT NULL,
    endpoint VARCHAR NOT NULL, model VARCHAR NOT NULL, method VARCHAR NOT NULL,
    template_sha256 VARCHAR NOT NULL, schema_version INTEGER NOT NULL, score FLOAT NOT NULL,
    label_mass FLOAT, response VARCHAR NOT NULL, prompt_tokens INTEGER, completion_tokens INTEGER,
    latency_ms FLOAT NOT NULL, created DATETIME NOT NULL, PRIMARY KEY ("key"))"""


def test_an_old_cache_this_process_cannot_migrate_reads_as_migrated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache from before `how` on a file this process may not write (a read-only mount; this
    test runs as a user whom no file refuses, so the migration's answer for such a file, the
    SQL of the old rows' `how`, is given here): every reader, the whole-row ones and the JSONL
    export included, reads each row's `how` as a migration would store it."""
    path = tmp_path / "old.db"
    _old_cache(path, failures=False)
    monkeypatch.setattr(ScoreCache, "_add_how", lambda self: experts._cache.HOW_OF_OLD_ROWS)
    cache = ScoreCache(path)
    expected = {"k1": "top-k", "k2": "likelihood"}
    assert {k: hit.how for k, hit in cache.get_many(["k1", "k2"]).items()} == expected
    assert {row.key: row.how for row in cache.rows()} == expected
    assert [row.how for row in cache.lookup_item("k2")[0]] == ["likelihood"]
    out = io.StringIO()
    assert experts.write_answers(cache, out) == 2
    assert {line["key"]: line["how"] for line in map(json.loads, out.getvalue().splitlines())} == expected
    columns = {row[1] for row in sqlite3.connect(path).execute("PRAGMA table_info(scores)")}
    assert "how" not in columns  # nothing was written to it
