"""The exceptions of the expert stage, one tree.

    ExpertError                 anything that went wrong for an item or an endpoint
    ├── ConfigError             a registry entry or option that cannot work (never retried)
    │   └── InvalidSetting      one setting's value: which setting, the value as it may be
    │                           shown (credentials redacted), and what is wrong with it
    ├── TransportError          connect/read/write timeouts, refused or dropped connections
    ├── HTTPStatusError         a non-2xx answer; 408, 409, 425, 429 and 5xx are retried
    ├── ResponseError           a 2xx answer without a usable score: malformed JSON, missing
    │                           logprobs, no mass on the label tokens (retried, never cached)
    ├── EndpointDown            item after item failed at the endpoint with no answer between:
    │                           the run ends instead of waiting out every item's retries
    └── StorageError            the cache could not store answers (disk full, I/O error): the
                                run ends after committing what it can

httpx exceptions are translated where they enter (`experts._endpoint`).
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "EndpointDown",
    "ExpertError",
    "HTTPStatusError",
    "InvalidSetting",
    "ResponseError",
    "StorageError",
    "TransportError",
]

_RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class ExpertError(Exception):
    """Base class. `retryable` says whether another attempt may succeed; `reason` is a short
    machine-readable tag recorded in the failure ledger."""

    retryable: bool = False
    reason: str = "error"


class ConfigError(ExpertError):
    """`setting` names the key or option the problem is about, where there is one, so that
    whoever knows where it was written (a file's line, an option) can say so."""

    reason = "config"

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class InvalidSetting(ConfigError):
    """A setting whose value cannot work. `setting` names it as the object that refused it
    knows it (a field, a TOML key); `shown` is the value safe to print (a URL's credentials
    are redacted); `problem` says what a valid value looks like. Whoever knows where the value
    came from (a file and line, a command-line option) rewords it with that place."""

    def __init__(self, setting: str, shown: str, problem: str) -> None:
        super().__init__(f"{setting} = {shown}: {problem}", setting=setting)
        self.shown = shown
        self.problem = problem


class TransportError(ExpertError):
    retryable = True

    def __init__(self, message: str, *, reason: str = "transport") -> None:
        super().__init__(message)
        self.reason = reason


class HTTPStatusError(ExpertError):
    def __init__(self, status: int, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.retry_after = retry_after
        self.retryable = status in _RETRYABLE_STATUS or status >= 500
        self.reason = f"http-{status}"


class ResponseError(ExpertError):
    retryable = True

    def __init__(self, message: str, *, reason: str = "bad-response") -> None:
        super().__init__(message)
        self.reason = reason


class EndpointDown(ExpertError):
    reason = "endpoint-down"


class StorageError(ExpertError):
    """The cache file could not be written; the message names it. Raised where SQLite is
    written (`experts._cache`, `experts._claims`), never retried: a full disk stays full."""

    reason = "storage"
