"""The one redactor of secrets in text built from what a server said (an error body, an
exception's text, a URL), applied where that text enters the expert stage and again wherever
the harness prints or writes an error: an API key echoed by a server ("Incorrect API key
provided: Bearer sk-...") must reach no terminal, log, table or cache row.

Two kinds of secret are removed. Known values: the key in the variable an expert's
`api_key_env` names, read from the environment at the moment of redaction (the key is never
stored), and the values of variables whose names say they hold a secret (`*_API_KEY`,
`*_TOKEN`, ...), which covers the harness's last-line defence where no expert is in scope.
Shapes: bearer tokens, Authorization and api-key header or field values, key and token query
parameters, provider key prefixes (sk-, hf_, ghp_), JWTs, and URL credentials (through
`redact_url`). Ordinary words and hex digests (the cache's 64-hex keys) are left alone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from urllib.parse import quote

from ._config import redact_url

__all__ = ["MASK", "MIN_SECRET", "redact", "redact_known", "secret_values"]

MASK = "***"  # what redact_url puts in place of URL credentials too

# A configured key shorter than this is not removed: it is no secret (guessed in under 15
# million tries) and replacing it everywhere would garble every message (a key "x").
MIN_SECRET = 4
# A variable named like a secret must hold at least this much to be treated as one, so that
# a flag such as HF_TOKEN=1 does not blank every "1" out of the messages.
_MIN_NAMED = 8
# Names that say a variable holds a secret, as suffixes of "_" + the name in upper case.
_SECRET_SUFFIXES = (
    "_KEY",
    "_APIKEY",
    "_TOKEN",
    "_SECRET",
    "_PASSWORD",
    "_PASSWD",
    "_CREDENTIAL",
    "_CREDENTIALS",
)

_TOKEN_CHARS = r"[A-Za-z0-9._~+/=\-]"
# The word after "Bearer" is taken for a token unless it reads as English: up to 20 letters,
# lower case after the first ("Bearer token required" stays; "Bearer q1w2e3" goes, and so does
# a token of letters alone if it mixes cases or runs longer).
_PLAIN_WORD = re.compile(r"[A-Za-z][a-z]{0,19}")
_BEARER = re.compile(rf"\b(bearer\s+)({_TOKEN_CHARS}+)", re.I)
# Header lines and JSON or form fields: the value up to a quote, a separator or the line's end.
# "authorization" keeps its scheme word ("Authorization: Bearer ***") so the line still reads.
_FIELD = re.compile(
    r"""(\b(?:proxy-)?authorization["']?\s*[:=]\s*["']?(?:(?:bearer|basic|token)\s+)?"""
    r"""|\b(?:x-)?api[_\s-]?key["']?\s*[:=]\s*["']?"""
    r"""|\b(?:access|auth|refresh|id)[_-]?token["']?\s*[:=]\s*["']?"""
    r"""|\b(?:client[_-]?)?secret(?:[_-]?key)?["']?\s*[:=]\s*["']?"""
    r"""|\bpass(?:word|wd)["']?\s*[:=]\s*["']?)"""
    r"""[^\s"',;&}]+""",
    re.I,
)
# Query parameters: `key` and `token` only where they are parameters, not prose ("cache key=").
_QUERY = re.compile(r"([?&](?:key|token|sig|signature)=)[^&#\s\"']+", re.I)
# Provider key shapes, found without any context: OpenAI/Anthropic (sk-, sk-proj-, sk-ant-),
# Groq (gsk_), xAI (xai-), Google (AIza + 35), Hugging Face (hf_), GitHub (ghp_ and kin), JSON
# web tokens (eyJ header.payload.signature).
_SHAPED = re.compile(
    r"\b(?:g?sk|xai)[-_][A-Za-z0-9_\-]{16,}"
    r"|\bAIza[A-Za-z0-9_\-]{35}"
    r"|\bhf_[A-Za-z0-9]{20,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}"
    r"|\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*"
)
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>]+")


def looks_like_key(text: str) -> bool:
    """Whether `text` holds a provider key's shape (`sk-...`, `gsk_...`, `AIza...`, `hf_...`,
    `ghp_...`, a JSON web token)."""
    return _SHAPED.search(text) is not None


def _bearer(match: re.Match[str]) -> str:
    token = match.group(2)
    return match.group(0) if _PLAIN_WORD.fullmatch(token) else match.group(1) + MASK


def redact_known(text: str, secrets: Iterable[str]) -> str:
    """`text` without the given secret values (each also as it reads URL-encoded) and without
    anything shaped like a key, a bearer token or URL credentials. Pure: no environment."""
    for secret in sorted(set(secrets), key=len, reverse=True):  # longest first: one may hold another
        for form in {secret, quote(secret, safe="")}:
            text = text.replace(form, MASK)
    text = _SHAPED.sub(MASK, text)
    text = _FIELD.sub(lambda m: m.group(1) + MASK, text)
    text = _BEARER.sub(_bearer, text)
    text = _QUERY.sub(lambda m: m.group(1) + MASK, text)
    return _URL.sub(lambda m: redact_url(m.group(0)), text)


def secret_values(api_key_env: str | None = None) -> list[str]:
    """The secrets in the environment now: the value of `api_key_env` (4+ characters), and of
    every variable named like a secret (8+ characters)."""
    found: list[str] = []
    if api_key_env and len(configured := os.environ.get(api_key_env, "")) >= MIN_SECRET:
        found.append(configured)
    for name, value in os.environ.items():
        if len(value) >= _MIN_NAMED and ("_" + name.upper()).endswith(_SECRET_SUFFIXES):
            found.append(value)
    return found


def redact(text: str, api_key_env: str | None = None) -> str:
    """`text` safe to print and store: without the key `api_key_env` names, nor any other secret
    the environment holds or the text's shapes reveal."""
    return redact_known(text, secret_values(api_key_env))
