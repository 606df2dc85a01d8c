"""The expert stage: score inputs with an expensive expert LLM behind an OpenAI-compatible API.

Small composable pieces: value objects for settings (`Timeout`, `RateLimit`, `RetryPolicy`),
an `Endpoint` (replicas, error translation), a `Limiter` (concurrency, RPM, TPM), a
`ScoreCache` with its single `CacheWriter`, claims on the items in flight under a `Lease` (so
that runs sharing a cache never pay twice), and the `ExpertClient` that joins them.

The names below are imported on first use (PEP 562): `from experts import ExpertSpec` loads the
registry and not the cache (sqlmodel) or the client (aiohttp), so a command line that only
declares its options starts at once.
"""

from __future__ import annotations

import importlib

# Every public name and the module that defines it: the one list of this package's API.
_EXPORTS: dict[str, str] = {
    "BUILTIN_EXPERTS": "._registry",
    "SCHEMA_VERSION": "._cache",
    "SCORING_METHODS": "._scoring",
    "CacheKey": "._cache",
    "CacheWriter": "._cache",
    "ClaimHolder": "._claims",
    "ConfigError": "._errors",
    "Conversation": "._prompts",
    "Endpoint": "._endpoint",
    "EndpointCheck": "._check",
    "EndpointDown": "._errors",
    "ExpertClient": "._client",
    "ExpertError": "._errors",
    "ExpertSpec": "._registry",
    "FailureRow": "._cache",
    "HTTPStatusError": "._errors",
    "InvalidSetting": "._errors",
    "Item": "._client",
    "ItemResult": "._client",
    "Lease": "._claims",
    "Limiter": "._limiter",
    "LocalServer": "._serve",
    "Outage": "._client",
    "Pacer": "._limiter",
    "ProgressSink": "._client",
    "PromptTemplate": "._prompts",
    "RateLimit": "._config",
    "Request": "._scoring",
    "ResponseError": "._errors",
    "RetryPolicy": "._config",
    "RunStats": "._client",
    "Score": "._scoring",
    "ScoreCache": "._cache",
    "ScoreRow": "._cache",
    "ScoringMethod": "._scoring",
    "StorageError": "._errors",
    "Timeout": "._config",
    "TransportError": "._errors",
    "add_expert": "._registry",
    "build_request": "._scoring",
    "check_base_url": "._config",
    "check_endpoint": "._check",
    "default_transport": "._endpoint",
    "expert_from_url": "._registry",
    "experts_file": "._registry",
    "list_claims": "._claims",
    "load_experts": "._registry",
    "load_template": "._prompts",
    "parse_response": "._scoring",
    "redact_url": "._config",
    "render_conversation": "._prompts",
    "resolve_expert": "._registry",
    "score_items": "._client",
    "server_command": "._serve",
    "smollm2_gguf": "._serve",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
