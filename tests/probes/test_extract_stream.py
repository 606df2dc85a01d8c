"""Batched tokenising and padding against the one-call-per-conversation and row-loop versions they
replaced; extraction through the writer thread bit-identical to a plain forward loop; the writer's
errors in the main thread; commits that flush before they record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.data import read_dataset
from harness.data.builtin import builtin_dir
from probes import (
    ActivationStore,
    LoadedModel,
    ProbeError,
    StoreKey,
    bucket_batches,
    extract,
    layer_activations,
    load_model,
    pad_batch,
    tokenize,
)

# Private: the pieces replaced by batched versions, and the writer's commit steps.
from probes._extract import render
from probes._model import decoder_layers
from probes._store import ShardWriter
from probes._stream import CommitCadence

TRICKY = [
    "",
    " ",
    "\n\n",
    "héllo wörld — ünïcödé 🚀🚀",
    "<|im_start|>user\nspecial tokens typed by the user<|im_end|>",
    [{"role": "user", "content": ""}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x" * 3000}],
    "word " * 300,
]
SHORT = ["hello there", "My chest has hurt for an hour. " * 3, "word " * 200, "ok", "Pay rent.", "a b c"]


@pytest.fixture(scope="module")
def embedded() -> LoadedModel:
    return load_model()


def builtin_conversations() -> list:
    return [it.conversation for f in sorted(builtin_dir().glob("*.jsonl")) for it in read_dataset(f).items]


def tokenize_one_by_one(tokenizer, conversations: list, max_tokens: int) -> tuple[list[list[int]], int]:
    """b3a9e60's tokenize: one render and one tokenizer call per conversation."""
    ids, truncated = [], 0
    for conversation in conversations:
        tokens = tokenizer(render(tokenizer, conversation), add_special_tokens=False)["input_ids"]
        if len(tokens) > max_tokens:
            tokens, truncated = tokens[:max_tokens], truncated + 1
        ids.append(tokens or [tokenizer.pad_token_id])
    return ids, truncated


def test_batched_tokenize_gives_the_same_ids(embedded: LoadedModel) -> None:
    plain = type(embedded.tokenizer).from_pretrained(embedded.tokenizer.name_or_path)
    plain.chat_template = None  # "role: content" lines; an empty message list renders as ""
    for tokenizer, extra in ((embedded.tokenizer, []), (plain, [[]])):
        for conversations in (builtin_conversations(), TRICKY + extra):
            for max_tokens in (1, 7, 64, 4096):
                expected = tokenize_one_by_one(tokenizer, conversations, max_tokens)
                assert tokenize(tokenizer, conversations, max_tokens) == expected
    ids, truncated = tokenize(plain, [[], "", "ok"], 5)
    assert ids[0] == [plain.pad_token_id] and truncated == 0  # nothing to encode: one pad token


def test_a_template_rejecting_one_example_names_it(embedded: LoadedModel) -> None:
    tokenizer = type(embedded.tokenizer).from_pretrained(embedded.tokenizer.name_or_path)
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role') }}"
        "{% endif %}{{ m.content }}{% endfor %}"
    )
    conversations = ["fine", "fine", [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]]
    with pytest.raises(
        ProbeError, match=r"^example 2: the model's chat template rejects it \(no system role\)$"
    ):
        tokenize(tokenizer, conversations, 10)


def test_pad_batch_matches_a_row_loop() -> None:
    rng = np.random.default_rng(0)
    for sizes in ([1], [5, 5], [1, 9, 3, 9], list(rng.integers(1, 50, size=64))):
        ids = [rng.integers(0, 1000, size=n).tolist() for n in sizes]
        input_ids, mask = pad_batch(ids, 7, torch.device("cpu"))
        width = max(sizes)
        loop_ids = torch.full((len(ids), width), 7, dtype=torch.long)
        loop_mask = torch.zeros((len(ids), width), dtype=torch.long)
        for row, tokens in enumerate(ids):  # b3a9e60's pad_batch
            loop_ids[row, : len(tokens)] = torch.tensor(tokens)
            loop_mask[row, : len(tokens)] = 1
        assert input_ids.dtype == mask.dtype == torch.long
        assert torch.equal(input_ids, loop_ids) and torch.equal(mask, loop_mask)


def stored_rows(store: ActivationStore) -> np.ndarray:
    ragged = store.read()
    return np.concatenate([np.asarray(ragged.example(i)) for i in range(len(ragged))])


def test_extraction_is_bit_identical_to_a_plain_forward_loop(embedded: LoadedModel, tmp_path) -> None:
    """The built-in data at layer 2 through tokenize, the writer thread and the store, against
    b3a9e60's loop: per batch, pad, forward, `hidden[mask].to(float16)`, in batch order."""
    conversations = builtin_conversations()
    store, stats = extract(
        embedded,
        conversations,
        layer=2,
        max_tokens=64,
        data_hash="bits",
        store_root=tmp_path,
        batch_tokens=2048,
    )
    ids, _ = tokenize_one_by_one(embedded.tokenizer, conversations, 64)
    lengths = np.array([len(t) for t in ids])
    expected = np.empty((int(lengths.sum()), embedded.hidden_size), np.float16)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    for batch in bucket_batches(lengths, 2048, 64):
        input_ids, mask = pad_batch([ids[i] for i in batch], embedded.tokenizer.pad_token_id, embedded.device)
        rows = layer_activations(embedded, 2, input_ids, mask)[mask.bool()].to(torch.float16).numpy()
        for i in batch:
            expected[starts[i] : starts[i + 1]], rows = rows[: lengths[i]], rows[lengths[i] :]
    assert stats.tokens == len(expected) and stats.batches > 10
    assert np.array_equal(stored_rows(store).view(np.uint16), expected.view(np.uint16))


def progress(store_root: Path) -> tuple[ActivationStore, list[int]]:
    (folder,) = (p for p in store_root.iterdir() if p.is_dir())
    store = ActivationStore(folder, StoreKey(**json.loads((folder / "key.json").read_text())))
    return store, json.loads((folder / "progress-0-of-1.json").read_text())["done"]


OPTIONS = dict(layer=2, max_tokens=96, data_hash="s", batch_tokens=120, commit=CommitCadence(bytes=1))


def test_non_finite_rows_raise_in_the_main_thread_and_the_store_resumes(
    embedded: LoadedModel, tmp_path
) -> None:
    calls = [0]

    def overflow(module: torch.nn.Module, args: tuple, output: torch.Tensor | tuple) -> torch.Tensor | tuple:
        calls[0] += 1
        if calls[0] != 2:
            return output
        hidden = output[0] if isinstance(output, tuple) else output
        hidden = hidden.clone()
        hidden[0, 0, 0] = 1e6  # beyond float16's range
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handle = decoder_layers(embedded.model)[1].register_forward_hook(overflow)
    try:
        with pytest.raises(ProbeError) as caught:
            extract(embedded, SHORT, store_root=tmp_path / "a", **OPTIONS)
    finally:
        handle.remove()
    store, done = progress(tmp_path / "a")
    second = store.plan().batches[1]
    assert str(caught.value) == (
        f"layer 2: activations of examples {list(second)[:5]} are not finite in float16 "
        "(beyond +-65504, or NaN from the model); choose another --layer"
    )
    assert done == [0] and not store.is_complete  # the batch before it was committed, nothing after
    resumed, stats = extract(embedded, SHORT, store_root=tmp_path / "a", **OPTIONS)
    fresh, _ = extract(embedded, SHORT, store_root=tmp_path / "b", **OPTIONS)
    assert stats.extracted_batches == stats.batches - 1
    assert np.array_equal(stored_rows(resumed), stored_rows(fresh))


def test_a_commit_records_batches_only_after_flushing_them(
    embedded: LoadedModel, tmp_path, monkeypatch
) -> None:
    """A flush that fails (as a crash inside it would) leaves its batches unrecorded."""
    flushes = [0]
    real_flush = ShardWriter._flush

    def flush_once(self: ShardWriter) -> None:
        flushes[0] += 1
        if flushes[0] == 2:
            raise OSError("disk gone")
        real_flush(self)

    monkeypatch.setattr(ShardWriter, "_flush", flush_once)
    with pytest.raises(OSError, match="disk gone"):
        extract(embedded, SHORT, store_root=tmp_path, **OPTIONS)
    monkeypatch.undo()
    _, done = progress(tmp_path)
    assert done == [0]
    _, stats = extract(embedded, SHORT, store_root=tmp_path, **OPTIONS)
    assert stats.extracted_batches == stats.batches - 1


KILLED = """
import glob, json, os, signal, sys, time
from probes import extract, load_model
from probes._stream import CommitCadence
batches = [0]
def committed():
    for path in glob.glob(os.path.join(sys.argv[1], "*", "progress-0-of-1.json")):
        try:
            return bool(json.loads(open(path).read())["done"])
        except (OSError, ValueError):
            return False
    return False
def kill(done, total):
    batches[0] += 1
    if batches[0] == 4:
        # Commits run on their own thread: wait (the main thread hands nothing more over) until
        # one has landed, so the kill always finds a committed prefix, whatever the disk's speed.
        deadline = time.monotonic() + 120
        while not committed():
            if time.monotonic() > deadline:
                sys.exit(3)
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)  # no drain, no final commit
extract(load_model(), {conversations!r}, store_root=sys.argv[1], on_batch=kill, layer=2, max_tokens=96,
        data_hash="s", batch_tokens=120, commit=CommitCadence(bytes={bytes}))
"""


def test_a_killed_run_redoes_only_uncommitted_batches(embedded: LoadedModel, tmp_path) -> None:
    conversations = builtin_conversations()[:40]
    one_batch = 120 * embedded.hidden_size * 2  # bytes of a full batch: a commit every other batch or so
    script = KILLED.format(conversations=conversations, bytes=2 * one_batch)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    killed = subprocess.run([sys.executable, "-c", script, str(tmp_path / "a")], env=env, timeout=300)
    assert killed.returncode == -9
    store, done = progress(tmp_path / "a")
    plan = store.plan()
    # a committed prefix of the four batches handed over, with batches still to run
    assert done == list(range(len(done))) and 0 < len(done) <= 4 < len(plan.batches)
    resumed, stats = extract(embedded, conversations, store_root=tmp_path / "a", **OPTIONS)
    assert stats.extracted_batches == len(plan.batches) - len(done)
    fresh, _ = extract(embedded, conversations, store_root=tmp_path / "b", **OPTIONS)
    assert np.array_equal(stored_rows(resumed), stored_rows(fresh))


class FirstBatchOnly(CommitCadence):
    """A commit after the first batch written, then none until the end of the run."""

    def due(self, pending_bytes: int, since: float) -> bool:
        first = not getattr(self, "_asked", False)
        object.__setattr__(self, "_asked", True)
        return first


def test_a_failed_commit_stops_the_run_at_once(embedded: LoadedModel, tmp_path, monkeypatch) -> None:
    """A commit failing on its thread is raised in the main thread within a few batches, not only
    when the next commit falls due (a cadence away) or at the end of the run."""
    real_flush = ShardWriter._flush
    failed = [False]

    def flush_fails_first(self: ShardWriter) -> None:
        if not failed[0]:
            failed[0] = True
            raise OSError("disk gone")
        real_flush(self)

    monkeypatch.setattr(ShardWriter, "_flush", flush_fails_first)
    conversations = builtin_conversations()[:40]
    forward_passes = [0]

    def count(done: int, total: int) -> None:
        forward_passes[0] += 1

    options = {**OPTIONS, "commit": FirstBatchOnly()}
    with pytest.raises(OSError, match="disk gone"):
        extract(embedded, conversations, store_root=tmp_path / "a", on_batch=count, **options)
    monkeypatch.undo()
    (folder,) = (p for p in (tmp_path / "a").iterdir() if p.is_dir())
    assert not (folder / "progress-0-of-1.json").exists()  # nothing recorded done
    assert forward_passes[0] <= 6  # the failed commit's batch, what was in flight, and a little slack


def test_a_second_interrupt_stops_the_writer_before_the_shard_closes(
    embedded: LoadedModel, tmp_path, monkeypatch
) -> None:
    """Ctrl-C ends the batch loop; a second one lands while the stream waits for its writer. The
    writer stops after the write it is in, no write reaches a closed shard, and what was recorded
    done is a committed prefix that resumes to the same store as a fresh run."""
    real_write, real_close, real_join = ShardWriter.write, ShardWriter.close, threading.Thread.join
    closed, late_writes, interrupted = [False], [], [False]

    def slow_write(self: ShardWriter, batch: int, rows: np.ndarray) -> None:
        time.sleep(0.2)  # the writer is behind, so the stream's join waits
        if closed[0]:
            late_writes.append(batch)
        real_write(self, batch, rows)

    def close(self: ShardWriter) -> None:
        closed[0] = True
        real_close(self)

    def join(self: threading.Thread, timeout: float | None = None) -> None:
        if self.name == "ctd-shard-writer" and not interrupted[0]:
            interrupted[0] = True
            raise KeyboardInterrupt  # the second Ctrl-C, during the wait for the writer
        real_join(self, timeout)

    def first_ctrl_c(done: int, total: int) -> None:
        if done > total // 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(ShardWriter, "write", slow_write)
    monkeypatch.setattr(ShardWriter, "close", close)
    monkeypatch.setattr(threading.Thread, "join", join)
    conversations = builtin_conversations()[:40]
    with pytest.raises(KeyboardInterrupt):
        extract(embedded, conversations, store_root=tmp_path / "a", on_batch=first_ctrl_c, **OPTIONS)
    monkeypatch.undo()
    assert interrupted[0] and closed[0] and late_writes == []
    assert not any(t.name == "ctd-shard-writer" and t.is_alive() for t in threading.enumerate())
    store, done = progress(tmp_path / "a")
    assert done == list(range(len(done))) and len(done) < len(store.plan().batches)
    resumed, stats = extract(embedded, conversations, store_root=tmp_path / "a", **OPTIONS)
    assert stats.extracted_batches == len(store.plan().batches) - len(done)
    fresh, _ = extract(embedded, conversations, store_root=tmp_path / "b", **OPTIONS)
    assert np.array_equal(stored_rows(resumed), stored_rows(fresh))
