"""Probe inputs on a device: resident and streamed batches give the same probe and scores (bit for bit
on the CPU), the vectorised float64 sums equal the per-example loop they replace, the streamed path's
memory scales with the batch, and training restores the RNGs and the deterministic setting."""

from __future__ import annotations

import contextlib
import gc
import tracemalloc
from collections.abc import Iterator

import numpy as np
import pytest
import torch

# Private: the batch layouts and the raw outputs, checked on each device.
import probes._batches as batches_module
import probes._ragged as ragged_module
import probes._train as train_module
from probes import ARCHS, ProbeConfig, Ragged, default_device, predict, release_device_memory, train_probe

# Private: the batch layouts and the raw outputs, checked on each device.
from probes._batches import Pooled, Resident, Streamed, inputs
from probes._build import build_probe
from probes._train import _raw_outputs

D = 8
CPU = torch.device("cpu")
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def ragged(n: int, seed: int, *, shards: int = 1) -> tuple[Ragged, np.ndarray]:
    """n examples of 1-30 float16 tokens, labels shifting them; spread over `shards` shards (the
    second a reversed copy, so the examples' rows are not in shard order)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n).astype(np.float64)
    examples = [
        rng.standard_normal((int(t), D)) + 0.5 * (2 * label - 1)
        for t, label in zip(rng.integers(1, 31, n), y, strict=True)
    ]
    acts = Ragged.from_arrays(examples)
    if shards == 1:
        return acts, y
    values = acts.shards[0]
    shard = rng.integers(0, 2, n)
    start = np.where(shard == 0, acts.start, len(values) - acts.start - acts.length)
    flipped = np.ascontiguousarray(values[::-1])
    # in shard 1 an example's tokens are in reverse order: the same example, other rows and rounding
    return Ragged((values, flipped), shard.astype(np.int64), start.astype(np.int64), acts.length), y


def state(probe: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in probe.state_dict().items()}


@pytest.mark.parametrize("arch", ARCHS)
def test_resident_and_streamed_train_the_same_probe_on_cpu(arch):
    acts, y = ragged(90, 0, shards=2)
    cfg = ProbeConfig(
        arch=arch, lr=1e-2, epochs=3, batch_size=16, mlp_hidden=8, dropout=0.2 if arch == "mlp" else 0.0
    )
    streamed = train_probe(acts, y, task="safety", config=cfg, seed=1, device="cpu", resident=False)
    resident = train_probe(acts, y, task="safety", config=cfg, seed=1, device="cpu", resident=True)
    a, b = state(streamed.probe), state(resident.probe)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert streamed.history == resident.history
    test, _ = ragged(40, 1)
    by_path = [predict(streamed.probe, test, task="safety", batch_size=8, resident=r) for r in (False, True)]
    np.testing.assert_array_equal(by_path[0], by_path[1])
    # and both equal scoring each example alone, as the pre-GPU predict did
    raw = torch.cat([streamed.probe(*test.padded(np.array([i]))) for i in range(len(test))])
    np.testing.assert_allclose(by_path[0], torch.sigmoid(raw.double()).detach().numpy(), rtol=1e-6, atol=1e-7)


def test_resident_batch_equals_host_padding():
    acts, _ = ragged(50, 2, shards=2)
    index = np.array([3, 17, 0, 44, 17])
    want_x, want_mask = acts.padded(index)
    for source in (Resident(acts, CPU), Streamed(acts, CPU)):
        x, mask = source.batch(index)
        assert x.dtype == torch.float32 and torch.equal(x, want_x) and torch.equal(mask, want_mask)
    pooled = inputs(acts, pooled=True, device=CPU, resident=True)
    assert isinstance(pooled, Pooled)
    np.testing.assert_array_equal(pooled.rows.numpy(), acts.mean_pooled())


def test_vectorised_sums_equal_the_per_example_loop(monkeypatch):
    monkeypatch.setattr(ragged_module, "CHUNK_VALUES", 40)  # many chunks, some of a single example
    acts, _ = ragged(120, 3, shards=2)
    acts = acts.subset(np.random.default_rng(0).permutation(len(acts))[:100])
    total, squares = np.zeros(D), np.zeros(D)
    means = np.empty((len(acts), D), dtype=np.float32)
    for i in range(len(acts)):  # b3a9e60's _feature_stats and mean_pooled
        tokens = acts.example(i).astype(np.float64)
        total += tokens.sum(axis=0)
        squares += np.square(tokens).sum(axis=0)
        means[i] = tokens.mean(axis=0)
    new_total, new_squares = acts.token_sums()
    assert np.array_equal(new_total, total) and np.array_equal(new_squares, squares)
    assert np.array_equal(acts.mean_pooled(), means)


def test_streamed_memory_scales_with_the_batch_not_the_split(tmp_path, monkeypatch):
    """An attention probe trained and scored over a memory-mapped split of 3,000 examples: the
    numpy memory held at any time stays far below one padding of the whole split."""
    monkeypatch.setattr(ragged_module, "CHUNK_VALUES", 1 << 12)  # the sums' chunk: a constant
    n, d, width = 3000, 32, 40
    rng = np.random.default_rng(4)
    length = rng.integers(1, width + 1, n).astype(np.int64)
    values = np.memmap(tmp_path / "shard.f16", dtype=np.float16, mode="w+", shape=(int(length.sum()), d))
    values[:] = rng.standard_normal(values.shape).astype(np.float16)
    values.flush()
    shard = np.memmap(tmp_path / "shard.f16", dtype=np.float16, mode="r", shape=values.shape)
    acts = Ragged((shard,), np.zeros(n, dtype=np.int64), np.cumsum(length) - length, length)
    y = (rng.random(n) < 0.5).astype(np.float64)
    whole_split = n * width * d * 4  # padded as float32: 15 MiB
    cfg = ProbeConfig(arch="attention", epochs=1, batch_size=32)
    small, small_y = ragged(20, 4)  # first, so lazy imports (the optimiser's) are not counted
    predict(
        train_probe(small, small_y, task="safety", config=cfg, seed=0, device="cpu").probe, small, task="dv"
    )
    tracemalloc.start()
    try:
        result = train_probe(acts, y, task="safety", config=cfg, seed=0, device="cpu", resident=False)
        predict(result.probe, acts, task="safety", resident=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < whole_split / 15, f"peak {peak} bytes against {whole_split} for the whole split"


def test_resident_tokens_are_uploaded_once_and_freed_with_their_shards():
    acts, _ = ragged(20, 5)
    first, second = Resident(acts, CPU), Resident(acts.subset(np.arange(5)), CPU)
    assert first.tokens is second.tokens  # one upload per shard tuple
    assert torch.equal(first.tokens[-1], torch.zeros(D, dtype=torch.float16))  # padding's row
    key = batches_module._key(acts.shards, CPU)
    assert key in batches_module._RESIDENT
    del acts, first, second
    gc.collect()
    assert key not in batches_module._RESIDENT


def test_release_device_memory_drops_the_resident_splits_and_pooling_an_empty_subset_works():
    acts, _ = ragged(20, 6)
    first = Resident(acts, CPU)
    assert batches_module._key(acts.shards, CPU) in batches_module._RESIDENT
    release_device_memory()  # what a run does before it starts a local vLLM server
    assert not batches_module._RESIDENT
    assert first.tokens.shape == (int(acts.length.sum()) + 1, D)  # a holder keeps its own tensor
    empty = Resident(acts.subset(np.arange(0)), CPU).mean_pooled()
    assert empty.shape == (0, D)


def test_device_rule_and_restored_state():
    acts, y = ragged(40, 6)
    cfg = ProbeConfig(arch="mlp", epochs=2, mlp_hidden=8, dropout=0.5)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        rng_before = torch.get_rng_state()
        result = train_probe(acts, y, task="safety", config=cfg, seed=0)
        assert torch.equal(torch.get_rng_state(), rng_before)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.utils.deterministic.fill_uninitialized_memory  # torch's default, restored
        torch.utils.deterministic.fill_uninitialized_memory = False  # a caller's own choice
        train_probe(acts, y, task="safety", config=cfg, seed=0)
        assert not torch.utils.deterministic.fill_uninitialized_memory
    finally:
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = True
    assert next(result.probe.parameters()).device.type == default_device().type  # trained there
    assert default_device().type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("resident", [True, False])
@pytest.mark.parametrize("arch", ARCHS)
def test_nothing_reads_memory_it_never_wrote(arch, resident, monkeypatch):
    """Training skips torch's NaN fill of new memory (a launch per allocation on a GPU). With the
    fill kept, a read of unwritten memory would turn into NaN and move the weights and scores."""
    acts, y = ragged(60, 9)
    cfg = ProbeConfig(arch=arch, epochs=3, batch_size=8, mlp_hidden=8)
    fast = train_probe(acts, y, task="safety", config=cfg, seed=1, resident=resident)
    fast_scores = predict(fast.probe, acts, task="safety", resident=resident)

    @contextlib.contextmanager
    def with_the_fill() -> Iterator[None]:
        torch.use_deterministic_algorithms(True)
        assert torch.utils.deterministic.fill_uninitialized_memory
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(False)

    monkeypatch.setattr(train_module, "_deterministic_algorithms", with_the_fill)
    filled = train_probe(acts, y, task="safety", config=cfg, seed=1, resident=resident)
    monkeypatch.undo()
    fast_state, filled_state = state(fast.probe), state(filled.probe)
    assert fast_state.keys() == filled_state.keys()
    assert all(torch.equal(fast_state[k], filled_state[k]) for k in fast_state)
    assert np.array_equal(fast_scores, predict(filled.probe, acts, task="safety", resident=resident))
    assert fast.history == filled.history


# ---- on a GPU (skipped without one)


@cuda_only
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_paths_agree_with_the_cpu(arch):
    acts, y = ragged(200, 7, shards=2)
    cfg = ProbeConfig(arch=arch, lr=1e-2, epochs=4, batch_size=16, mlp_hidden=8)
    cpu = train_probe(acts, y, task="safety", config=cfg, seed=2, device="cpu")
    rng_before = torch.cuda.get_rng_state()
    runs = [
        train_probe(acts, y, task="safety", config=cfg, seed=2, device="cuda", resident=r)
        for r in (False, True)
    ]
    assert torch.equal(torch.cuda.get_rng_state(), rng_before)
    for run in runs:
        assert next(run.probe.parameters()).is_cuda
        a, b = state(cpu.probe), state(run.probe)
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5)
    test, _ = ragged(60, 8)
    want = predict(cpu.probe, test, task="safety")
    for run in runs:
        for resident in (False, True):
            got = predict(run.probe, test, task="safety", resident=resident)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    again = train_probe(acts, y, task="safety", config=cfg, seed=2, device="cuda", resident=True)
    assert all(torch.equal(state(again.probe)[k], state(runs[1].probe)[k]) for k in state(again.probe))


@cuda_only
def test_cuda_raw_outputs_keep_input_order():
    probe = build_probe(ProbeConfig(arch="attention"), D).cuda().eval()
    acts, _ = ragged(50, 9)
    for source in (Resident(acts, torch.device("cuda")), Streamed(acts, torch.device("cuda"))):
        out = _raw_outputs(probe, source, 8).cpu()
        one_by_one = torch.cat(
            [probe(*[t.cuda() for t in acts.padded(np.array([i]))]) for i in range(50)]
        ).cpu()
        torch.testing.assert_close(out, one_by_one, rtol=1e-5, atol=1e-5)
