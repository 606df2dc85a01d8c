"""Loading the monitored model: a Hugging Face id, a local folder, or a GGUF file.

A GGUF file is de-quantized by transformers (about 20 s for SmolLM2-135M on 2 cores); the float
weights are then saved once under the model cache, keyed by the file's content hash, and later runs
load those instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from urllib.parse import urlsplit

from ._embedded import EMBEDDED_MODEL, embedded_gguf, model_cache_root
from ._errors import ProbeError
from ._hashes import content_sha256

if TYPE_CHECKING:  # torch is imported by the functions that load weights, not by describe_model
    import torch
    from torch import nn

__all__ = [
    "EMBEDDED_MODEL",
    "LoadedModel",
    "ModelInfo",
    "decoder_layers",
    "default_layer",
    "describe_model",
    "embedded_gguf",
    "file_sha256",
    "gguf_as_folder",
    "identity_matches",
    "is_legacy_identity",
    "load_model",
    "model_cache_root",
    "resolve_layer",
]

_GGUF_MAGIC = b"GGUF"


@dataclass
class LoadedModel:
    """A causal LM ready for extraction. `identity` names the weights exactly (id and revision,
    or a file's content hash): it is part of the activation store's key."""

    name: str
    identity: str
    model: nn.Module
    tokenizer: Any
    n_layers: int
    hidden_size: int
    dtype: torch.dtype
    device: torch.device

    @property
    def template_text(self) -> str:
        """The chat template as text ("" means plain-text rendering). A tokenizer_config.json may
        hold a list of named templates ({name, template}), which transformers loads as a mapping
        name -> template: that is canonical JSON (keys sorted), so that it hashes the same in every
        process and can be recorded in a probe's JSON sidecar."""
        template = getattr(self.tokenizer, "chat_template", None) or ""
        if isinstance(template, dict):
            return json.dumps(template, sort_keys=True, ensure_ascii=False)
        return str(template)

    @property
    def template_hash(self) -> str:
        """sha256 of the chat template (`template_text`)."""
        return hashlib.sha256(self.template_text.encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, remembered across processes for the same file version
    (probes/_hashes.py)."""
    return content_sha256([Path(path)])[0]


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks, in order: the ModuleList whose length is the config's layer count."""
    from torch import nn  # torch loads only with a model (`ctd --help` and the dry checks skip it)

    n = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == n:
            return module
    raise ProbeError(f"{type(model).__name__}: cannot find its {n} decoder layers")


def default_layer(config: Any) -> int:
    """11 for Llama-3.2-1B (the paper's layer), else two thirds of the depth."""
    n = int(config.num_hidden_layers)
    if getattr(config, "model_type", "") == "llama" and n == 16 and config.hidden_size == 2048:
        return 11
    return max(1, round(2 * n / 3))


def resolve_layer(layer: int | None, n_layers: int, config: Any) -> int:
    """The layer to read: L means `hidden_states[L]` of a transformers forward pass, i.e. the
    output of decoder block L (1-based); L = n_layers includes the final norm, as transformers does."""
    if layer is None:
        return default_layer(config)
    if not 1 <= layer <= n_layers:
        raise ProbeError(f"--layer {layer}: the model has {n_layers} layers (choose 1..{n_layers})")
    return layer


def _check_gguf(path: Path) -> None:
    if not path.is_file():
        raise ProbeError(f"{path}: no such GGUF file")
    with path.open("rb") as handle:
        if handle.read(4) != _GGUF_MAGIC:
            raise ProbeError(f"{path}: not a GGUF model file (no GGUF header)")


def _converted_gguf(path: Path, digest: str, dtype: torch.dtype) -> Path:
    """A folder with float weights and tokenizer converted from the GGUF `path` (made once)."""
    folder = _converted_folder(digest)
    if (folder / "ctd-converted.json").is_file():
        return folder
    try:  # first, so that a read-only or full model cache fails in one line before a minute of work
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=folder.parent))
    except OSError as error:
        raise _unwritable(folder.parent, error) from None
    try:
        model, tokenizer = _load_gguf(path, dtype)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "ctd-converted.json").write_text(json.dumps({"gguf": str(path), "sha256": digest}))
        try:
            staging.rename(folder)
        except OSError:
            if not (folder / "ctd-converted.json").is_file():
                raise
            # Another process (e.g. another rank of `torchrun`) converted it first: keep theirs.
    except OSError as error:
        raise _unwritable(folder.parent, error) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _unwritable(cache: Path, error: OSError) -> ProbeError:
    return ProbeError(f"{cache}: cannot write the converted model there ({error.strerror})")


def _load_gguf(path: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    """The GGUF's model, de-quantized to `dtype`, and its tokenizer, ready to save as a folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # gguf's own progress bar
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    except Exception as error:  # transformers raises many types for a file it cannot read
        raise ProbeError(f"{path}: not a model transformers can load ({_one_line(error)})") from None
    # A GGUF-loaded model refuses save_pretrained; after de-quantization its weights are plain
    # floats, so dropping the quantizer marks it as the ordinary model it now is.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tokenizer


def _converted_folder(digest: str) -> Path:
    return model_cache_root() / f"gguf-{digest[:24]}"


def gguf_as_folder(path: Path, *, convert: bool = True) -> Path:
    """A GGUF file as a Hugging Face folder (float32 weights, tokenizer, chat template), converted
    once under the model cache and shared by every user: the probe stage and a vLLM expert.
    `convert=False`: the folder's path only, converted or not (a dry run names it)."""
    _check_gguf(Path(path))
    if not convert:
        return _converted_folder(file_sha256(Path(path)))
    import torch

    return _converted_gguf(Path(path), file_sha256(Path(path)), torch.float32)


def _locate(name: str) -> tuple[Literal["gguf", "folder", "hub"], Path]:
    """What `--model` names: the embedded GGUF, a .gguf file, a model folder, or a hub id."""
    path = embedded_gguf() if name == EMBEDDED_MODEL else Path(name).expanduser()
    if path.suffix.lower() == ".gguf":
        _check_gguf(path)
        return "gguf", path
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ProbeError(f"{path}: not a model folder (no config.json)")
        return "folder", path
    if path.exists():
        raise ProbeError(f"--model {name}: neither a model folder nor a .gguf file")
    if name.startswith((".", "/", "~")):
        raise ProbeError(f"--model {name}: no such file or folder")
    return "hub", path


@dataclass(frozen=True)
class ModelInfo:
    """What a run needs to know of a model before loading its weights."""

    identity: str  # as LoadedModel.identity: changes whenever the weights do
    n_layers: int
    config: Any  # model_type, num_hidden_layers, hidden_size (for the default layer)


def describe_model(name: str = EMBEDDED_MODEL, *, revision: str | None = None) -> ModelInfo:
    """The model's identity and depth without loading weights (config.json, or GGUF metadata), so
    that a bad --layer is reported before any download or extraction."""
    from types import SimpleNamespace

    kind, path = _locate(name)
    if kind == "gguf":
        digest = file_sha256(path)
        converted = model_cache_root() / f"gguf-{digest[:24]}" / "config.json"
        if converted.is_file():
            config = SimpleNamespace(**json.loads(converted.read_text()))
        else:
            config = _gguf_config(path)
        return ModelInfo(f"gguf:{digest}", int(config.num_hidden_layers), config)
    if kind == "folder":
        config = SimpleNamespace(**json.loads((path / "config.json").read_text()))
        return ModelInfo(_folder_identity(path), _depth(config, name), config)
    from transformers import AutoConfig

    try:
        config = _local_first(
            lambda local: AutoConfig.from_pretrained(name, revision=revision, local_files_only=local)
        )
    except OSError as error:
        why = _one_line(error).removeprefix("OSError: ")
        raise ProbeError(f"--model {name}: not found locally and could not be fetched: {why}") from None
    except Exception as error:
        raise ProbeError(
            f"--model {name}: transformers cannot read its config ({_one_line(error)})"
        ) from None
    commit = getattr(config, "_commit_hash", None) or revision or "unknown"
    return ModelInfo(f"hub:{name}@{commit}", _depth(config, name), config)


def _depth(config: Any, name: str) -> int:
    layers = getattr(config, "num_hidden_layers", None)
    if layers is None and hasattr(config, "text_config"):  # multimodal configs nest the LM's
        text = config.text_config
        layers = (
            text.get("num_hidden_layers")
            if isinstance(text, dict)
            else getattr(text, "num_hidden_layers", None)
        )
    if not isinstance(layers, int):
        raise ProbeError(f"--model {name}: its config has no num_hidden_layers; is it a causal LM?")
    return layers


def _gguf_config(path: Path) -> Any:
    """model_type, num_hidden_layers and hidden_size from a GGUF file's metadata."""
    from types import SimpleNamespace

    from gguf import GGUFReader

    try:
        fields = GGUFReader(path).fields
        arch = bytes(fields["general.architecture"].parts[-1]).decode()
        layers = int(fields[f"{arch}.block_count"].parts[-1][0])
        hidden = int(fields[f"{arch}.embedding_length"].parts[-1][0])
    except Exception as error:
        raise ProbeError(f"{path}: not a model transformers can load ({_one_line(error)})") from None
    return SimpleNamespace(model_type=arch, num_hidden_layers=layers, hidden_size=hidden)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


# The files of a model folder that make its identity: weights, and the config, tokenizer and
# chat-template files transformers reads. ctd-converted.json is left out: it names the GGUF file
# a converted folder came from by path, which says nothing of the weights.
_IDENTITY_SUFFIXES = frozenset({".safetensors", ".bin", ".json", ".jinja", ".model", ".txt", ".tiktoken"})
_NOT_IDENTITY = frozenset({"ctd-converted.json"})
FOLDER_IDENTITY_PREFIX = "folder:sha256:"


def _folder_identity(folder: Path) -> str:
    """A local folder's identity: `folder:sha256:` and the sha256 of its files' names and content
    hashes (see _IDENTITY_SUFFIXES), so that any copy of the same files has the same identity
    wherever it lies, and a changed byte in any of them changes it. Each file is hashed once per
    version of it (probes/_hashes.py)."""
    files = sorted(
        item
        for item in folder.iterdir()
        if item.is_file() and item.suffix in _IDENTITY_SUFFIXES and item.name not in _NOT_IDENTITY
    )
    manifest = hashlib.sha256()
    for item, digest in zip(files, content_sha256(files), strict=True):
        manifest.update(f"{item.name}\0{digest}\n".encode())
    return FOLDER_IDENTITY_PREFIX + manifest.hexdigest()


def _legacy_folder_identity(folder: Path) -> str:
    """The identity folders had before content hashing (kept to recognise probes that recorded
    it): the resolved path and a hash of the config and of the weight files' names, sizes and
    modification times."""
    digest = hashlib.sha256()
    for item in sorted(folder.iterdir()):
        if item.is_file() and (item.suffix in {".json", ".safetensors", ".bin", ".jinja", ".model"}):
            stat = item.stat()
            digest.update(f"{item.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
            if item.suffix in {".json", ".jinja"}:
                digest.update(item.read_bytes())
    return f"folder:{folder.resolve()}@{digest.hexdigest()[:24]}"


def is_legacy_identity(identity: str) -> bool:
    """Whether `identity` is a folder identity of the old form, `folder:PATH@HASH`."""
    return identity.startswith("folder:") and not identity.startswith(FOLDER_IDENTITY_PREFIX)


def identity_matches(recorded: str, loaded: LoadedModel) -> bool:
    """Whether `loaded` has the weights `recorded` (an identity saved with probes) names. An
    identity of the old folder form matches only the same folder, at the same path, with its files
    untouched since: what it promised when it was recorded, no more."""
    if recorded == loaded.identity:
        return True
    if not is_legacy_identity(recorded) or not loaded.identity.startswith(FOLDER_IDENTITY_PREFIX):
        return False
    return _legacy_folder_identity(Path(loaded.name).expanduser()) == recorded


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP check, so that an offline machine fails in seconds rather than after the hub
    client's retries (about 50 s)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes"}:
        return False
    host = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def _from_pretrained(source: str, revision: str | None, dtype: torch.dtype, device_map: str | None):
    """Tokenizer and model from a folder, or from a hub id: the local cache first, the hub only
    when it answers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def load(local_only: bool):
        kwargs = {"revision": revision, "local_files_only": local_only}
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, device_map=device_map, **kwargs)
        return tokenizer, model

    return load(local_only=True) if Path(source).is_dir() else _local_first(load)


T = TypeVar("T")


def _local_first(load: Callable[[bool], T]) -> T:
    """`load(local_only)` from the local cache first, from the hub only when it answers."""
    try:
        return load(True)
    except OSError:
        if not _hub_reachable():
            raise OSError("it is not in the local cache and the Hugging Face hub is unreachable") from None
        return load(False)


def load_model(
    name: str = EMBEDDED_MODEL,
    *,
    revision: str | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    device_map: str | None = None,
) -> LoadedModel:
    """Load `name`: "smollm2" (the embedded model), a `.gguf` file, a local folder, or a Hugging
    Face id. Defaults: bfloat16 on GPU, float32 on CPU; `device_map="auto"` spreads a model too
    large for one GPU over several (then `device` is where inputs go: the first layer's device)."""
    import torch  # torch loads only with a model (`ctd --help` and the dry checks skip it)
    from transformers.utils import logging as hf_logging

    from ._dist import process_state  # accelerate imports torch

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if device is None:
        # Under `accelerate launch` each process owns one GPU (cuda:rank); alone, the GPU or the CPU.
        device = process_state().device
    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)

    kind, path = _locate(name)
    if kind == "gguf":
        digest = file_sha256(path)
        source, identity = str(_converted_gguf(path, digest, torch.float32)), f"gguf:{digest}"
        load_revision = None
    elif kind == "folder":
        source, identity, load_revision = str(path), _folder_identity(path), None
    else:
        source, identity, load_revision = name, f"hub:{name}", revision

    # On a GPU the weights load straight onto it; by way of the CPU (load, then `.to`) a 1B model's
    # took seconds more of `ctd eval`'s wall time with the GPU idle (issue 25).
    placement = device_map if device_map is not None or device.type != "cuda" else str(device)
    try:
        tokenizer, model = _from_pretrained(source, load_revision, dtype, placement)
    except OSError as error:
        raise ProbeError(
            f"--model {name}: not found locally and could not be fetched: {_one_line(error)}"
        ) from None
    except Exception as error:
        raise ProbeError(f"--model {name}: transformers cannot load it ({_one_line(error)})") from None
    if identity.startswith("hub:"):
        identity += "@" + str(getattr(model.config, "_commit_hash", None) or revision or "unknown")
    if placement is None:
        model.to(device)
    else:  # the first layer's device: where inputs go
        device = next(model.parameters()).device
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = model.config
    return LoadedModel(
        name=name,
        identity=identity,
        model=model,
        tokenizer=tokenizer,
        n_layers=int(config.num_hidden_layers),
        hidden_size=int(config.hidden_size),
        dtype=dtype,
        device=device,
    )
