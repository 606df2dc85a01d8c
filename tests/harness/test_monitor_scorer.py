"""The monitor's scoring path (harness/monitor/_scorer.py, issue 25) against the offline one:

- a micro-batch of test-split conversations of many lengths goes through one forward pass, and
  each conversation's scores equal those of `probes.extract` + `probes.predict` (the run's path)
  and those of the conversation scored alone, with no padding at all (tolerance 1e-5), for a
  pooled probe (mean) and a token-reading one (attention);
- without a fitted cost the passes are cut by the token budget only; with one, the cut costs no
  more than any other grouping of the items (brute force over every set partition), and the
  scores are the same whatever the cut.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from monitor_bundle import write_untrained_bundle

from harness import InputError
from harness.data.builtin import builtin_dir
from harness.monitor import Monitor

# Private: the scorer's forward passes, checked against the probes'.
from harness.monitor._scorer import PassCost, ProbeScorer, forward_passes
from probes import BATCH_TOKENS, ProbeConfig, extract, predict

# Private: a probe built without training.
from probes._build import build_probe

# float32 through the model's layers, batched with padding or alone: on an Intel Xeon with
# transformers 5.24 the two differ by up to 2.3e-5 in a DV output near 1 (other CPU kernels for
# other shapes); padding that leaked into the probes would move them by 1e-2 or more.
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_untrained_bundle(tmp_path_factory.mktemp("scorer") / "bundle")


@pytest.fixture(scope="module")
def scorer(bundle: Path) -> ProbeScorer:
    return ProbeScorer.load(bundle / "safety", bundle / "dv")


def conversations(n: int) -> list[object]:
    rows = [json.loads(line) for line in (builtin_dir() / "test.jsonl").read_text().splitlines()][:n]
    return [json.loads(r["inputs"]) if r["inputs"].startswith("[") else r["inputs"] for r in rows]


def offline(scorer: ProbeScorer, texts: list[object], tmp_path: Path) -> np.ndarray:
    """(n, 2) probe and DV scores as the run computes them: a store, then `predict`."""
    store, _ = extract(
        scorer.model, texts, layer=scorer.reads.layer, max_tokens=scorer.reads.max_tokens,
        data_hash="scorer-test", store_root=tmp_path,
    )  # fmt: skip
    acts = store.read()
    safety = predict(scorer.safety.cpu(), acts, task="safety")
    dv = predict(scorer.dv.cpu(), acts, task="dv")
    return np.stack([safety, dv], axis=1)


@pytest.mark.parametrize("arch", ["mean", "attention"])
def test_one_pass_per_micro_batch_scores_as_the_offline_path_and_as_alone(
    scorer: ProbeScorer, tmp_path: Path, arch: str
) -> None:
    torch.manual_seed(1)
    scorer.safety = build_probe(ProbeConfig(arch=arch), scorer.reads.dim).eval()
    scorer.dv = build_probe(ProbeConfig(arch=arch), scorer.reads.dim).eval()
    with torch.no_grad():  # a query that makes attention weights uneven, so padding would show
        for probe in (scorer.safety, scorer.dv):
            if hasattr(probe, "query"):
                probe.query.normal_(0, 3)
    texts = [*conversations(22), "hi", "Is it safe?"]  # short ones: much padding in the pass
    tokens = [scorer.tokens(c) for c in texts]
    lengths = np.array([len(t.ids) for t in tokens])
    assert lengths.max() > 3 * lengths.min()  # padding of most of the width in one pass
    assert len(forward_passes(lengths, scorer.batch_tokens)) == 1
    together = np.array(scorer.score(tokens))
    alone = np.array([scorer.score([t])[0] for t in tokens])
    np.testing.assert_allclose(together, alone, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(together, offline(scorer, texts, tmp_path), atol=TOLERANCE, rtol=0)
    assert all(type(v) is float for row in scorer.score(tokens[:2]) for v in row)


def test_without_a_cost_passes_are_cut_by_the_token_budget_only() -> None:
    lengths = np.array([100, 10, 60, 30, 100, 5])
    assert forward_passes(lengths, 1000) == ((0, 4, 2, 3, 1, 5),)
    cut = forward_passes(lengths, 250)
    assert sorted(i for rows in cut for i in rows) == list(range(6))
    assert all(len(rows) * max(lengths[list(rows)]) <= 250 for rows in cut)
    assert len(cut) == 2  # 100+100, then 60+30+10+5, four rows padded to 60: 240 tokens


def set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    """Every way to cut `items` into non-empty groups, in any grouping (not only runs in order)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in set_partitions(rest):
        yield [[first], *partition]
        for k in range(len(partition)):
            yield [*partition[:k], [first, *partition[k]], *partition[k + 1 :]]


def cost_of(passes: object, lengths: np.ndarray, cost: PassCost) -> float:
    return sum(
        float(cost.seconds(np.array(len(rows)), np.array(lengths[list(rows)].max()))) for rows in passes
    )


@pytest.mark.parametrize("case", range(60))
def test_the_cut_by_cost_is_the_cheapest_grouping_of_all(case: int) -> None:
    rng = np.random.default_rng(case)
    n = int(rng.integers(1, 8))
    lengths = rng.integers(1, 60, size=n)
    budget = int(rng.integers(int(lengths.max()), 4 * int(lengths.max()) + 1))
    cost = PassCost(
        per_pass=float(rng.choice([0.0, 1.0, 20.0, 200.0])), per_token=float(rng.choice([0.0, 1.0]))
    )
    cut = forward_passes(lengths, budget, cost)
    assert sorted(i for rows in cut for i in rows) == list(range(n))
    assert all(len(rows) * lengths[list(rows)].max() <= budget for rows in cut)
    assert all(list(lengths[list(rows)]) == sorted(lengths[list(rows)], reverse=True) for rows in cut)
    cheapest = min(
        cost_of(p, lengths, cost)
        for p in set_partitions(list(range(n)))
        if all(len(rows) * lengths[rows].max() <= budget for rows in p)
    )
    assert cost_of(cut, lengths, cost) == pytest.approx(cheapest, rel=1e-12, abs=1e-12)


def test_a_pass_cost_alone_keeps_passes_few_and_a_token_cost_alone_pads_nothing() -> None:
    lengths = np.array([100, 10, 60, 30, 100, 5])
    assert len(forward_passes(lengths, 250, PassCost(1.0, 0.0))) == len(forward_passes(lengths, 250))
    assert forward_passes(lengths, 1000, PassCost(1.0, 0.0)) == ((0, 4, 2, 3, 1, 5),)
    padding_free = forward_passes(lengths, 1000, PassCost(0.0, 1.0))
    assert all(len(set(lengths[list(rows)])) == 1 for rows in padding_free)


def test_a_fitted_cost_and_a_cut_into_many_passes_leave_every_score_as_it_was(scorer: ProbeScorer) -> None:
    tokens = [scorer.tokens(c) for c in [*conversations(30), "hi", "Is it safe?"]]
    lengths = np.array([len(t.ids) for t in tokens])
    scorer.pass_cost = None
    one_pass = np.array(scorer.score(tokens))
    try:
        cost = scorer.fit_pass_cost(max_batch=32)
        assert cost.per_pass > 0 and cost.per_token >= 0 and scorer.pass_cost == cost
        np.testing.assert_allclose(np.array(scorer.score(tokens)), one_pass, atol=TOLERANCE, rtol=0)
        scorer.pass_cost = PassCost(per_pass=1e-3, per_token=1.0)  # padding dear: a pass per length
        assert len(forward_passes(lengths, scorer.batch_tokens, scorer.pass_cost)) == len(set(lengths))
        np.testing.assert_allclose(np.array(scorer.score(tokens)), one_pass, atol=TOLERANCE, rtol=0)
    finally:
        scorer.pass_cost = None


def test_the_token_budget_holds_for_every_pass_of_several() -> None:
    lengths = np.array([300, 100, 100, 100], dtype=np.uint16)  # one item wider than the budget
    cut = forward_passes(lengths, 250, PassCost(per_pass=1.0, per_token=0.0))
    assert cut[0] == (0,)  # alone, as it must be
    assert all(len(rows) * lengths[list(rows)].max() <= 250 for rows in cut[1:])


def test_the_monitor_passes_hold_the_token_budget_it_is_given(bundle: Path, scorer: ProbeScorer) -> None:
    """`ctd monitor serve --batch-tokens` reaches the scorer (never under the probes' token limit:
    one conversation always fits a pass); without it the default is `probes.BATCH_TOKENS`."""

    async def budgets() -> list[int]:
        out = []
        for asked in (1, 3000):
            monitor = await Monitor.load(bundle, expert=False, batch_tokens=asked)
            try:
                out.append(monitor.scorer.scorer.batch_tokens)  # type: ignore[union-attr]
            finally:
                await monitor.aclose()
        return out

    assert scorer.batch_tokens == BATCH_TOKENS
    assert asyncio.run(budgets()) == [scorer.reads.max_tokens, 3000]


def test_tokens_of_a_batch_are_those_of_each_conversation_alone(scorer: ProbeScorer) -> None:
    """`tokens_each` (the monitor's batch) gives each conversation the ids and cut flag `tokens`
    gives it alone, at the token limit and one over it, and the refusal of a rejected one in place."""
    texts = conversations(12)
    longest = max(len(scorer.tokens(t).ids) for t in texts)  # untouched: the limit is far above
    rejected = [{"role": "user", "content": None}]
    for limit in (longest, longest - 1, 8):
        cut = ProbeScorer(scorer.model, scorer.safety, scorer.dv, replace(scorer.reads, max_tokens=limit), 1)
        batch = cut.tokens_each([*texts[:6], rejected, *texts[6:]])
        assert isinstance(batch[6], InputError) and "chat template" in str(batch[6])
        assert batch[:6] + batch[7:] == [cut.tokens(t) for t in texts]
        flags = [t.truncated for t in batch if not isinstance(t, InputError)]
        assert any(flags) == (limit < longest) and all(flags) == (limit == 8)


def test_probes_trained_in_bfloat16_are_served_in_bfloat16_on_a_cpu_too(tmp_path: Path) -> None:
    """Probes whose record says their activations came from a bfloat16 model (a GPU run) read the
    model in bfloat16 wherever they are served: the certified scores were computed so. A record
    without a dtype (written before it was kept) reads it in the device's default, float32 here."""
    trained_on_gpu = write_untrained_bundle(tmp_path / "bf16", dtype="bfloat16")
    scorer = ProbeScorer.load(trained_on_gpu / "safety", trained_on_gpu / "dv")
    assert scorer.model.model.dtype == torch.bfloat16
    scores = np.array(scorer.score([scorer.tokens(c) for c in conversations(4)]))
    assert scores.shape == (4, 2) and np.isfinite(scores).all()
    older = write_untrained_bundle(tmp_path / "older")
    assert ProbeScorer.load(older / "safety", older / "dv").model.model.dtype == torch.float32
