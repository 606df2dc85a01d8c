"""The expert stage: score inputs with an expensive expert LLM behind an OpenAI-compatible API.

What a user calls: an `ExpertSpec` (from the registry, or `expert_from_url`) with its settings
(`Timeout`, `RateLimit`, `RetryPolicy`), a `ScoreCache`, and the `ExpertClient` (or
`score_items`) that scores `Item`s through them; `check_endpoint` before a run and
`LocalServer` for a local llama.cpp or vLLM server (`setup_vllm` puts vLLM in a venv of its
own); `batch_request_lines`, `read_batch_results` and `commit_batch_results` for the same
requests as an OpenAI batch file, keyed by the cache key (`experts._batch`); `check_cache` and
`salvage_cache` for a damaged cache (every failure of the cache file is a `StorageError` naming
it, `CacheCorrupt` for damage); `merge_caches` to bring other machines' answers into a cache,
`write_answers`/`import_answers` to move them as JSON lines. Inside, small composable pieces
stay private: the endpoint (replicas, error translation), the limiter (concurrency, RPM, TPM),
the cache's single writer, and claims on the items in flight under a lease (so that runs sharing
a cache never pay twice).

The names below are imported on first use (PEP 562): `from experts import ExpertSpec` loads the
registry and not the cache (sqlmodel) or the client (aiohttp), so a command line that only
declares its options starts at once.
"""

from __future__ import annotations

import importlib

# Every public name and the module that defines it: the one list of this package's API.
_EXPORTS: dict[str, str] = {
    "BATCH_URL_ROOT": "._batch",
    "BUILTIN_EXPERTS": "._registry",
    "BUILTIN_TEMPLATES": "._prompts",
    "DEFAULT_TEMPLATE": "._prompts",
    "DRAIN_GRACE": "._drain",
    "HOWS": "._recovery",
    "MESSAGE_FIELDS": "._messages",
    "BatchAnswer": "._batch",
    "BatchCommit": "._batch",
    "BatchRequests": "._batch",
    "BreakerState": "._breaker",
    "CacheCheck": "._repair",
    "CacheCorrupt": "._errors",
    "SCORING_METHODS": "._scoring",
    "ConfigError": "._errors",
    "CostLimitReached": "._spend",
    "Conversation": "._prompts",
    "EndpointCheck": "._check",
    "EndpointDown": "._errors",
    "ExpertClient": "._client",
    "ExpertError": "._errors",
    "ExpertSpec": "._registry",
    "FailureKind": "._failure",
    "InvalidSetting": "._errors",
    "Item": "._items",
    "ItemResult": "._items",
    "KeyedItems": "._client",
    "LocalServer": "._serve",
    "MergeReport": "._merge",
    "PortTaken": "._serve",
    "Price": "._config",
    "ProgressSink": "._items",
    "PromptTemplate": "._prompts",
    "RateLimit": "._config",
    "Request": "._scoring",
    "ROLE_ALIASES": "._messages",
    "RetryPolicy": "._config",
    "RunStats": "._items",
    "SalvageResult": "._repair",
    "Spend": "._spend",
    "ScoreCache": "._cache",
    "ScoringMethod": "._scoring",
    "StorageError": "._errors",
    "Stopped": "._drain",
    "Timeout": "._config",
    "VLLM_ENV_VAR": "._vllm",
    "VllmSettings": "._vllm",
    "add_expert": "._registry",
    "batch_custom_ids": "._batch",
    "batch_tag": "._cache",
    "batch_request_lines": "._batch",
    "pending_line": "._batch",
    "build_request": "._scoring",
    "chat_message": "._messages",
    "check_cache": "._repair",
    "check_base_url": "._config",
    "check_endpoint": "._check",
    "check_merge_sources": "._merge",
    "commit_batch_results": "._batch",
    "describe_template": "._prompts",
    "expert_from_url": "._registry",
    "answers_by_how": "._answers",
    "forget_answers": "._answers",
    "import_answers": "._answers",
    "experts_file": "._registry",
    "list_claims": "._claims",
    "load_experts": "._registry",
    "load_template": "._prompts",
    "merge_caches": "._merge",
    "read_batch_results": "._batch",
    "redact": "._redact",
    "redact_url": "._config",
    "resolve_expert": "._registry",
    "salvage_cache": "._repair",
    "score_items": "._client",
    "server_command": "._serve",
    "signals_held": "._serve",
    "setup_vllm": "._vllm",
    "top_logprobs": "._scoring",
    "vllm_env": "._vllm",
    "write_answers": "._answers",
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
