"""Extraction on the embedded model against a plain transformers forward pass, bucketing, and the
activation store (exact round trip, shards joined, resume after an interruption, reuse)."""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest
import torch

import experts
import probes
from probes import (
    ActivationStore,
    ExtractStats,
    LoadedModel,
    ProbeError,
    StoreKey,
    describe_model,
    embedded_gguf,
    extract,
    layer_activations,
    load_model,
    model_cache_root,
    resolve_layer,
)

# Private: tokenising, padding, bucketing, the store's plan and the model files, unit-tested.
from probes._extract import _pad, bucket_batches, tokenize

# Private: the file hash a model identity is made of.
from probes._model import file_sha256
from probes._store import Plan

CONVERSATIONS = [
    "hello there",
    [
        {"role": "user", "content": "How do I kill the process that hangs my build?"},
        {"role": "assistant", "content": "Find its id with ps, then send it SIGTERM."},
    ],
    "My chest has hurt for an hour and my left arm is numb. " * 3,
    [{"role": "system", "content": "Tools: transfer(amount, to)."}, {"role": "user", "content": "Pay rent."}],
    "word " * 200,  # longer than the token limit below
    "ok",
]


@pytest.fixture(scope="module")
def embedded() -> LoadedModel:
    return load_model()


def reference(model: LoadedModel, ids: list[list[int]], layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden_states[layer] of a whole-model transformers forward pass with output_hidden_states."""
    input_ids, mask = _pad(ids, model.tokenizer.pad_token_id, model.device)
    base = model.model.model
    with torch.no_grad():
        out = base(input_ids=input_ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    assert len(out.hidden_states) == model.n_layers + 1
    return out.hidden_states[layer], mask.bool()


@pytest.mark.parametrize("layer", [1, 20, 30])
def test_truncated_forward_matches_output_hidden_states(embedded: LoadedModel, layer: int) -> None:
    ids, _ = tokenize(embedded.tokenizer, CONVERSATIONS, max_tokens=96)
    input_ids, mask = _pad(ids, embedded.tokenizer.pad_token_id, embedded.device)
    ours = layer_activations(embedded, layer, input_ids, mask)
    ref, real = reference(embedded, ids, layer)
    assert ours.dtype == torch.float32
    assert (ours - ref)[real].abs().max().item() < 1e-4  # padded batch
    if layer != 20:
        return  # unpadded batches: checked at the default layer
    for i, tokens in enumerate(ids):  # each example alone: no padding at all
        single_ids, single_mask = _pad([tokens], embedded.tokenizer.pad_token_id, embedded.device)
        alone = layer_activations(embedded, layer, single_ids, single_mask)[0]
        single_ref, _ = reference(embedded, [tokens], layer)
        assert (alone - single_ref[0]).abs().max().item() < 1e-4
        # Padding changes nothing beyond float32 summation order (activations reach ~2.5e4 here).
        scale = single_ref.abs().max().item()
        assert (alone - ref[i, : len(tokens)]).abs().max().item() < 1e-5 * scale


def test_default_layer_and_range(embedded: LoadedModel) -> None:
    assert embedded.n_layers == 30 and embedded.hidden_size == 576
    assert resolve_layer(None, embedded.n_layers, embedded.model.config) == 20  # two thirds of 30
    llama_1b = type("Config", (), {"model_type": "llama", "num_hidden_layers": 16, "hidden_size": 2048})
    assert resolve_layer(None, 16, llama_1b) == 11
    for bad in (0, 31, -1):
        with pytest.raises(ProbeError, match=rf"--layer {bad}: the model has 30 layers"):
            resolve_layer(bad, 30, embedded.model.config)


def test_chat_template_and_truncation(embedded: LoadedModel) -> None:
    ids, truncated = tokenize(embedded.tokenizer, CONVERSATIONS, max_tokens=64)
    assert truncated == 2  # the repeated chest-pain text and the 200 words
    assert max(len(t) for t in ids) == 64
    text = embedded.tokenizer.decode(ids[1])
    assert "<|im_start|>user" in text and "<|im_start|>assistant" in text and "SIGTERM" in text


def test_a_conversation_is_one_type_in_probes_and_experts() -> None:
    """The libraries import nothing of each other, so each spells `Conversation`; the harness hands
    one value to both (the monitored model's activations and the expert's prompt)."""
    assert probes.Conversation == experts.Conversation
    assert repr(probes.Conversation) == repr(experts.Conversation)
    assert typing.get_args(probes.Conversation) == (str, Sequence[Mapping[str, str]])


def test_messages_in_any_read_only_sequence_tokenize_as_the_list(embedded: LoadedModel) -> None:
    messages = CONVERSATIONS[1]
    read_only = tuple(MappingProxyType(message) for message in messages)
    assert tokenize(embedded.tokenizer, [read_only], 64) == tokenize(embedded.tokenizer, [messages], 64)


def test_bucketing_bounds_padding_and_batch_tokens() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 400, size=2000)
    batches = bucket_batches(lengths, batch_tokens=4096, max_batch=64)
    assert sorted(i for b in batches for i in b) == list(range(2000))
    padded = sum(len(b) * lengths[list(b)].max() for b in batches)
    assert all(len(b) * lengths[list(b)].max() <= 4096 and len(b) <= 64 for b in batches)
    assert 1 - lengths.sum() / padded < 0.10


def test_extraction_store_round_trip_and_reuse(embedded: LoadedModel, tmp_path) -> None:
    def run(layer: int = 20) -> tuple[ActivationStore, ExtractStats]:
        return extract(
            embedded,
            CONVERSATIONS,
            layer=layer,
            max_tokens=96,
            data_hash="d1",
            store_root=tmp_path,
            batch_tokens=200,
        )

    store, stats = run()
    assert store.is_complete and stats.extracted_batches == stats.batches > 1
    ragged = store.read()
    ids, _ = tokenize(embedded.tokenizer, CONVERSATIONS, max_tokens=96)
    ref, _ = reference(embedded, ids, 20)
    for i, tokens in enumerate(ids):
        stored = ragged.example(i)
        assert stored.dtype == np.float16 and stored.shape == (len(tokens), 576)
        # float16 storage of float32 activations (computed in other batches): equal to float16 precision
        np.testing.assert_allclose(
            stored.astype(np.float32), ref[i, : len(tokens)].numpy(), rtol=1e-3, atol=1e-3
        )
    again, stats2 = run()
    assert again.folder == store.folder and stats2.extracted_batches == 0
    other, _ = run(layer=19)
    assert other.folder != store.folder  # the layer is part of the key


def test_interrupted_extraction_resumes_from_last_commit(embedded: LoadedModel, tmp_path) -> None:
    options = dict(layer=20, max_tokens=96, data_hash="d2", batch_tokens=120)
    seen: list[int] = []

    def interrupt(done: int, total: int) -> None:
        seen.append(done)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract(embedded, CONVERSATIONS, store_root=tmp_path / "a", on_batch=interrupt, **options)
    (folder,) = (p for p in (tmp_path / "a").iterdir() if p.is_dir())  # beside it: its lock file
    key = StoreKey(**json.loads((folder / "key.json").read_text()))
    assert not ActivationStore(folder, key).is_complete
    store, stats = extract(embedded, CONVERSATIONS, store_root=tmp_path / "a", **options)
    assert stats.extracted_batches == stats.batches - 2  # the two committed batches are not redone
    fresh, _ = extract(embedded, CONVERSATIONS, store_root=tmp_path / "b", **options)
    resumed, clean = store.read(), fresh.read()
    for i in range(len(CONVERSATIONS)):
        assert np.array_equal(resumed.example(i), clean.example(i))


def test_store_joins_shards_of_several_processes(tmp_path) -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 30, size=50)
    vectors = [rng.standard_normal((n, 8)).astype(np.float16) for n in lengths]
    plan = Plan(lengths.astype(np.int64), bucket_batches(lengths, 64, 8), 8)
    key = StoreKey(model="m", layer=1, template="t", max_tokens=30, dtype="float32", data="x")
    store = ActivationStore.open(tmp_path, key)
    store.start(plan)
    interrupted = store.shard_writer(0, 2)  # a two-process run that stopped after one batch
    first = interrupted.todo[0]
    interrupted.write(first, np.concatenate([vectors[i] for i in plan.batches[first]]))
    interrupted.commit()
    world = 3  # resumed with three processes
    for rank in range(world):  # what each process of `accelerate launch` does
        writer = store.shard_writer(rank, world)
        for b in writer.todo:
            writer.write(b, np.concatenate([vectors[i] for i in plan.batches[b]]))
        writer.commit()
    store.join(world)
    ragged = store.read()
    assert len(ragged.shards) == 3
    left = sorted(p.name for p in store.folder.iterdir() if p.name.startswith(("shard-", "progress-")))
    expected = [f"progress-{r}-of-3.json" for r in range(3)] + [f"shard-{r}-of-3.f16" for r in range(3)]
    assert left == expected  # the two-process run's files are gone
    for i in range(50):
        assert np.array_equal(ragged.example(i), vectors[i])


def test_a_shard_cut_short_makes_the_store_incomplete_and_only_it_is_redone(tmp_path) -> None:
    """A store marked complete whose shard lost its tail (a disk that filled, a copy that stopped)
    reads as one line naming the shard, is no longer complete, and the next extraction redoes only
    that shard's batches; until its join the store stays incomplete."""
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 20, size=30).astype(np.int64)
    vectors = [rng.standard_normal((n, 8)).astype(np.float16) for n in lengths]
    plan = Plan(lengths, bucket_batches(lengths, 48, 8), 8)
    store = ActivationStore.open(
        tmp_path, StoreKey(model="m", layer=1, template="t", max_tokens=20, dtype="f", data="z")
    )

    def extract_all(world: int) -> dict[int, list[int]]:
        store.start(plan)
        redone = {}
        for rank in range(world):
            writer = store.shard_writer(rank, world)
            redone[rank] = writer.todo
            for b in writer.todo:
                writer.write(b, np.concatenate([vectors[i] for i in plan.batches[b]]))
            writer.commit()
        return redone

    extract_all(3)
    store.join(3)
    assert store.is_complete
    shard = store.folder / "shard-1-of-3.f16"
    with shard.open("r+b") as handle:
        handle.truncate(shard.stat().st_size - 2 * 8)  # one row short
    assert not store.is_complete
    with pytest.raises(ProbeError, match=r"damaged \(shard-1-of-3\.f16 holds \d+ of its \d+ rows\); rerun"):
        store.read()
    store.start(plan)
    killed = store.shard_writer(1, 3)  # a redo killed after its first batch: the shard has its size
    first = killed.todo[0]
    killed.write(first, np.concatenate([vectors[i] for i in plan.batches[first]]))
    killed.commit()
    assert shard.stat().st_size == plan.rank_layout(1, 3)[1] * 2 * 8
    assert not store.is_complete  # yet the store is not complete before its join
    redone = extract_all(3)
    assert redone == {0: [], 1: plan.rank_batches(1, 3)[1:], 2: []}
    store.join(3)
    ragged = store.read()
    for i in range(len(lengths)):
        assert np.array_equal(ragged.example(i), vectors[i])


def test_join_refuses_unfinished_shards(tmp_path) -> None:
    lengths = np.array([3, 4, 5], dtype=np.int64)
    plan = Plan(lengths, ((0,), (1,), (2,)), 4)
    store = ActivationStore.open(
        tmp_path, StoreKey(model="m", layer=1, template="t", max_tokens=9, dtype="f", data="y")
    )
    store.start(plan)
    writer = store.shard_writer(0, 1)
    writer.write(0, np.zeros((3, 4), np.float16))
    writer.commit()
    with pytest.raises(ProbeError, match="2 unfinished batches"):
        store.join(1)
    assert not store.is_complete
    with pytest.raises(ProbeError, match="incomplete"):
        store.read()


def test_describe_model_agrees_with_load_model(embedded: LoadedModel, monkeypatch) -> None:
    """The identity and depth a run fingerprints before loading equal those of the loaded model,
    for the embedded GGUF and for a plain model folder (the GGUF's converted weights)."""
    info = describe_model()
    assert (info.identity, info.n_layers) == (embedded.identity, embedded.n_layers)
    assert info.identity.startswith("gguf:")
    folder = model_cache_root() / f"gguf-{file_sha256(embedded_gguf())[:24]}"
    loaded, described = load_model(str(folder)), describe_model(str(folder))
    assert described.identity == loaded.identity == f"folder:sha256:{described.identity[-64:]}"
    assert described.n_layers == loaded.n_layers == 30
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ProbeError, match=r"not found locally and could not be fetched.*unreachable"):
        describe_model("nobody/no-such-model-xyz")


def test_bad_models_fail_in_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF" + b"\0" * 64)
    folder = tmp_path / "empty-folder"
    folder.mkdir()
    cases = {
        "nobody/no-such-model-xyz": "not found locally and could not be fetched",
        str(junk): "not a GGUF model file",
        str(truncated): "not a model transformers can load",
        str(folder): "not a model folder",
        str(tmp_path / "missing"): "no such file or folder",
    }
    for name, message in cases.items():
        with pytest.raises(ProbeError, match=message) as caught:
            load_model(name)
        assert "\n" not in str(caught.value)


def test_ctd_probe_bad_input_is_one_line(tmp_path) -> None:
    from ctd_cli import assert_one_line_error, run_ctd

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\0" * 64)
    env = {"HF_HUB_OFFLINE": "1", "CTD_STORE": str(tmp_path / "store")}
    out = str(tmp_path / "out")
    cases = [
        (["--model", "nobody/no-such-model-xyz"], ["nobody/no-such-model-xyz", "could not be fetched"]),
        (["--model", str(junk)], [str(junk), "not a model"]),
        (["--layer", "31"], ["--layer 31", "30 layers"]),
        (["--arch", "lstm"], ["--arch", "lstm"]),
        (["--data", f"train={tmp_path / 'none.jsonl'}"], ["none.jsonl"]),
    ]
    for args, fragments in cases:
        assert_one_line_error(run_ctd("probe", "--out", out, *args, cwd=tmp_path, env=env), *fragments)
    assert not (tmp_path / "out").exists()
    assert not list((tmp_path / "store").glob("*/complete.json"))


def test_two_processes_write_their_own_shards_and_match_one_process(tmp_path) -> None:
    """`torchrun --nproc_per_node 2` (gloo on CPU; `accelerate launch` on GPUs does the same):
    each process extracts every second batch into its own shard, the main process joins them,
    and the activations and probe scores equal a single process's bit for bit."""
    import subprocess
    import sys

    from harness.data.builtin import builtin_dir

    data = []
    for split, size in (("train", 24), ("dev", 12), ("test", 12)):
        rows = (builtin_dir() / f"{split}.jsonl").read_text().splitlines()
        chosen = rows[: size // 2] + rows[-(size // 2) :]  # both labels: files are grouped by label
        (tmp_path / f"{split}.jsonl").write_text("\n".join(chosen) + "\n")
        data += ["--data", f"{split}={tmp_path / f'{split}.jsonl'}"]
    common = ["probe", *data, "--seeds", "0", "--epochs", "3", "--max-tokens", "64", "--batch-tokens", "256"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    alone = [sys.executable, "-m", "harness.cli"]
    single = subprocess.run(
        [*alone, *common, "--out", str(tmp_path / "one"), "--store", str(tmp_path / "s1")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "harness.cli"]
    double = subprocess.run(
        [*launch, *common, "--out", str(tmp_path / "two"), "--store", str(tmp_path / "s2")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert double.returncode == 0, double.stderr
    assert double.stdout.count("safety probes") == 1  # only the main process goes on after extraction

    def stores(root: Path) -> dict[str, ActivationStore]:
        out = {}
        for folder in (p for p in root.iterdir() if p.is_dir()):
            out[folder.name] = ActivationStore(
                folder, StoreKey(**json.loads((folder / "key.json").read_text()))
            )
        return out

    one, two = stores(tmp_path / "s1"), stores(tmp_path / "s2")
    assert sorted(one) == sorted(two) and len(one) == 3
    for name in one:
        assert sorted(p.name for p in two[name].folder.glob("shard-*")) == [
            "shard-0-of-2.f16",
            "shard-1-of-2.f16",
        ]
        a, b = one[name].read(), two[name].read()
        assert len(a) == len(b) and all(np.array_equal(a.example(i), b.example(i)) for i in range(len(a)))
    first = (tmp_path / "one" / "probe_scores.parquet").read_bytes()
    assert first == (tmp_path / "two" / "probe_scores.parquet").read_bytes()
