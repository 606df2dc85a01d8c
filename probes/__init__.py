"""The probe stage of ctd-harness: load the monitored model (a Hugging Face id, a folder or a GGUF
file), extract one layer's token activations into a float16 memory-mapped store, and train the
safety and delegation-value probes (attention, softmax, mean, mlp) on them.

Knows nothing of experts or of the harness; the hand-off is files (the store) and arrays.

The names below are imported on first use (PEP 562): `from probes import ARCHS, ProbeConfig`
costs no torch, so a command line that only declares its options starts at once; torch loads
with the first name that needs it (`extract`, `train_probe`, `load_model`, ...).
"""

from __future__ import annotations

import importlib
import os

# Training runs under torch.use_deterministic_algorithms(True), which on CUDA refuses cuBLAS calls
# unless cuBLAS keeps a fixed workspace per stream (its one source of run-to-run differences). The
# variable is read when cuBLAS first starts in the process, i.e. at the monitored model's first
# matrix product, before any probe trains: so it is set here, on the way into this package, which
# loads that model. A value the user set is kept. 8 workspaces of 4 MiB: 32 MiB of GPU memory.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

# Every public name and the module that defines it: the one list of this package's API.
_EXPORTS: dict[str, str] = {
    "ARCHS": "._config",
    "ARTIFACT_VERSION": "._artifact",
    "BATCH_TOKENS": "._config",
    "EMBEDDED_MODEL": "._embedded",
    "MAX_BATCH_TOKENS": "._config",
    "MODEL_CACHE_ENV": "._embedded",
    "TASKS": "._config",
    "ActivationStore": "._store",
    "Arch": "._config",
    "Conversation": "._extract",
    "EpochLog": "._train",
    "ExtractStats": "._extract",
    "LoadedModel": "._model",
    "ModelInfo": "._model",
    "Probe": "._build",
    "ProbeArtifact": "._artifact",
    "ProbeConfig": "._config",
    "ProbeError": "._errors",
    "RejectedExample": "._errors",
    "Ragged": "._ragged",
    "StoreKey": "._store",
    "Task": "._config",
    "TrainResult": "._train",
    "bucket_batches": "._extract",
    "default_device": "._device",
    "device_answers": "._device",
    "release_device_memory": "._device",
    "describe_model": "._model",
    "embedded_gguf": "._embedded",
    "gguf_as_folder": "._model",
    "identity_matches": "._model",
    "is_legacy_identity": "._model",
    "extract": "._extract",
    "layer_activations": "._extract",
    "load_model": "._model",
    "load_probe": "._artifact",
    "model_cache_root": "._embedded",
    "pad_batch": "._extract",
    "predict": "._train",
    "process_state": "._dist",
    "read_artifact": "._artifact",
    "resolve_layer": "._model",
    "save_probe": "._artifact",
    "tokenize": "._extract",
    "encode": "._extract",
    "render_each": "._extract",
    "train_probe": "._train",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
