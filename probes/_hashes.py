"""File content hashes, computed once per file version and remembered across processes.

A model folder's identity is the sha256 of its files' content (probes/_model.py), and hashing a
few GB at every start would cost seconds to minutes. So each file's hash is kept in a small JSON
file, `model_cache_root()/file-hashes.json`, keyed by the file's resolved path, size, mtime_ns
and ctime_ns. ctime is in the key because user space cannot set it back: an edit that keeps the
size and restores the modification time (`touch -r`, `cp -p`, `rsync -t`) still changes it, so a
changed weight file is never taken for the one that was hashed. The cost is a rehash after a
chmod or a hard link, which also change ctime.

A file is remembered only once its ctime is older than the hash by `RACY_SECONDS`: a filesystem
keeps times in ticks (a few ms on ext4, 2 s on FAT), and a write in the same tick as the
one the hash saw would leave the key as it was. Such a "racily clean" file (just written or
copied) is hashed again at its next use, as git re-reads racily clean index entries. The
margin is taken on this machine's clock: a network filesystem whose server's clock lags by more
than that can still race.

The file is rewritten whole (a temporary file renamed over it), after merging what another
process wrote meanwhile: a reader never sees a partial file, and two processes racing can at
worst lose each other's new entries, which are then hashed again. A cache that cannot be read or
written is ignored: the hashes are then computed every time, and loading still works.

Standard library only (no torch).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

from ._embedded import model_cache_root, sha256_of_file

__all__ = ["HASH_CACHE_NAME", "content_sha256", "hash_cache_path"]

HASH_CACHE_NAME = "file-hashes.json"
HASH_CACHE_VERSION = 1
MAX_ENTRIES = 10_000  # about 2 MB of JSON; the oldest entries go first beyond it
RACY_SECONDS = 2.0  # FAT's tick, the coarsest of the common filesystems

# This process's view of the cache: key -> sha256, filled from the file once and by each hash.
_memory: dict[str, str] = {}
_loaded_from: Path | None = None


def hash_cache_path() -> Path:
    """Where the hashes are remembered: file-hashes.json under the model cache."""
    return model_cache_root() / HASH_CACHE_NAME


def _key(path: Path) -> str:
    """resolved path|size|mtime_ns|ctime_ns: changes whenever the file's content may have."""
    resolved = path.resolve()
    stat = resolved.stat()
    return f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ctime_ns}"


def _settled(key: str, hashed_at_ns: int) -> bool:
    """Whether a write after the hash must change `key`: its ctime is a full tick before the hash."""
    return int(key.rsplit("|", 1)[1]) < hashed_at_ns - int(RACY_SECONDS * 1e9)


def _read(cache: Path) -> dict[str, str]:
    """The entries of the cache file; empty when it is missing, unreadable or not ours."""
    try:
        data = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != HASH_CACHE_VERSION:
        return {}
    entries = data.get("sha256")
    if not isinstance(entries, dict):
        return {}
    return {k: v for k, v in entries.items() if isinstance(k, str) and isinstance(v, str) and len(v) == 64}


def _write(cache: Path, new: dict[str, str]) -> None:
    """Merge `new` into the cache file and replace it atomically; any OSError is swallowed (an
    unwritable cache only costs hashing again)."""
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        entries = {**_read(cache), **new}  # what others wrote since this process read it
        entries = {k: v for k, v in entries.items() if _current(k)}  # forget edited or deleted files
        if len(entries) > MAX_ENTRIES:
            entries = dict(list(entries.items())[-MAX_ENTRIES:])
        fd, temporary = tempfile.mkstemp(prefix=".file-hashes-", suffix=".tmp", dir=cache.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"version": HASH_CACHE_VERSION, "sha256": entries}, handle)
            os.replace(temporary, cache)  # same folder, so atomic
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise


def _current(key: str) -> bool:
    """Whether the file a cache key names is still that version of it (size and times)."""
    path = key.rsplit("|", 3)[0]
    try:
        return _key(Path(path)) == key
    except OSError:
        return False


def content_sha256(paths: list[Path]) -> list[str]:
    """sha256 of each file's bytes, in order: from the cache when the file is unchanged since it
    was hashed (same resolved path, size, mtime and ctime), else computed and remembered (once
    settled: see the module's docstring)."""
    global _loaded_from
    cache = hash_cache_path()
    if _loaded_from != cache:  # read once per process (and again if the cache root moves)
        _memory.clear()
        _memory.update(_read(cache))
        _loaded_from = cache
    out: list[str] = []
    new: dict[str, str] = {}
    for path in paths:
        key = _key(Path(path))
        digest = _memory.get(key)
        if digest is None:
            hashed_at = time.time_ns()
            digest = sha256_of_file(Path(path))
            if _settled(key, hashed_at) and _key(Path(path)) == key:  # and unchanged while read
                new[key] = _memory[key] = digest
        out.append(digest)
    if new:
        _write(cache, new)
    return out
