"""What kind of failure an item met, as one typed value decided here from the exception tree
(`experts._errors`), so that callers (the monitor's gate, reports) never compare reason strings."""

from __future__ import annotations

import enum

from ._errors import (
    ConfigError,
    EndpointDown,
    ExpertError,
    HTTPStatusError,
    ResponseError,
    StorageError,
    TransportError,
)

__all__ = ["FailureKind"]


class FailureKind(enum.Enum):
    """The kind of an item's last error. `endpoint_fault` marks the kinds that say the endpoint
    is not answering at all (they count toward the breaker); the others are answers."""

    CONNECTION = "connection"  # refused, reset or dropped before an answer
    TIMEOUT = "timeout"  # connected (or tried to) but no answer in time
    SERVER_ERROR = "server-error"  # HTTP 5xx
    RATE_LIMITED = "rate-limited"  # HTTP 429
    REJECTED = "rejected"  # any other HTTP 4xx: the request itself was refused
    BAD_RESPONSE = "bad-response"  # a 2xx answer without a usable score
    ENDPOINT_DOWN = "endpoint-down"  # the breaker is open: nothing was sent
    STORAGE = "storage"  # the cache could not store the answer
    CONFIG = "config"  # a setting that cannot work (a request over the TPM budget, say)
    IN_BATCH = "in-batch"  # out in a batch file (`ctd query --batch-out`): nothing was sent
    OTHER = "other"  # an ExpertError outside the kinds above

    @property
    def endpoint_fault(self) -> bool:
        return self in _ENDPOINT_FAULTS

    @classmethod
    def of(cls, error: ExpertError) -> FailureKind:
        """The kind of `error`, by its class (and, for a transport error, whether it timed out;
        `experts._endpoint` sets that tag where it translates the httpx/aiohttp exception)."""
        if isinstance(error, TransportError):
            return cls.TIMEOUT if error.reason == "timeout" else cls.CONNECTION
        if isinstance(error, HTTPStatusError):
            if error.status >= 500:
                return cls.SERVER_ERROR
            return cls.RATE_LIMITED if error.status == 429 else cls.REJECTED
        for kind, classes in _BY_CLASS:
            if isinstance(error, classes):
                return kind
        return cls.OTHER


_ENDPOINT_FAULTS = frozenset(
    {FailureKind.CONNECTION, FailureKind.TIMEOUT, FailureKind.SERVER_ERROR, FailureKind.ENDPOINT_DOWN}
)
_BY_CLASS: tuple[tuple[FailureKind, type[ExpertError]], ...] = (
    (FailureKind.BAD_RESPONSE, ResponseError),
    (FailureKind.ENDPOINT_DOWN, EndpointDown),
    (FailureKind.STORAGE, StorageError),
    (FailureKind.CONFIG, ConfigError),
)
