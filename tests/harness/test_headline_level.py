"""The headline error level of performance control: without --performance-alpha, the smallest
validated level at which CTD returned a policy in at least MIN_SELECTION of the trials (the
default run's selection rates pick 0.3, where the empirical selector violates and CTD does not);
with it, that level, read back from config.toml as a float."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import InputError
from harness.run import MIN_SELECTION, RunConfig, load_run_config

# Private: the rule that picks a job's headline level.
from harness.stages._validate import headline_level

# CTD's selection rates at alpha 0.05 ... 0.5 in the default run (report/tables/.../validation.csv).
DEFAULT_RUN = [0.0, 0.0, 0.0, 0.008, 0.062, 0.276, 0.658, 0.926, 0.984, 0.998]  # --expert-calibration dev


def _levels(rates: list[float]) -> list[dict[str, float]]:
    return [{"alpha": round(0.05 * (i + 1), 2), "selection_rate": r} for i, r in enumerate(rates)]


def test_the_smallest_level_where_ctd_returns_a_policy_often_enough() -> None:
    assert MIN_SELECTION == 0.1
    assert headline_level(_levels(DEFAULT_RUN)) == (0.3, "smallest-certifiable")
    # Exactly MIN_SELECTION counts; a level after it does not matter.
    assert headline_level(_levels([0.0, 0.1, 0.9])) == (0.1, "smallest-certifiable")


def test_no_level_certifiable_often_enough_takes_the_most_selected() -> None:
    assert headline_level(_levels([0.0, 0.06, 0.02, 0.06])) == (0.1, "most-selected")  # ties: the smallest
    assert headline_level(_levels([0.0, 0.0])) == (0.05, "most-selected")


def test_the_level_is_left_to_the_validate_stage_unless_given(tmp_path: Path) -> None:
    default = RunConfig()
    assert default.performance_alpha is None
    assert "# performance_alpha = (default)" in default.to_toml()
    config = tmp_path / "config.toml"
    config.write_text(default.to_toml(), encoding="utf-8")
    assert load_run_config(config, {}) == default
    config.write_text("[run]\nperformance_alpha = 0.3\n", encoding="utf-8")
    assert load_run_config(config, {}).performance_alpha == 0.3  # a float field that may be None
    config.write_text("[run]\nperformance_alpha = 1\n", encoding="utf-8")  # an int is a number
    with pytest.raises(InputError, match=r"--performance-alpha: 1\.0 is outside"):
        load_run_config(config, {})
    config.write_text('[run]\nperformance_alpha = "low"\n', encoding="utf-8")
    with pytest.raises(InputError, match="'performance_alpha' must be float"):
        load_run_config(config, {})
