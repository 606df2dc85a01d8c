"""The two AUROC routes over D_est (incremental path, and sort for a large D_est) agree."""

from __future__ import annotations

import numpy as np
import pytest

import calibrate

# Private: the two routes are internal; compared on their own.
import calibrate._splits as splits_module
from calibrate import policy_signal, threshold_candidates
from harness import scores_from_columns, simulate_scores


def test_large_dest_route_matches_the_incremental_path(monkeypatch: pytest.MonkeyPatch) -> None:
    table = scores_from_columns(simulate_scores("weak", 600, 1, n_dev=0))
    scores = table.test_scores()[0]
    splits = calibrate.random_splits(scores.n, 6, 0)
    signal = policy_signal(scores, calibrate.POLICIES["ctd"], splits)
    kwargs = dict(merge="overwrite", objective="auroc")
    by_path = threshold_candidates(scores, signal, splits, **kwargs)
    monkeypatch.setattr(splits_module, "_PATH_LIMIT", 10)
    by_sort = threshold_candidates(scores, signal, splits, **kwargs)
    np.testing.assert_allclose(by_path.est_objective, by_sort.est_objective, rtol=0, atol=1e-12)
