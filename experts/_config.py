"""Settings of an expert endpoint, as frozen keyword-only value objects that refuse values that
cannot work (InvalidSetting, naming the field), and the one check of a base URL."""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ._errors import ConfigError, InvalidSetting

if TYPE_CHECKING:
    import httpx

__all__ = ["Price", "RateLimit", "RetryPolicy", "Timeout", "check_base_url", "redact_url"]


def redact_url(url: str) -> str:
    """`url` safe to print: whatever stands between the scheme's // and the last '@' (user and
    password, or a token used as the user name) becomes ***. Taking the last '@' rather than
    parsing the URL means a password holding a '/' or an '@' is never printed; the price is
    over-redacting a (rare) path with an '@' in it."""
    start = url.find("//") + 2 if "//" in url else 0
    at = url.rfind("@")
    return url if at < start else url[:start] + "***" + url[at:]


def check_base_url(url: object, setting: str = "base_url") -> str:
    """`url` if it can be a base URL (http or https, a host, a valid port, no query or fragment,
    since API paths are appended to it); InvalidSetting otherwise. Credentials in the URL are
    refused: httpx cannot send them beside the bearer token, and the URL is printed, logged and
    stored in run folders. The error shows the URL with them redacted."""
    example = "like http://host:8000/v1"
    if not isinstance(url, str):
        raise InvalidSetting(setting, repr(url), f"must be a URL {example}")
    redacted = redact_url(url)
    # Shown without its query or fragment either: a key passed there (Azure's ?subscription-key=,
    # ?code=) is refused below, and must not be printed in the refusal.
    tail = re.search(r"[?#]", redacted)
    shown = repr(redacted if tail is None else redacted[: tail.start() + 1] + "***")
    if redacted != url:  # whatever redaction would hide is refused, before any other problem
        raise InvalidSetting(
            setting,
            shown,
            "credentials in the URL are refused (they would be printed and stored): put the key in "
            "an environment variable named by the expert's api_key_env (`ctd experts add --api-key-env`)",
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError:
        raise InvalidSetting(setting, shown, f"is not a valid URL; expected one {example}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise InvalidSetting(setting, shown, f"must start with http:// or https:// and a host, {example}")
    if parts.query or parts.fragment:
        raise InvalidSetting(setting, shown, "a base URL takes no ?query or #fragment: API paths follow it")
    return url


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _positive(setting: str, value: object, what: str = "a number") -> None:
    """Finite and above 0: NaN would switch a limit off and infinity would wait forever."""
    if not _is_real(value) or not (0 < value < math.inf):  # type: ignore[operator]
        raise InvalidSetting(setting, repr(value), f"must be {what} above 0 (finite)")


def _at_least(setting: str, value: object, minimum: float, what: str = "a number") -> None:
    if not _is_real(value) or not (minimum <= value < math.inf):  # type: ignore[operator]
        raise InvalidSetting(setting, repr(value), f"must be {what} of at least {minimum:g} (finite)")


def _whole(setting: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidSetting(setting, repr(value), f"must be a whole number of at least {minimum}")


@dataclass(frozen=True, kw_only=True)
class Timeout:
    """Seconds allowed to connect, to read a response, to write a request, and to wait for a
    free connection from the pool."""

    connect: float = 10.0
    read: float = 120.0
    write: float = 10.0
    pool: float = 30.0

    def __post_init__(self) -> None:
        for name in ("connect", "read", "write", "pool"):
            _positive(name, getattr(self, name), "a number of seconds")

    def to_httpx(self) -> httpx.Timeout:
        import httpx  # loaded with the client; the registry and `ctd --help` do not need it

        return httpx.Timeout(connect=self.connect, read=self.read, write=self.write, pool=self.pool)


@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """At most `concurrency` requests in flight, `rpm` requests and `tpm` tokens per minute
    (None: unlimited)."""

    concurrency: int = 16
    rpm: float | None = None
    tpm: float | None = None

    def __post_init__(self) -> None:
        _whole("concurrency", self.concurrency, 1)
        for name in ("rpm", "tpm"):
            value = getattr(self, name)
            if value is not None:  # unset is the only way to say "unlimited"
                _positive(name, value, "a number per minute")

    def check_fits(self, tokens: int) -> None:
        """ConfigError when one request holds more tokens than `tpm` allows in a whole minute:
        no pacing could admit it (a hosted API refuses it too), so waiting for it would stall
        the run without a word."""
        if self.tpm is not None and tokens > self.tpm:
            raise ConfigError(
                f"a request of about {tokens} tokens is larger than tpm = {self.tpm:g}, the whole "
                "per-minute token budget: raise tpm or shorten the input",
                setting="tpm",
            )


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Retry an item up to `max_attempts` times in all, within `deadline` seconds of its first
    attempt, waiting initial * multiplier^(attempt-1) seconds (capped at `maximum`) scaled by a
    random factor in [1 - jitter, 1], or what the server's Retry-After asks if that is longer."""

    max_attempts: int = 6
    initial: float = 0.5
    multiplier: float = 2.0
    maximum: float = 30.0
    jitter: float = 0.5
    deadline: float = 900.0
    # End the run once this many items in a row have failed at the endpoint (transport errors,
    # 5xx) with no answer between them; 0 means twice the concurrency, at least 8.
    down_after: int = 0
    # None (a batch run): those failures end the run with EndpointDown. Seconds (a service): the
    # breaker opens instead; items fail at once as endpoint-down for this long, then one probe
    # item goes out and its answer closes the breaker (see `experts._breaker`).
    cooldown: float | None = None

    def __post_init__(self) -> None:
        _whole("max_attempts", self.max_attempts, 1)
        _whole("down_after", self.down_after, 0)
        for name in ("initial", "maximum", "deadline"):
            _at_least(name, getattr(self, name), 0, "a number of seconds")
        if self.cooldown is not None:
            _positive("cooldown", self.cooldown, "a number of seconds")
        _at_least("multiplier", self.multiplier, 1)
        if not _is_real(self.jitter) or not 0 <= self.jitter <= 1:
            raise InvalidSetting("jitter", repr(self.jitter), "must lie in [0, 1]")

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        base = min(self.maximum, self.initial * self.multiplier ** (attempt - 1))
        return base * (1.0 - self.jitter * rng.random())


@dataclass(frozen=True, kw_only=True)
class Price:
    """What an endpoint charges, in US dollars per million tokens: `input` for the prompt's
    tokens, `output` for the generated ones, and `batch_discount`, the fraction taken off both
    for requests sent as a batch (0.5: half price). The default, 0, is a model this machine
    serves: it costs nothing here. Prices decide no answer, so they are not in the cache key."""

    input: float = 0.0
    output: float = 0.0
    batch_discount: float = 0.0

    def __post_init__(self) -> None:
        for name in ("input", "output"):
            _at_least(name, getattr(self, name), 0, "a price in USD per million tokens")
        if not _is_real(self.batch_discount) or not 0 <= self.batch_discount < 1:
            raise InvalidSetting(
                "batch_discount", repr(self.batch_discount), "must be a fraction in [0, 1) (0.5: half price)"
            )

    @property
    def free(self) -> bool:
        return self.input == 0 and self.output == 0

    def usd(self, prompt_tokens: int, completion_tokens: int, *, batch: bool = False) -> float:
        """Dollars for these token counts (sent as a batch: with the batch discount)."""
        cost = (prompt_tokens * self.input + completion_tokens * self.output) / 1e6
        return cost * (1.0 - self.batch_discount) if batch else cost
