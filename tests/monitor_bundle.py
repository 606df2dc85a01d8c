"""A real monitor bundle in seconds, without a `ctd eval`: two freshly initialised `mean` probes over
the embedded model's layer 2 (its real identity and chat-template hash, saved by probes' own
`save_probe`) and a bundle.json that `read_bundle` accepts. Its scores are not trained ones, but
every part of `Monitor.load` and `ctd monitor serve` runs for real: the model, the probes, the
micro-batched forward pass, the decision log.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from harness.monitor import BUNDLE_VERSION
from harness.run import BundleLayout, file_sha256
from probes import ProbeArtifact, ProbeConfig, describe_model, model_cache_root, save_probe

# Private: a probe built without training.
from probes._build import build_probe

LAYER = 2  # a shallow layer: the truncated forward pass stops there, so a check is cheap
MAX_TOKENS = 128


def _template_hash(source: Path) -> str:
    """LoadedModel.template_hash of the model folder `source`, from its tokenizer alone."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source))
    return hashlib.sha256((tokenizer.chat_template or "").encode()).hexdigest()[:16]


def write_untrained_bundle(
    folder: Path,
    *,
    model: str = "smollm2",
    threshold: float = 0.5,
    expert: bool = False,
    dtype: str | None = None,
) -> Path:
    """The bundle folder `folder` (created): budget mode at alpha 0.5, delegate when DV > threshold.
    `model` is the embedded model or a model folder (e.g. random weights of another shape), recorded
    as the probes' model. `expert`: an expert entry that `--expert-url` can point anywhere (else
    serve with --no-expert)."""

    info = describe_model(model)
    if model == "smollm2":
        source = model_cache_root() / f"gguf-{info.identity.removeprefix('gguf:')[:24]}"
    else:
        source = Path(model)
    template_hash = _template_hash(source)
    dim = int(info.config.hidden_size)
    layout = BundleLayout(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    for stem, task in ((layout.safety_probe, "safety"), (layout.dv_probe, "dv")):
        config = ProbeConfig(arch="mean")
        artifact = ProbeArtifact(
            task=task,
            config=config,
            dim=dim,
            model=model,
            model_identity=info.identity,
            layer=LAYER,
            max_tokens=MAX_TOKENS,
            template="",
            template_hash=template_hash,
            seed=0,
            dtype=dtype,
        )
        save_probe(stem, build_probe(config, dim), artifact)
    # Without an expert entry, served with --no-expert: never read.
    entry = {"name": "stand-in", "base_urls": ["http://127.0.0.1:9/v1"], "model": "stand-in"}
    record = stand_in_record(run=str(folder.parent), threshold=threshold, expert=entry if expert else {})
    layout.record.write_text(json.dumps(record))
    seal(folder)
    return folder


def stand_in_record(**changes: Any) -> dict[str, Any]:
    """Every key `ctd monitor calibrate` writes in bundle.json (the record is typed:
    `BundleRecord`), with `changes` on top: budget mode at alpha 0.5. What was certified is a
    stand-in: no scores table, no candidates, no calibration examples (`seal` hashes the probes)."""
    record: dict[str, Any] = {
        "version": BUNDLE_VERSION,
        "run": "/nowhere",
        "created": "2026-01-01T00:00:00+00:00",
        "policy": "ctd",
        "signal": "dv",
        "merge": "overwrite",
        "mode": "budget",
        "alpha": 0.5,
        "delta": 0.1,
        "objective": "auroc",
        "test_order": "est_budget",
        "selection": "est_objective",
        "threshold": 0.5,
        "arch": "mean",
        "dv_target": "continuous",
        "seed": 0,
        "split_seed": 0,
        "n_test": 0,
        "est_budget": None,
        "est_error": None,
        "expert": {},
        "ltt": {},
        "candidates": {"thresholds": [], "est_budget": [], "est_objective": []},
        "sources": {
            "scores": {"path": "scores.parquet", "sha256": "0" * 64},  # no scores table: never audited
            **{part: {"path": part, "safetensors": "0" * 64, "json": "0" * 64} for part in ("safety", "dv")},
        },
        "cal_ids": [],
        "est_ids": [],
    }
    return record | changes


def seal(folder: Path) -> None:
    """Record the sha256 of the bundle's probe files as they are now (bundle.json's `sources`),
    as `ctd monitor calibrate` does, after a test changed one on purpose."""
    layout = BundleLayout(folder)
    record = json.loads(layout.record.read_text())
    record["sources"] = {
        "scores": {"path": "scores.parquet", "sha256": "0" * 64},  # no scores table: never audited
        **{
            part: {
                "path": stem.name,
                **{suffix: file_sha256(stem.with_suffix(f".{suffix}")) for suffix in ("safetensors", "json")},
            }
            for part, stem in (("safety", layout.safety_probe), ("dv", layout.dv_probe))
        },
    }
    layout.record.write_text(json.dumps(record))
