"""Fixtures of the `ctd` command-line tests: a good scores table on disk (`scores`) and the
columns of a smaller good table for planting defects (`base`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cli_checks import assert_ok, ctd

from harness import simulate_scores


@pytest.fixture(scope="module")
def scores(tmp_path_factory) -> Path:
    """A good table: 400 test + 400 dev rows under 2 seeds."""
    path = tmp_path_factory.mktemp("good") / "s.parquet"
    assert_ok(ctd("simulate", "--scenario", "weak", "--n", 400, "--seeds", 2, "--out", path))
    return path


@pytest.fixture(scope="module")
def base() -> dict[str, np.ndarray]:
    """Columns of a smaller good table for planting defects: 200 test + 200 dev rows x 2 seeds;
    data rows 0-199 are seed 0's test split."""
    return simulate_scores("strong", 200, 2, random_state=1)
