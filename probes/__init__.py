"""The probe stage of ctd-harness: load the monitored model (a Hugging Face id, a folder or a GGUF
file), extract one layer's token activations into a float16 memory-mapped store, and train the
safety and delegation-value probes (attention, softmax, mean, mlp) on them.

Knows nothing of experts or of the harness; the hand-off is files (the store) and arrays.
"""

from ._artifact import ARTIFACT_VERSION, ProbeArtifact, load_probe, read_artifact, save_probe
from ._build import Probe, build_probe
from ._config import ARCHS, TASKS, Arch, ProbeConfig, Task
from ._dist import process_state
from ._errors import ProbeError
from ._extract import (
    Conversation,
    ExtractStats,
    bucket_batches,
    extract,
    layer_activations,
    pad_batch,
    render,
    tokenize,
)
from ._model import (
    EMBEDDED_MODEL,
    LoadedModel,
    ModelInfo,
    default_layer,
    describe_model,
    embedded_gguf,
    load_model,
    resolve_layer,
)
from ._ragged import Ragged
from ._store import ActivationStore, Plan, StoreKey
from ._train import EpochLog, TrainResult, predict, train_probe

__all__ = [
    "ARCHS",
    "ARTIFACT_VERSION",
    "EMBEDDED_MODEL",
    "TASKS",
    "ActivationStore",
    "Arch",
    "Conversation",
    "EpochLog",
    "ExtractStats",
    "LoadedModel",
    "ModelInfo",
    "Plan",
    "Probe",
    "ProbeArtifact",
    "ProbeConfig",
    "ProbeError",
    "Ragged",
    "StoreKey",
    "Task",
    "TrainResult",
    "bucket_batches",
    "build_probe",
    "default_layer",
    "describe_model",
    "embedded_gguf",
    "extract",
    "layer_activations",
    "load_model",
    "load_probe",
    "pad_batch",
    "predict",
    "process_state",
    "read_artifact",
    "render",
    "resolve_layer",
    "save_probe",
    "tokenize",
    "train_probe",
]
