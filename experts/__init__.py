"""The expert stage: score inputs with an expensive expert LLM behind an OpenAI-compatible API.

Small composable pieces: value objects for settings (`Timeout`, `RateLimit`, `RetryPolicy`),
an `Endpoint` (replicas, error translation), a `Limiter` (concurrency, RPM, TPM), a
`ScoreCache` with its single `CacheWriter`, claims on the items in flight under a `Lease` (so
that runs sharing a cache never pay twice), and the `ExpertClient` that joins them.
"""

from ._cache import SCHEMA_VERSION, CacheKey, CacheWriter, FailureRow, ScoreCache, ScoreRow
from ._check import EndpointCheck, check_endpoint
from ._claims import ClaimHolder, Lease, list_claims
from ._client import ExpertClient, Item, ItemResult, Outage, ProgressSink, RunStats, score_items
from ._config import RateLimit, RetryPolicy, Timeout, check_base_url, redact_url
from ._endpoint import Endpoint, default_transport
from ._errors import (
    ConfigError,
    EndpointDown,
    ExpertError,
    HTTPStatusError,
    InvalidSetting,
    ResponseError,
    StorageError,
    TransportError,
)
from ._limiter import Limiter, Pacer
from ._prompts import Conversation, PromptTemplate, load_template, render_conversation
from ._registry import (
    BUILTIN_EXPERTS,
    ExpertSpec,
    add_expert,
    expert_from_url,
    experts_file,
    load_experts,
    resolve_expert,
)
from ._scoring import SCORING_METHODS, Request, Score, ScoringMethod, build_request, parse_response
from ._serve import LocalServer, server_command

__all__ = [
    "BUILTIN_EXPERTS",
    "SCHEMA_VERSION",
    "SCORING_METHODS",
    "CacheKey",
    "CacheWriter",
    "ClaimHolder",
    "ConfigError",
    "Conversation",
    "Endpoint",
    "EndpointCheck",
    "EndpointDown",
    "ExpertClient",
    "ExpertError",
    "ExpertSpec",
    "FailureRow",
    "HTTPStatusError",
    "InvalidSetting",
    "Item",
    "ItemResult",
    "Lease",
    "Limiter",
    "LocalServer",
    "Outage",
    "Pacer",
    "ProgressSink",
    "PromptTemplate",
    "RateLimit",
    "Request",
    "ResponseError",
    "RetryPolicy",
    "RunStats",
    "Score",
    "ScoreCache",
    "ScoreRow",
    "ScoringMethod",
    "StorageError",
    "Timeout",
    "TransportError",
    "add_expert",
    "build_request",
    "check_base_url",
    "check_endpoint",
    "default_transport",
    "expert_from_url",
    "experts_file",
    "list_claims",
    "load_experts",
    "load_template",
    "parse_response",
    "redact_url",
    "render_conversation",
    "resolve_expert",
    "score_items",
    "server_command",
]
