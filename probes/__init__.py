"""The probe stage of ctd-harness: load the monitored model (a Hugging Face id, a folder or a GGUF
file), extract one layer's token activations into a float16 memory-mapped store, and train the
safety and delegation-value probes (attention, softmax, mean, mlp) on them.

Knows nothing of experts or of the harness; the hand-off is files (the store) and arrays.
"""

from ._build import Probe
from ._config import ARCHS, TASKS, Arch, ProbeConfig, Task
from ._dist import process_state
from ._errors import ProbeError
from ._extract import Conversation, ExtractStats, extract, layer_activations
from ._model import EMBEDDED_MODEL, LoadedModel, ModelInfo, describe_model, load_model, resolve_layer
from ._ragged import Ragged
from ._store import ActivationStore, StoreKey
from ._train import EpochLog, TrainResult, predict, train_probe

__all__ = [
    "ARCHS",
    "EMBEDDED_MODEL",
    "TASKS",
    "ActivationStore",
    "Arch",
    "Conversation",
    "EpochLog",
    "ExtractStats",
    "LoadedModel",
    "ModelInfo",
    "Probe",
    "ProbeConfig",
    "ProbeError",
    "Ragged",
    "StoreKey",
    "Task",
    "TrainResult",
    "describe_model",
    "extract",
    "layer_activations",
    "load_model",
    "predict",
    "process_state",
    "resolve_layer",
    "train_probe",
]
