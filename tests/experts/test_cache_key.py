"""CacheKey: stable, changed by each field and the schema version, never holding an API key."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

# Private: the cache key, unit-tested.
import experts._cache as cache_module
from experts import ExpertClient, ExpertSpec, Item, RateLimit, RetryPolicy, Timeout

# Private: the cache key and its schema version, which no caller builds.
from experts._cache import SCHEMA_VERSION, CacheKey

STAKES_V1 = Path(__file__).resolve().parents[2] / "experts" / "prompts" / "stakes-v1.toml"


def key_fields(**changes: Any) -> dict[str, Any]:
    fields = {
        "endpoint": "http://127.0.0.1:8000/v1",
        "model": "served/model",
        "method": "next-token",
        "labels": {"high": "high", "low": "low"},
        "template_sha256": "a" * 64,
        "body": {"model": "served/model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    }
    fields.update(changes)
    return fields


def test_cache_key_is_stable() -> None:
    a = CacheKey(**key_fields()).digest()
    b = CacheKey(**key_fields()).digest()
    assert a == b
    assert re.fullmatch(r"[0-9a-f]{64}", a)
    # Dict order does not matter.
    reordered = key_fields(
        body={"max_tokens": 1, "messages": [{"content": "hi", "role": "user"}], "model": "served/model"},
        labels={"low": "low", "high": "high"},
    )
    assert CacheKey(**reordered).digest() == a


@pytest.mark.parametrize(
    "change",
    [
        {"endpoint": "http://127.0.0.1:8001/v1"},
        {"endpoint": "http://127.0.0.1:8000/v1,http://127.0.0.1:8001/v1"},
        {"model": "other/model"},
        {"method": "likelihood"},
        {"labels": {"high": "yes", "low": "no"}},
        {"template_sha256": "b" * 64},
        {
            "body": {
                "model": "served/model",
                "messages": [{"role": "user", "content": "hi!"}],
                "max_tokens": 1,
            }
        },
        {"body": {"model": "served/model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}},
    ],
)
def test_cache_key_changes_with_each_field(change: dict[str, Any]) -> None:
    assert CacheKey(**key_fields(**change)).digest() != CacheKey(**key_fields()).digest()


def test_cache_key_changes_with_schema_version(monkeypatch: pytest.MonkeyPatch) -> None:
    before = CacheKey(**key_fields()).digest()
    monkeypatch.setattr(cache_module, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    assert CacheKey(**key_fields()).digest() != before


def test_cache_key_has_no_field_for_an_api_key() -> None:
    names = {f.name for f in dataclasses.fields(CacheKey)}
    assert names == {"endpoint", "model", "method", "labels", "template_sha256", "body"}


def test_client_cache_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    template_copy = tmp_path / "stakes-copy.toml"
    template_copy.write_bytes(STAKES_V1.read_bytes() + b"\n# a comment changes the hash\n")
    base = ExpertSpec(
        name="k", base_urls=("http://127.0.0.1:9/v1",), model="m", api_key_env="CTD_UNIT_TEST_KEY"
    )
    item = Item("i", "some input")

    def key(spec: ExpertSpec) -> str:
        return ExpertClient(spec, cache=None).request_for(item)[1]

    monkeypatch.setenv("CTD_UNIT_TEST_KEY", "sk-one")
    first = key(base)
    monkeypatch.setenv("CTD_UNIT_TEST_KEY", "sk-two")
    assert key(base) == first
    monkeypatch.delenv("CTD_UNIT_TEST_KEY")
    assert key(base) == first
    # Settings that do not change the answer do not change the key.
    same = dataclasses.replace(
        base,
        name="other-name",
        api_key_env="ANOTHER_VAR",
        rate=RateLimit(concurrency=1, rpm=5),
        timeout=Timeout(read=1.0),
        retry=RetryPolicy(max_attempts=1),
    )
    assert key(same) == first
    # What can change the answer does.
    for changed in (
        dataclasses.replace(base, model="m2"),
        dataclasses.replace(base, method="likelihood"),
        dataclasses.replace(base, base_urls=("http://127.0.0.1:10/v1",)),
        dataclasses.replace(base, top_logprobs=5),
        dataclasses.replace(base, base_urls=("http://127.0.0.1:9/v1", "http://127.0.0.1:8/v1")),
        dataclasses.replace(base, template=str(template_copy)),
    ):
        assert key(changed) != first
    assert ExpertClient(base, cache=None).request_for(Item("i", "other input"))[1] != first
    # The item id is not part of the key: the same input under another id is the same request.
    assert ExpertClient(base, cache=None).request_for(Item("j", "some input"))[1] == first
    monkeypatch.setenv("CTD_UNIT_TEST_URL", "http://127.0.0.1:11/v1")
    assert key(dataclasses.replace(base, base_url_env="CTD_UNIT_TEST_URL")) != first
