"""The library's input checks: Scores refuses bad values; the policy registry matches its literals."""

from __future__ import annotations

from typing import get_args

import numpy as np
import pytest

import calibrate


def test_scores_reject_bad_values() -> None:
    good = dict(label=np.array([0, 1]), probe=np.array([0.2, 0.8]), expert=np.array([0.1, 0.9]))
    with pytest.raises(ValueError, match="labels"):
        calibrate.Scores(**{**good, "label": np.array([0, 2])}, dv=np.zeros(2))
    with pytest.raises(ValueError, match="probe"):
        calibrate.Scores(**{**good, "probe": np.array([0.2, np.nan])}, dv=np.zeros(2))
    with pytest.raises(ValueError, match="dv"):
        calibrate.Scores(**good, dv=np.array([0.0, np.inf]))


def test_policy_registry_matches_its_literals() -> None:
    assert tuple(calibrate.POLICIES) == calibrate.POLICY_NAMES
    calibrated = tuple(p.name for p in calibrate.POLICIES.values() if p.calibrated)
    assert calibrated == get_args(calibrate.CalibratedPolicyName)
