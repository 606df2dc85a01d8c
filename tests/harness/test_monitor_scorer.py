"""The monitor's scoring path (harness/monitor/_scorer.py, issue 25) against the offline one:

- a micro-batch of test-split conversations of many lengths goes through one forward pass, and
  each conversation's scores equal those of `probes.extract` + `probes.predict` (the run's path)
  and those of the conversation scored alone, with no padding at all (tolerance 1e-5), for a
  pooled probe (mean) and a token-reading one (attention);
- the passes are cut by the token budget only.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from monitor_bundle import write_untrained_bundle

from harness.data.builtin import builtin_dir

# Private: the scorer's forward passes, checked against the probes'.
from harness.monitor._scorer import ProbeScorer, forward_passes
from probes import ProbeConfig, extract, predict

# Private: a probe built without training.
from probes._build import build_probe

# float32 through the model's layers, batched with padding or alone: on an Intel Xeon with
# transformers 5.24 the two differ by up to 2.3e-5 in a DV output near 1 (other CPU kernels for
# other shapes); padding that leaked into the probes would move them by 1e-2 or more.
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def scorer(tmp_path_factory: pytest.TempPathFactory) -> ProbeScorer:
    bundle = write_untrained_bundle(tmp_path_factory.mktemp("scorer") / "bundle")
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


def test_passes_are_cut_by_the_token_budget_only() -> None:
    lengths = np.array([100, 10, 60, 30, 100, 5])
    assert forward_passes(lengths, 1000) == ((0, 4, 2, 3, 1, 5),)
    cut = forward_passes(lengths, 250)
    assert sorted(i for rows in cut for i in rows) == list(range(6))
    assert all(len(rows) * max(lengths[list(rows)]) <= 250 for rows in cut)
    assert len(cut) == 2  # 100+100, then 60+30+10+5, four rows padded to 60: 240 tokens
