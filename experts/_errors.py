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
    └── StorageError            the cache file failed: full, read-only, no permission, locked,
        │                       an I/O error (`kind` says which); the run ends after committing
        │                       what it can
        └── CacheCorrupt        SQLite found the file damaged: `ctd cache check` and
                                `ctd cache salvage` are the way out

httpx exceptions are translated where they enter (`experts._endpoint`).
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path
from typing import Literal, get_args

__all__ = [
    "CacheCorrupt",
    "ConfigError",
    "EndpointDown",
    "ExpertError",
    "HTTPStatusError",
    "InvalidSetting",
    "ResponseError",
    "StorageError",
    "StorageKind",
    "TransportError",
    "storage_kind",
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


StorageKind = Literal["full", "quota", "read-only", "permission", "io", "locked", "corrupt", "other"]
"""What failed under the cache. Every kind but "other" is the machine's doing (its disk, its
mounts, another process), not the run's: the command line exits with its environment code."""

ENVIRONMENT_KINDS: frozenset[StorageKind] = frozenset(get_args(StorageKind)) - {"other"}

# errno of a failed open or write, and SQLite's primary result codes (the low byte of
# `sqlite_errorcode`; https://sqlite.org/rescode.html), as kinds.
_ERRNO_KINDS: dict[int, StorageKind] = {
    errno.ENOSPC: "full",
    errno.EDQUOT: "quota",
    errno.EROFS: "read-only",
    errno.EACCES: "permission",
    errno.EPERM: "permission",
    errno.EIO: "io",
}
_SQLITE_KINDS: dict[int, StorageKind] = {
    3: "permission",  # SQLITE_PERM
    5: "locked",  # SQLITE_BUSY: another connection's lock outlasted the busy timeout
    6: "locked",  # SQLITE_LOCKED
    8: "read-only",  # SQLITE_READONLY
    10: "io",  # SQLITE_IOERR (a full quota lands here too: SQLite calls only ENOSPC "full")
    11: "corrupt",  # SQLITE_CORRUPT: "database disk image is malformed"
    13: "full",  # SQLITE_FULL
    26: "corrupt",  # SQLITE_NOTADB, met after the file was opened as a database
}

_REMEDIES: dict[StorageKind, str] = {
    "full": "no space left on its device: free space and rerun to resume (the answers committed so far "
    "are kept)",
    "quota": "the disk quota is used up: free space and rerun to resume (the answers committed so far "
    "are kept)",
    "read-only": "it is read-only: make it writable or give --cache (or $CTD_CACHE) a writable path",
    "permission": "it cannot be written: give this user write access or another --cache",
    "io": "an I/O error: check the disk, then run `ctd cache check` on it",
    "locked": "another process holds it locked (a sqlite3 shell with an open transaction?): "
    "end that process and rerun",
    "corrupt": "",  # CacheCorrupt words its own remedy
    "other": "rerun; if it fails again, run `ctd cache check` on it",
}


def storage_kind(error: BaseException) -> StorageKind:
    """The kind of an OSError (by errno) or a sqlite3 error (by SQLite's result code)."""
    if isinstance(error, OSError) and error.errno in _ERRNO_KINDS:
        return _ERRNO_KINDS[error.errno]
    code = getattr(error, "sqlite_errorcode", None)
    if isinstance(error, sqlite3.Error) and code is not None:
        return _SQLITE_KINDS.get(code & 0xFF, "other")
    if isinstance(error, sqlite3.DatabaseError) and "malformed" in str(error):
        return "corrupt"
    if isinstance(error, sqlite3.OperationalError) and "database is locked" in str(error):
        return "locked"  # raised in Python (the switch to WAL gave up): no result code on it
    return "other"


class StorageError(ExpertError):
    """The cache file failed: `path` names it, `kind` says what failed (a `StorageKind`) and
    `remedy` what to do. Raised where SQLite is opened, read or written (`experts._cache`,
    `experts._claims`), never retried: a full disk stays full."""

    reason = "storage"

    def __init__(self, message: str, *, path: Path | None = None, kind: StorageKind = "other") -> None:
        super().__init__(message)
        self.path = path
        self.kind = kind

    @property
    def environment(self) -> bool:
        """The machine failed (its disk, a mount, another process), not the run."""
        return self.kind in ENVIRONMENT_KINDS

    @property
    def remedy(self) -> str:
        return _REMEDIES[self.kind]

    def restated(self, message: str) -> StorageError:
        """The same failure (its class, path and kind) with a longer message."""
        return type(self)(message, path=self.path, kind=self.kind)


class CacheCorrupt(StorageError):
    """SQLite found the cache file damaged ("database disk image is malformed"), at open or at a
    read or write during the run; the message names the file and the commands that repair it."""

    def __init__(self, message: str, *, path: Path | None = None, kind: StorageKind = "corrupt") -> None:
        super().__init__(message, path=path, kind="corrupt")

    @property
    def remedy(self) -> str:
        where = f" --cache {self.path}" if self.path is not None else ""
        return (
            f"the cache is damaged: `ctd cache check{where}` says where, and `ctd cache salvage{where} "
            "--out NEW.sqlite` copies every readable answer into a new cache to use instead"
        )
