"""The expert stage: score inputs with an expensive expert LLM behind an OpenAI-compatible API.

What a user calls: an `ExpertSpec` (from the registry, or `expert_from_url`) with its settings
(`Timeout`, `RateLimit`, `RetryPolicy`), a `ScoreCache`, and the `ExpertClient` (or
`score_items`) that scores `Item`s through them; `check_endpoint` before a run and
`LocalServer` for a local llama.cpp server. Inside, small composable pieces stay private: the
endpoint (replicas, error translation), the limiter (concurrency, RPM, TPM), the cache's single
writer, and claims on the items in flight under a lease (so that runs sharing a cache never pay
twice).
"""

from ._cache import ScoreCache
from ._check import EndpointCheck, check_endpoint
from ._claims import list_claims
from ._client import ExpertClient, Item, ItemResult, ProgressSink, RunStats, score_items
from ._config import RateLimit, RetryPolicy, Timeout, check_base_url, redact_url
from ._errors import ConfigError, EndpointDown, ExpertError, InvalidSetting, StorageError
from ._prompts import Conversation, PromptTemplate, load_template
from ._registry import (
    BUILTIN_EXPERTS,
    ExpertSpec,
    add_expert,
    expert_from_url,
    experts_file,
    load_experts,
    resolve_expert,
)
from ._scoring import SCORING_METHODS, Request, ScoringMethod, build_request, top_logprobs
from ._serve import LocalServer, server_command

__all__ = [
    "BUILTIN_EXPERTS",
    "SCORING_METHODS",
    "ConfigError",
    "Conversation",
    "EndpointCheck",
    "EndpointDown",
    "ExpertClient",
    "ExpertError",
    "ExpertSpec",
    "InvalidSetting",
    "Item",
    "ItemResult",
    "LocalServer",
    "ProgressSink",
    "PromptTemplate",
    "RateLimit",
    "Request",
    "RetryPolicy",
    "RunStats",
    "ScoreCache",
    "ScoringMethod",
    "StorageError",
    "Timeout",
    "add_expert",
    "build_request",
    "check_base_url",
    "check_endpoint",
    "expert_from_url",
    "experts_file",
    "list_claims",
    "load_experts",
    "load_template",
    "redact_url",
    "resolve_expert",
    "score_items",
    "server_command",
    "top_logprobs",
]
