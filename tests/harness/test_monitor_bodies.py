"""Arbitrary request bodies against the real app: the monitor's own Starlette app over a real
`Monitor` (the embedded model and two untrained probes, tests/monitor_bundle.py), driven in
process through httpx's ASGI transport. Nothing is mocked: a body the parser accepts goes on to
the model's chat template and a real forward pass. The rule checked: every answer is a decision
(200) or a one-line 4xx; never a 500, whatever the bytes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from monitor_bundle import write_untrained_bundle

from harness.monitor import Monitor, create_app

# Private: the request roles and the error types the monitor raises.
from harness.monitor._errors import LogUnavailable

# Private: the request roles and the error type the body parser raises.
from harness.monitor._server import ROLES

# Any code point, lone surrogates included (json.dumps writes them as \udXXX escapes); the
# surrogates are also drawn on their own, or a few in 2,048 code points would rarely come up.
SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()) | SURROGATES, max_size=12)
SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | ANY_TEXT
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=12,
)
FIELDS = st.sampled_from(["role", "content", "name", "input", "messages", "request_id", "label"])
# Bodies shaped like the real ones, so that the field checks (not only the top level) are reached.
NEAR_MISSES = st.one_of(
    st.fixed_dictionaries({"input": ANY_TEXT}),  # most are good bodies: the model reads them
    st.fixed_dictionaries(
        {
            "messages": st.lists(
                st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": ANY_TEXT}), max_size=3
            )
        }
    ),
    st.fixed_dictionaries(
        {
            "messages": st.lists(
                st.dictionaries(FIELDS, JSON_VALUES | st.sampled_from(["user", "system"])), max_size=3
            )
        }
    ),
    st.fixed_dictionaries({"input": JSON_VALUES}),
    st.dictionaries(FIELDS, JSON_VALUES, max_size=3),
    st.fixed_dictionaries({"request_id": JSON_VALUES, "label": JSON_VALUES}),
)
# Bodies json.dumps cannot write: integer literals past Python's 4,300-digit limit, nesting past
# the parser's recursion limit, each inside or outside a body of the right shape.
HUGE_INTEGERS = st.integers(4_301, 20_000).map(lambda digits: b"9" * digits)
DEEP_NESTING = st.integers(1_000, 100_000).map(lambda depth: b"[" * depth + b"]" * depth)
RAW_HAZARDS = st.one_of(
    HUGE_INTEGERS,
    DEEP_NESTING,
    (HUGE_INTEGERS | DEEP_NESTING).map(lambda value: b'{"input": ' + value + b"}"),
    (HUGE_INTEGERS | DEEP_NESTING).map(lambda value: b'{"request_id": "a", "label": ' + value + b"}"),
)
PATHS = st.sampled_from(["/v1/check", "/v1/feedback"])
CONTENT_TYPES = st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", None])


@dataclass(frozen=True)
class InProcess:
    """The real app over a real monitor, and the one event loop both run in."""

    runner: asyncio.Runner
    client: httpx.AsyncClient
    monitor: Monitor


@pytest.fixture(scope="module")
def app_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcess]:
    folder = tmp_path_factory.mktemp("bodies")
    bundle = write_untrained_bundle(folder / "bundle")
    with asyncio.Runner() as runner:  # one loop for the monitor and every request
        monitor = runner.run(Monitor.load(bundle, expert=False, log_path=folder / "decisions.jsonl"))
        # raise_app_exceptions=False: an error inside the app shows as the status it sends.
        transport = httpx.ASGITransport(app=create_app(monitor), raise_app_exceptions=False)
        client = httpx.AsyncClient(transport=transport, base_url="http://monitor", timeout=60)
        try:
            yield InProcess(runner, client, monitor)
        finally:
            runner.run(client.aclose())
            runner.run(monitor.aclose())


def _assert_answered_or_refused(answer: httpx.Response, path: str) -> None:
    assert answer.status_code == 200 or 400 <= answer.status_code < 500, (answer.status_code, answer.text)
    body = answer.json()
    if answer.status_code == 200:
        assert ("request_id" in body) if path == "/v1/check" else body == {"matched": True}
    else:
        assert (
            isinstance(body["error"], str) and "\n" not in body["error"] and "Traceback" not in body["error"]
        )


def _post(app_client: InProcess, path: str, raw: bytes, kind: str | None) -> None:
    runner, client = app_client.runner, app_client.client
    headers = {} if kind is None else {"content-type": kind}
    answer = runner.run(client.post(path, content=raw, headers=headers))
    event(f"{path} answered {answer.status_code}")  # --hypothesis-show-statistics: how many got through
    _assert_answered_or_refused(answer, path)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(value=JSON_VALUES | NEAR_MISSES, path=PATHS, kind=CONTENT_TYPES)
def test_any_json_value_is_a_decision_or_a_4xx(
    app_client: InProcess, value: object, path: str, kind: str | None
) -> None:
    _post(app_client, path, json.dumps(value).encode(), kind)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(raw=st.binary(max_size=64) | RAW_HAZARDS, path=PATHS, kind=CONTENT_TYPES)
def test_any_bytes_are_a_decision_or_a_4xx(
    app_client: InProcess, raw: bytes, path: str, kind: str | None
) -> None:
    _post(app_client, path, raw, kind)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b'{"input": ' + b"1" * 10_000 + b"}", id="10000-digits"),
        pytest.param(b'{"input": "a", "messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", id="deep"),
        pytest.param(b'"\\ud800"', id="bare-surrogate"),
        pytest.param(b'{"input": 1e999}', id="float-overflow"),
        pytest.param(b'{"input": NaN}', id="nan"),
    ],
)
def test_the_cases_the_issue_names_are_4xx(app_client: InProcess, raw: bytes) -> None:
    runner, client = app_client.runner, app_client.client
    answer = runner.run(client.post("/v1/check", content=raw, headers={"content-type": "application/json"}))
    assert 400 <= answer.status_code < 500, answer.text
    _assert_answered_or_refused(answer, "/v1/check")


def test_a_monitor_that_cannot_take_a_request_answers_503_with_retry_after(
    app_client: InProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full disk under the decision log, injected (a real disk does not fill on demand): the
    monitor raises LogUnavailable, an Unavailable, and the server says 503 and when to retry."""
    runner, client = app_client.runner, app_client.client
    monitor = app_client.monitor

    def full_disk(nbytes: int) -> None:
        raise LogUnavailable("the decision log cannot be written: No space left on device", retry_after=2.5)

    monkeypatch.setattr(monitor.decisions, "reserve", full_disk)
    answer = runner.run(
        client.post("/v1/check", json={"input": "a new text"}, headers={"content-type": "application/json"})
    )
    assert answer.status_code == 503 and answer.headers["retry-after"] == "3"
    assert answer.json() == {"error": "the decision log cannot be written: No space left on device"}


def test_an_unknown_path_or_method_is_a_one_line_4xx(app_client: InProcess) -> None:
    runner, client = app_client.runner, app_client.client
    missing = runner.run(client.get("/v1/nowhere"))
    wrong_method = runner.run(client.get("/v1/check"))
    assert missing.status_code == 404 and missing.json() == {"error": "GET /v1/nowhere: Not Found"}
    assert wrong_method.status_code == 405 and wrong_method.json() == {
        "error": "GET /v1/check: Method Not Allowed"
    }
