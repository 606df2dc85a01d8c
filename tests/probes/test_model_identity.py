"""A model folder is identified by its files' content (probes/_model.py, issue 25):

- a copy of the embedded model's converted folder, elsewhere, has the same identity, with no path
  in it; a flipped byte in a weight file changes it, even when the size and modification time are
  put back;
- each file is hashed once per version: a second process reads the hash from the persistent cache
  (file-hashes.json), and a cache that cannot be written costs only hashing again;
- probes that recorded the old `folder:PATH@HASH` identity still match that folder, untouched.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

# Private: the hashes and the legacy identities a model identity is made of.
from probes import _hashes, describe_model, embedded_gguf
from probes._model import (
    FOLDER_IDENTITY_PREFIX,
    _legacy_folder_identity,
    file_sha256,
    identity_matches,
    is_legacy_identity,
    model_cache_root,
)


def converted_folder() -> Path:
    """The embedded model as a plain folder of float weights (made once under the model cache)."""
    folder = model_cache_root() / f"gguf-{file_sha256(embedded_gguf())[:24]}"
    if not (folder / "model.safetensors").is_file():
        from probes import load_model

        load_model()  # converts the GGUF into that folder
    return folder


@pytest.fixture(scope="module")
def original() -> Path:
    return converted_folder()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A hash cache of this test's own, read afresh (as by a new process). The files these tests
    copy are seconds old: the racy margin is lifted so that they are remembered at once."""
    path = tmp_path / "hash-cache" / "file-hashes.json"
    monkeypatch.setattr(_hashes, "hash_cache_path", lambda: path)
    monkeypatch.setattr(_hashes, "_loaded_from", None)
    monkeypatch.setattr(_hashes, "RACY_SECONDS", 0.0)
    return path


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The files actually read to hash them, in order."""
    calls: list[Path] = []
    real = _hashes.sha256_of_file

    def counting(path: Path) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(_hashes, "sha256_of_file", counting)
    return calls


def copy_model(original: Path, target: Path) -> Path:
    shutil.copytree(original, target)
    return target


def new_process() -> None:
    """Forget what this process remembered of the cache, as a fresh process would."""
    _hashes._loaded_from = None
    _hashes._memory.clear()


def flip_byte(path: Path, offset: int) -> None:
    """Change one byte in place, then put the size and modification time back as they were."""
    before = path.stat()
    with path.open("r+b") as handle:
        handle.seek(offset)
        value = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([value[0] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_a_copy_elsewhere_has_the_same_identity_and_no_path_in_it(
    original: Path, tmp_path: Path, cache: Path
) -> None:
    copy = copy_model(original, tmp_path / "elsewhere" / "model")
    ours, theirs = describe_model(str(original)).identity, describe_model(str(copy)).identity
    assert ours == theirs and ours.startswith(FOLDER_IDENTITY_PREFIX)
    assert str(tmp_path) not in ours and "gguf-" not in ours
    assert len(ours.removeprefix(FOLDER_IDENTITY_PREFIX)) == 64 and not is_legacy_identity(ours)


def test_a_flipped_weight_byte_changes_the_identity_even_with_size_and_time_put_back(
    original: Path, tmp_path: Path, cache: Path, hashed: list[Path]
) -> None:
    copy = copy_model(original, tmp_path / "copy")
    before = describe_model(str(copy)).identity
    assert any(p.name == "model.safetensors" for p in hashed)
    flip_byte(copy / "model.safetensors", (copy / "model.safetensors").stat().st_size // 2)
    new_process()
    hashed.clear()
    after = describe_model(str(copy)).identity
    assert after != before
    assert [p.name for p in hashed] == ["model.safetensors"]  # the other files came from the cache


def test_hashes_are_remembered_across_processes_and_an_unwritable_cache_only_costs_time(
    original: Path, tmp_path: Path, cache: Path, hashed: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = copy_model(original, tmp_path / "copy")
    first = describe_model(str(copy)).identity
    assert len(hashed) >= 5  # weights, config, tokenizer files, template
    stored = json.loads(cache.read_text())["sha256"]
    assert all(key.startswith(str(copy.resolve())) for key in stored)
    new_process()
    hashed.clear()
    assert describe_model(str(copy)).identity == first
    assert hashed == []  # every hash came from the file a previous "process" wrote
    leftovers = [p.name for p in cache.parent.iterdir() if p.name != cache.name]
    assert leftovers == []  # the temporary file was renamed into place

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setattr(_hashes, "hash_cache_path", lambda: blocked / "file-hashes.json")
    new_process()
    assert describe_model(str(copy)).identity == first  # hashed again, nothing written, no error
    assert len(hashed) >= 5


def test_an_old_style_identity_matches_only_its_folder_untouched(
    original: Path, tmp_path: Path, cache: Path
) -> None:
    from probes import load_model

    copy = copy_model(original, tmp_path / "copy")
    recorded = _legacy_folder_identity(copy)
    assert is_legacy_identity(recorded) and recorded.startswith(f"folder:{copy.resolve()}@")
    loaded = load_model(str(copy))
    assert identity_matches(recorded, loaded)
    assert identity_matches(loaded.identity, loaded)
    assert not identity_matches(_legacy_folder_identity(original), loaded)  # another path
    os.utime(copy / "model.safetensors", ns=(0, 0))  # the old identity saw file times
    assert not identity_matches(recorded, loaded)
    assert not identity_matches("gguf:" + "0" * 64, loaded)


def test_a_file_written_within_the_racy_margin_is_hashed_again_until_it_settles(
    tmp_path: Path, cache: Path, hashed: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write in the same timestamp tick as the hash would keep the key: so a file whose ctime
    is within RACY_SECONDS of the hash is not remembered, and is once it is older. The hash's
    clock is set, not waited for: first the file's own ctime, then just past the margin (a 0.5 s
    margin in real time could pass between two reads on a loaded machine)."""
    fresh = tmp_path / "weights.bin"
    fresh.write_bytes(b"w" * 1000)
    now_ns = [fresh.stat().st_ctime_ns]
    monkeypatch.setattr(_hashes, "time", SimpleNamespace(time_ns=lambda: now_ns[0]))
    first = _hashes.content_sha256([fresh])
    new_process()
    assert _hashes.content_sha256([fresh]) == first
    assert hashed == [fresh, fresh] and not cache.exists()  # not remembered: read twice
    now_ns[0] += int((_hashes.RACY_SECONDS + 0.1) * 1e9)
    new_process()
    _hashes.content_sha256([fresh])
    new_process()
    assert _hashes.content_sha256([fresh]) == first
    assert hashed == [fresh, fresh, fresh]  # settled: remembered after the third read
