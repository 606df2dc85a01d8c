"""A trained probe saved with `probes.save_probe` and read back with `load_probe` scores exactly as
it did before saving, for every architecture; a damaged pair is one ProbeError naming the file."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from probes import (
    ARCHS,
    ProbeArtifact,
    ProbeConfig,
    ProbeError,
    Ragged,
    load_probe,
    predict,
    save_probe,
    train_probe,
)


def _data(n: int = 40, dim: int = 8, seed: int = 0) -> tuple[Ragged, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 2
    examples = [rng.normal(size=(3 + i % 5, dim)) + labels[i] for i in range(n)]
    return Ragged.from_arrays(examples), labels


def _artifact(config: ProbeConfig, dim: int) -> ProbeArtifact:
    return ProbeArtifact(
        task="safety",
        config=config,
        dim=dim,
        model="smollm2",
        model_identity="gguf:abc",
        layer=20,
        max_tokens=96,
        template="{{ messages }}",
        template_hash="0123",
        seed=3,
        metrics={"test_auroc": 0.9},
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_saved_probe_scores_exactly_as_the_trained_one(tmp_path: Path, arch: str) -> None:
    acts, labels = _data()
    config = ProbeConfig(arch=arch, epochs=3)
    result = train_probe(acts, labels, task="safety", config=config, seed=3)
    save_probe(tmp_path / "p" / "probe", result.probe, _artifact(config, acts.dim))
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["probe.json", "probe.safetensors"]
    probe, record = load_probe(tmp_path / "p" / "probe")
    assert record == _artifact(config, acts.dim)
    np.testing.assert_array_equal(
        predict(probe, acts, task="safety"), predict(result.probe, acts, task="safety")
    )


def test_the_same_probe_saves_to_the_same_bytes(tmp_path: Path) -> None:
    # A manifest and a bundle's `sources` hash the probe files: the same probe must give the same
    # hash. safetensors writes its metadata map in a random order that changes from call to call
    # (two keys came out either way round), so twenty saves agree only when the order is fixed.
    acts, labels = _data()
    config = ProbeConfig(arch="attention", epochs=1)
    result = train_probe(acts, labels, task="safety", config=config, seed=3)
    saved = set()
    for _ in range(20):
        save_probe(tmp_path / "probe", result.probe, _artifact(config, acts.dim))
        saved.add((tmp_path / "probe.safetensors").read_bytes())
    assert len(saved) == 1


def test_damaged_or_mismatched_probe_is_one_error_naming_the_file(tmp_path: Path) -> None:
    acts, labels = _data()
    config = ProbeConfig(arch="mean", epochs=2)
    result = train_probe(acts, labels, task="safety", config=config, seed=0)
    stem = tmp_path / "probe"
    save_probe(stem, result.probe, _artifact(config, acts.dim))

    record = json.loads(stem.with_suffix(".json").read_text())
    stem.with_suffix(".json").write_text(json.dumps({**record, "dim": acts.dim + 1}))
    with pytest.raises(ProbeError, match=r"probe\.safetensors: weights do not fit a mean probe"):
        load_probe(stem)

    stem.with_suffix(".json").write_text(json.dumps({**record, "version": 99}))
    with pytest.raises(ProbeError, match=r"probe\.json: not a probe record this version reads"):
        load_probe(stem)

    stem.with_suffix(".json").write_text(json.dumps({**record, "dtype": "int8"}))
    with pytest.raises(
        ProbeError, match=r"probe\.json: not a probe record this version reads \(dtype 'int8'\)"
    ):
        load_probe(stem)

    stem.with_suffix(".json").write_text(json.dumps(record))
    stem.with_suffix(".safetensors").write_bytes(b"not weights")
    with pytest.raises(ProbeError, match=r"probe\.safetensors: not a safetensors file"):
        load_probe(stem)

    stem.with_suffix(".safetensors").unlink()
    with pytest.raises(ProbeError, match=r"probe\.safetensors: missing"):
        load_probe(stem)


def _named_templates_model(folder: Path, order: tuple[str, ...]) -> Path:
    """A copy of the embedded model whose tokenizer_config.json holds named chat templates (a list
    of {name, template}, as some hub models ship), listed in `order`."""
    import shutil

    # Private: the converted embedded model's cache folder, copied to add named templates.
    from probes._model import embedded_gguf, file_sha256, model_cache_root

    source = model_cache_root() / f"gguf-{file_sha256(embedded_gguf())[:24]}"
    if not (source / "model.safetensors").is_file():
        from probes import load_model

        load_model()  # converts the GGUF into that folder
    shutil.copytree(source, folder)
    default = (folder / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").unlink()
    templates = {"default": default, "tool_use": "{{ messages[0]['content'] }}"}
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": name, "template": templates[name]} for name in order]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_named_chat_templates_hash_and_record(tmp_path: Path) -> None:
    from probes import load_model, read_artifact

    first = load_model(str(_named_templates_model(tmp_path / "a", ("default", "tool_use"))))
    assert isinstance(first.tokenizer.chat_template, dict)  # how transformers loads the list
    second = load_model(str(_named_templates_model(tmp_path / "b", ("tool_use", "default"))))
    # the same templates hash the same, whatever order the file lists them in
    assert first.template_hash == second.template_hash and len(first.template_hash) == 16
    assert json.loads(first.template_text)["tool_use"] == "{{ messages[0]['content'] }}"
    acts, labels = _data()
    config = ProbeConfig(arch="mean", epochs=1)
    result = train_probe(acts, labels, task="safety", config=config, seed=3)
    artifact = replace(_artifact(config, acts.dim), template=first.template_text)
    save_probe(tmp_path / "p" / "probe", result.probe, artifact)  # a JSON sidecar
    assert read_artifact(tmp_path / "p" / "probe").template == first.template_text
