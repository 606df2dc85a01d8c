"""The redactor: key shapes and configured values go, ordinary text and hex digests stay; and the
endpoint and the pre-flight check pass what a server says through it where it enters."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import httpx
import pytest

from experts import check_endpoint, expert_from_url, redact

# Private: the endpoint and the errors whose messages must not hold a key.
from experts._endpoint import Endpoint
from experts._errors import HTTPStatusError, TransportError
from experts._redact import redact_known

KEY_ENV = "CTD_TEST_REDACT_KEY_VAR"  # named so the secret-name rule does not apply: only api_key_env
DIGEST = hashlib.sha256(b"a cache key").hexdigest()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Incorrect API key provided: Bearer sk-abcdefghij0123456789",
            "Incorrect API key provided: Bearer ***",
        ),
        ("Incorrect API key provided: Bearer q1w2e3", "Incorrect API key provided: Bearer ***"),
        ('{"message": "bad key sk-proj-AbCdEf0123456789xyz"}', '{"message": "bad key ***"}'),
        ("Authorization: Bearer s3cr3t", "Authorization: Bearer ***"),
        ('{"authorization": "Basic dXNlcjpwYXNz"}', '{"authorization": "Basic ***"}'),
        ("x-api-key: abcd1234efgh", "x-api-key: ***"),
        ('{"api_key": "abcd1234efgh"}', '{"api_key": "***"}'),
        ("GET /v1/models?api_key=secret123&x=1", "GET /v1/models?api_key=***&x=1"),
        ("https://h.test/v1?key=AIzaSyD-xyz&alt=json", "https://h.test/v1?key=***&alt=json"),
        ("http://user:pass@h.test:8000/v1: refused", "http://***@h.test:8000/v1: refused"),
        ("token hf_AbCdEfGhIjKlMnOpQrStUvWx here", "token *** here"),
        ("Invalid API Key gsk_8fJ2kLm9Qw3Rt5Yu7Io1Pa4Sd6Fg8Hj0", "Invalid API Key ***"),
        ("API key not valid: AIzaSyD3fK9mLq2Rt7Vw1Xy5Zb8Nc4Pd6Ge0Hj1.", "API key not valid: ***."),
        ("bad key xai-AbCdEf0123456789xyzAbC", "bad key ***"),
        ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig_1", "jwt ***"),
    ],
)
def test_key_shapes_are_redacted(text: str, expected: str) -> None:
    assert redact_known(text, []) == expected


@pytest.mark.parametrize(
    "text",
    [
        f"cache key {DIGEST}: no stored answer",
        f"key={DIGEST} template={DIGEST[:12]}",
        "the answer used 12 tokens; max_tokens=96, prompt tokens: 80",
        "Bearer token required",
        "Bearer Authentication failed",
        "refused the request (HTTP 401): the API key is missing or wrong; set MY_JUDGE_KEY",
        "api_key_env = '***': must name an environment variable, not hold a key",
        '{"token": " high", "logprob": -0.1}',
        "a risk-assessment-framework for the task-force",
        "http://127.0.0.1:8000/v1/chat/completions: connection refused",
    ],
)
def test_ordinary_text_and_hex_digests_are_left_alone(text: str) -> None:
    assert redact_known(text, []) == text


def test_the_configured_key_is_read_from_the_environment_when_redacting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = "echo: q7Zx and q7Zxq7Zx"  # a short key of no known shape: only its value finds it
    assert redact(text, KEY_ENV) == text  # not set yet
    monkeypatch.setenv(KEY_ENV, "q7Zx")
    assert redact(text, KEY_ENV) == "echo: *** and ******"
    monkeypatch.setenv(KEY_ENV, "abc")  # under 4 characters: no secret, and removing it garbles
    assert redact("abc def", KEY_ENV) == "abc def"


def test_a_configured_key_is_also_removed_url_encoded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "ab/cd+ef=gh")
    assert redact("GET /x?auth=ab%2Fcd%2Bef%3Dgh and ab/cd+ef=gh", KEY_ENV) == "GET /x?auth=*** and ***"


def test_variables_named_like_secrets_are_removed_without_being_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "plainletters")
    monkeypatch.setenv("OTHER_API_KEY", "1")  # too short to be a secret: "1" stays in the text
    assert redact("got plainletters back, 1 time") == "got *** back, 1 time"


# --------------------------------------------------------------------------- where text enters


def request(handler: Any, *, path: str = "/chat/completions") -> Any:
    async def go() -> Any:
        transport = httpx.MockTransport(handler)
        async with Endpoint(["http://a.test/v1"], api_key_env=KEY_ENV, transport=transport) as endpoint:
            return await endpoint.request("POST", path, {"x": 1})

    return asyncio.run(go())


def echo_key(request: httpx.Request) -> str:
    return request.headers["authorization"].removeprefix("Bearer ")


@pytest.mark.parametrize("status", [401, 500])
def test_an_error_body_echoing_the_key_is_redacted_even_across_the_200_byte_cut(
    monkeypatch: pytest.MonkeyPatch, status: int
) -> None:
    key = "Zq" * 20  # no known shape: the configured value must find it
    monkeypatch.setenv(KEY_ENV, key)
    # The key starts at byte 190: cut first, then redacted, its first 10 characters would stay.
    body = "x" * 190 + key + " was refused"

    with pytest.raises(HTTPStatusError) as info:
        request(lambda r: httpx.Response(status, text=body.replace(key, echo_key(r))))
    assert key[:6] not in str(info.value), str(info.value)
    assert "x" * 190 + "***" in str(info.value)


def test_a_body_of_echoed_keys_longer_than_the_redacted_window_shows_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only an error body's first 8 KiB are redacted; forty 200-character keys fill them and
    shrink to 120 characters, which would bring the start of the key cut at 8 KiB into view."""
    key = "Zq" * 100
    monkeypatch.setenv(KEY_ENV, key)
    with pytest.raises(HTTPStatusError) as info:
        request(lambda r: httpx.Response(500, text=echo_key(r) * 60))
    assert "Zq" not in str(info.value), str(info.value)


def test_a_transport_error_naming_the_key_is_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "Zq" * 20)

    def handler(r: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"proxy said: Authorization {echo_key(r)}", request=r)

    with pytest.raises(TransportError) as info:
        request(handler)
    assert "Zq" not in str(info.value) and "proxy said" in str(info.value)


def test_an_answer_echoing_the_key_is_returned_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "Zq" * 20)
    payload, _ = request(lambda r: httpx.Response(200, json={"debug": {"key": echo_key(r)}, "n": 1}))
    assert payload == {"debug": {"key": "***"}, "n": 1}


def test_the_check_redacts_model_names_and_its_problem_line(monkeypatch: pytest.MonkeyPatch) -> None:
    key = "Zq" * 20
    monkeypatch.setenv(KEY_ENV, key)
    spec = expert_from_url("http://a.test/v1", "wanted", api_key_env=KEY_ENV)

    def handler(r: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [{"id": f"model-for-{echo_key(r)}"}]})

    report = asyncio.run(check_endpoint(spec, transport=httpx.MockTransport(handler)))
    assert report.served_models == ["model-for-***"]
    assert report.problem is not None and "model-for-***" in report.problem and key not in report.problem
