"""Probe architectures and training: planted signals are learned (and shuffled labels are not), padding
is ignored, the best epoch's weights are returned, training is deterministic, predict keeps input order."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from scipy.stats import rankdata, spearmanr

# Private: each architecture's module and the probe builder, unit-tested; training is patched.
import probes._train as train_module
from probes import ARCHS, EpochLog, Probe, ProbeConfig, Ragged, predict, train_probe

# Private: the probe classes, trained and checked one by one.
from probes._attention import AttentionProbe
from probes._build import build_probe
from probes._mean import MeanProbe
from probes._mlp import MLPProbe
from probes._softmax import SoftmaxProbe

D = 16  # activation width in these tests
N_TRAIN, N_TEST = 400, 200


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These probes are tiny: one intra-op thread is faster, and far steadier on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def config(arch: str, **overrides) -> ProbeConfig:
    """Small, quick settings that learn the planted signals below."""
    settings = dict(arch=arch, lr=1e-2, epochs=30, patience=8, batch_size=32, mlp_hidden=32)
    return ProbeConfig(**(settings | overrides))


def planted(n: int, seed: int, *, task: str) -> tuple[Ragged, np.ndarray]:
    """n examples of 3-40 tokens ~ N(0, 1) in D dimensions; every token of an example is shifted along
    one fixed direction by 0.75 * (2y - 1) (safety, y in {0, 1}) or by 1.5 * v (DV, v ~ U(-1, 1))."""
    rng = np.random.default_rng(seed)
    direction = np.random.default_rng(12345).standard_normal(D)
    direction /= np.linalg.norm(direction)
    lengths = rng.integers(3, 41, n)
    if task == "safety":
        targets = rng.integers(0, 2, n).astype(np.float64)
        shifts = 0.75 * (2 * targets - 1)
    else:
        targets = rng.uniform(-1, 1, n)
        shifts = 1.5 * targets
    examples = [rng.standard_normal((t, D)) + s * direction for t, s in zip(lengths, shifts, strict=True)]
    return Ragged.from_arrays(examples), targets


def train_test(task: str, seed: int = 0) -> tuple[Ragged, np.ndarray, Ragged, np.ndarray]:
    acts, targets = planted(N_TRAIN + N_TEST, seed, task=task)
    train, test = np.arange(N_TRAIN), np.arange(N_TRAIN, N_TRAIN + N_TEST)
    return acts.subset(train), targets[train], acts.subset(test), targets[test]


def auroc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Mann-Whitney rank formula, ties counted one half."""
    ranks = rankdata(scores)
    positive = labels == 1
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def random_probe(arch: str, seed: int = 0) -> torch.nn.Module:
    """An untrained probe with random weights (the query too, which starts at 0) and random
    standardisation, in eval mode."""
    torch.manual_seed(seed)
    probe = build_probe(config(arch), D, mean=torch.randn(D), std=torch.rand(D) + 0.5)
    with torch.no_grad():
        for parameter in probe.parameters():
            parameter.normal_(std=0.5)
    return probe.eval()


# ---- the builder


@pytest.mark.parametrize(
    ("arch", "cls"),
    [("attention", AttentionProbe), ("softmax", SoftmaxProbe), ("mean", MeanProbe), ("mlp", MLPProbe)],
)
def test_build_probe_gives_each_arch_and_follows_the_protocol(arch, cls):
    probe = build_probe(config(arch), D)
    assert type(probe) is cls
    # The Probe contract, attribute by attribute: isinstance(probe, Probe) cannot see nn.Module
    # buffers from Python 3.12 on (runtime protocols look attributes up statically there).
    for name in Probe.__annotations__:
        assert hasattr(probe, name), name
    assert callable(probe.penalty) and probe.penalty().ndim == 0
    assert probe.pooled == (arch in ("mean", "mlp"))
    assert {"mean", "std"} <= set(probe.state_dict())  # standardisation is saved with the module
    x, mask = torch.randn(3, 5, D), torch.ones(3, 5, dtype=torch.bool)
    assert probe(x, mask).shape == (3,)


def test_build_probe_rejects_mismatched_standardisation():
    with pytest.raises(ValueError, match="shape"):
        build_probe(config("attention"), D, mean=torch.zeros(D + 1))
    with pytest.raises(ValueError, match="positive"):
        build_probe(config("mean"), D, std=torch.zeros(D))


def test_mean_probe_penalty_is_l2_on_weights_only():
    probe = build_probe(config("mean", l2=0.5), D)
    assert probe.penalty().item() == pytest.approx(0.5 * probe.head.weight.pow(2).sum().item())
    for arch in ("attention", "softmax", "mlp"):
        assert build_probe(config(arch), D).penalty().item() == 0.0


# ---- padding


@pytest.mark.parametrize("arch", ARCHS)
def test_padding_is_ignored(arch):
    probe = random_probe(arch)
    rng = np.random.default_rng(1)
    acts = Ragged.from_arrays([rng.standard_normal((t, D)) for t in (4, 17, 33)])
    alone = probe(*acts.padded(np.array([0])))  # (1,): x (1, 4, D), no padding
    x, mask = acts.padded(np.arange(3))  # (3, 33, D)
    in_batch = probe(x, mask)
    assert abs(alone.item() - in_batch[0].item()) < 1e-6
    garbage = x.clone()
    garbage[~mask] = 1e4 * torch.randn(int((~mask).sum()), D)
    garbage[0, -1] = float("nan")
    assert torch.equal(probe(garbage, mask), in_batch)


@pytest.mark.parametrize("arch", ["mean", "mlp"])
def test_pooled_probes_read_pooled_vectors_exactly(arch):
    probe = random_probe(arch)
    acts, _ = planted(20, 3, task="safety")
    x, mask = acts.padded(np.arange(20))
    pooled = torch.from_numpy(acts.mean_pooled())[:, None, :]  # (20, 1, D)
    torch.testing.assert_close(probe(pooled, torch.ones(20, 1, dtype=torch.bool)), probe(x, mask))


# ---- learning planted signals


@pytest.mark.parametrize("arch", ARCHS)
def test_safety_probe_learns_planted_signal(arch):
    train_acts, train_y, test_acts, test_y = train_test("safety")
    result = train_probe(train_acts, train_y, task="safety", config=config(arch), seed=0)
    scores = predict(result.probe, test_acts, task="safety")
    assert scores.dtype == np.float64 and ((scores >= 0) & (scores <= 1)).all()
    assert auroc(test_y, scores) > 0.95
    assert result.n_train + result.n_val == N_TRAIN
    assert result.n_val == pytest.approx(0.2 * N_TRAIN, abs=2)
    # the held-out examples are stratified by label
    assert train_y[result.val_index].mean() == pytest.approx(train_y.mean(), abs=0.02)


@pytest.mark.parametrize("arch", ARCHS)
def test_safety_probe_finds_nothing_in_shuffled_labels(arch):
    acts, y = planted(N_TRAIN + N_TEST, 0, task="safety")
    y = np.random.default_rng(7).permutation(y)  # every label, training and test: none tells anything
    train, test = np.arange(N_TRAIN), np.arange(N_TRAIN, N_TRAIN + N_TEST)
    result = train_probe(acts.subset(train), y[train], task="safety", config=config(arch), seed=0)
    assert abs(auroc(y[test], predict(result.probe, acts.subset(test), task="safety")) - 0.5) < 0.15


@pytest.mark.parametrize("arch", ARCHS)
def test_dv_probe_learns_planted_values(arch):
    train_acts, train_v, test_acts, test_v = train_test("dv")
    result = train_probe(train_acts, train_v, task="dv", config=config(arch), seed=0)
    values = predict(result.probe, test_acts, task="dv")
    assert values.dtype == np.float64
    assert spearmanr(values, test_v).statistic > 0.8
    assert np.mean((values - test_v) ** 2) < np.var(test_v)


# ---- early stopping and the best epoch


def overfitting_data() -> tuple[Ragged, np.ndarray]:
    """100 examples with 30% of the labels flipped: a 64-unit MLP soon fits the noise."""
    acts, y = planted(100, 5, task="safety")
    flipped = np.random.default_rng(0).random(100) < 0.3
    return acts, np.where(flipped, 1 - y, y)


def test_best_epoch_weights_are_returned(monkeypatch):
    acts, y = overfitting_data()
    built: list[torch.nn.Module] = []
    states: list[dict[str, torch.Tensor]] = []

    def recording_build_probe(*args, **kwargs):
        built.append(build_probe(*args, **kwargs))
        return built[-1]

    def snapshot(log: EpochLog) -> None:
        assert log.epoch == len(states)
        states.append(copy.deepcopy(built[0].state_dict()))

    monkeypatch.setattr(train_module, "build_probe", recording_build_probe)
    cfg = config("mlp", lr=1e-2, epochs=20, patience=20, weight_decay=0.0, mlp_hidden=64)
    result = train_probe(acts, y, task="safety", config=cfg, seed=0, on_epoch=snapshot)

    val_losses = [log.val_loss for log in result.history]
    assert len(result.history) == len(states) == 20
    assert result.best_val_loss == min(val_losses) == result.history[result.best_epoch].val_loss
    assert result.best_epoch == int(np.argmin(val_losses))
    assert 0 < result.best_epoch < len(result.history) - 1  # it improves, then overfits

    assert result.probe is built[0] and not result.probe.training
    returned = result.probe.state_dict()
    assert all(torch.equal(returned[k], states[result.best_epoch][k]) for k in returned)
    assert not all(torch.equal(returned[k], states[-1][k]) for k in returned)

    # the held-out loss of the returned probe, recomputed here in float64
    p = predict(result.probe, acts.subset(result.val_index), task="safety")
    yv = y[result.val_index]
    bce = -np.mean(yv * np.log(p) + (1 - yv) * np.log1p(-p))
    assert bce == pytest.approx(result.best_val_loss, rel=1e-5)
    assert len(result.val_index) == result.n_val and len(result.train_index) == result.n_train
    assert not np.intersect1d(result.val_index, result.train_index).size


def test_training_stops_after_patience_epochs_without_improvement():
    acts, y = overfitting_data()
    cfg = config("mlp", lr=1e-2, epochs=40, patience=3, weight_decay=0.0, mlp_hidden=64)
    result = train_probe(acts, y, task="safety", config=cfg, seed=0)
    assert len(result.history) == result.best_epoch + 1 + 3 < 40
    lrs = [log.lr for log in result.history]
    assert lrs == sorted(lrs, reverse=True) and 0 < lrs[-1] < cfg.lr  # cosine decay per step


# ---- determinism


def test_training_is_deterministic_given_the_seed():
    acts, y = planted(120, 2, task="safety")
    cfg = config("attention", epochs=5)
    rng_before = torch.get_rng_state()
    first, again, other = (train_probe(acts, y, task="safety", config=cfg, seed=s) for s in (3, 3, 4))
    a, b, c = first.probe.state_dict(), again.probe.state_dict(), other.probe.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert first.history == again.history
    assert not all(torch.equal(a[k], c[k]) for k in a)
    # the caller's RNG and deterministic-algorithms setting are untouched
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert not torch.are_deterministic_algorithms_enabled()


# ---- predict


@pytest.mark.parametrize("arch", ["attention", "mlp"])
def test_predict_returns_scores_in_input_order(arch):
    probe = random_probe(arch)
    acts, _ = planted(50, 4, task="safety")
    scores = predict(probe, acts, task="dv", batch_size=8)
    one_by_one = [probe(*acts.padded(np.array([i]))).item() for i in range(len(acts))]
    np.testing.assert_allclose(scores, one_by_one, rtol=1e-5, atol=1e-5)
    order = np.random.default_rng(0).permutation(len(acts))
    permuted = predict(probe, acts.subset(order), task="dv", batch_size=8)
    np.testing.assert_allclose(permuted, scores[order], rtol=1e-5, atol=1e-5)
    probabilities = predict(probe, acts, task="safety", batch_size=8)
    np.testing.assert_allclose(probabilities, 1 / (1 + np.exp(-scores)), rtol=1e-6)


# ---- bad input


def test_train_probe_rejects_bad_targets():
    acts, y = planted(30, 0, task="safety")
    with pytest.raises(ValueError, match="shape"):
        train_probe(acts, y[:-1], task="safety", config=config("mean"), seed=0)
    with pytest.raises(ValueError, match=r"\{0, 1\}"):
        train_probe(acts, y + 0.5, task="safety", config=config("mean"), seed=0)
    with pytest.raises(ValueError, match="finite"):
        train_probe(acts, np.full(30, np.nan), task="dv", config=config("mean"), seed=0)
