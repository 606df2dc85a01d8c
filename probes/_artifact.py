"""A trained probe on disk: its weights (safetensors, standardisation buffers included) and a JSON
sidecar saying what it reads (model identity, layer, chat template, token limit) and how it did, so
that a run's probes can be reloaded and applied to new text without retraining.

A probe saved as `STEM` is the pair `STEM.safetensors` and `STEM.json`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from ._build import build_probe
from ._config import TASKS, ProbeConfig, Task
from ._errors import ProbeError

__all__ = ["ARTIFACT_VERSION", "ProbeArtifact", "load_probe", "read_artifact", "save_probe"]

ARTIFACT_VERSION = 1
ACTIVATION_DTYPES = ("float32", "bfloat16", "float16")  # torch's names of the dtypes a model loads in


@dataclass(frozen=True, kw_only=True)
class ProbeArtifact:
    """What a saved probe reads and how it was trained. `template` is the chat template text ("" for
    plain "role: content" rendering); `template_hash` is `LoadedModel.template_hash` of the model it
    was trained on, so a mismatch at load time is caught before any score is computed; `dtype` is
    the model's dtype then, so that the probe is applied to activations computed as it was trained."""

    task: Task
    config: ProbeConfig
    dim: int
    model: str  # what --model named ("smollm2", a path, a hub id)
    model_identity: str  # LoadedModel.identity: the exact weights
    layer: int
    max_tokens: int
    template: str
    template_hash: str
    seed: int
    metrics: dict[str, Any] = field(default_factory=dict)
    # The model's dtype when the activations were extracted ("bfloat16" on a GPU): scores from
    # another dtype are not those calibrated. None in records written before it was kept.
    dtype: str | None = None
    version: int = ARTIFACT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "config": asdict(self.config)}

    @classmethod
    def from_json(cls, record: dict[str, Any], source: str) -> ProbeArtifact:
        try:
            if record.get("version") != ARTIFACT_VERSION:
                raise ValueError(f"version {record.get('version')!r}, expected {ARTIFACT_VERSION}")
            if record.get("task") not in TASKS:
                raise ValueError(f"task {record.get('task')!r}")
            if record.get("dtype") not in (None, *ACTIVATION_DTYPES):
                raise ValueError(f"dtype {record.get('dtype')!r}")
            return cls(**{**record, "config": ProbeConfig(**record["config"])})
        except (TypeError, ValueError, KeyError) as error:
            raise ProbeError(f"{source}: not a probe record this version reads ({error})") from None


def save_probe(stem: Path, probe: nn.Module, artifact: ProbeArtifact) -> None:
    """Write `stem`.safetensors and `stem`.json (each through a temporary name, so that a crash never
    leaves half a file under the final name)."""
    from safetensors.torch import save_file

    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    weights, record = stem.with_suffix(".safetensors"), stem.with_suffix(".json")
    tensors = {name: t.detach().cpu().contiguous() for name, t in probe.state_dict().items()}
    # One metadata key: safetensors writes its metadata map in an order that changes from call to
    # call, and the same probe must save to the same bytes (manifests and bundles hash the file).
    # The JSON sidecar is the record; this only labels the weights for other tools.
    label = json.dumps({"arch": artifact.config.arch, "task": artifact.task}, sort_keys=True)
    save_file(tensors, str(weights) + ".tmp", metadata={"ctd": label})
    os.replace(str(weights) + ".tmp", weights)
    record.with_name(record.name + ".tmp").write_text(json.dumps(artifact.to_json(), indent=2) + "\n")
    os.replace(record.with_name(record.name + ".tmp"), record)


def read_artifact(stem: Path) -> ProbeArtifact:
    """The record of the probe saved at `stem` (its JSON sidecar only; no weights are read)."""
    record = Path(stem).with_suffix(".json")
    if not record.is_file():
        raise ProbeError(f"{record}: missing (a saved probe is a .safetensors and .json pair)")
    try:
        return ProbeArtifact.from_json(json.loads(record.read_text()), str(record))
    except json.JSONDecodeError as error:
        raise ProbeError(f"{record}: line {error.lineno}: not JSON ({error.msg})") from None


def load_probe(stem: Path) -> tuple[nn.Module, ProbeArtifact]:
    """The probe saved at `stem` in eval mode, and its record; a missing or inconsistent pair is a
    ProbeError naming the file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    artifact = read_artifact(stem)
    weights = Path(stem).with_suffix(".safetensors")
    if not weights.is_file():
        raise ProbeError(f"{weights}: missing (a saved probe is a .safetensors and .json pair)")
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError) as error:
        raise ProbeError(f"{weights}: not a safetensors file ({error})") from None
    probe = build_probe(artifact.config, artifact.dim)
    try:
        probe.load_state_dict(tensors, strict=True)
    except RuntimeError as error:
        first = str(error).strip().splitlines()[0]
        raise ProbeError(f"{weights}: weights do not fit a {artifact.config.arch} probe ({first})") from None
    probe.eval()
    return probe, artifact
