"""Delegation policies of a K-stage cascade: what each stage's threshold cuts.

"ctd" cuts each stage's DV score d_k (the predicted value of expert k's answer). "uncertainty"
cuts the uncertainty of the score the cascade holds when an input reaches stage k, the
probe's at stage 1 and expert k-1's at stage k > 1: -|s - 0.5|, highest where s is nearest the
decision boundary. It is a fixed function of the scores (no fitted reference), so the same
grid, joint tests and choice (`cascade_control_batch`) certify it as they certify CTD.

The one-expert "unc-calibrated" policy ranks by -|F(p) - 0.5|, F the empirical CDF of the
D_est probe scores of a trial (`uncertainty_signal`): proximity to the median probe score,
fitted per trial. A cascade's signal is one (K, n) array shared by every trial, so here the
boundary is 0.5 itself, the same one the cascade predicts and abstains by.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal, get_args

import numpy as np

from ._cascade import CascadeScores

__all__ = ["CASCADE_POLICIES", "CascadePolicy", "cascade_policy_scores", "uncertainty_signals"]

CascadePolicy = Literal["ctd", "uncertainty"]
CASCADE_POLICIES: tuple[str, ...] = get_args(CascadePolicy)


def uncertainty_signals(scores: CascadeScores) -> CascadeScores:
    """The same scores with stage k's delegation signal -|s_{k-1} - 0.5| (s_0: the probe's,
    s_j: expert j's score), the uncertainty of the score an input holds on reaching stage k."""
    held = scores.stage_scores[:-1]
    return replace(scores, dv=-np.abs(held - 0.5))


def cascade_policy_scores(scores: CascadeScores, policy: str) -> CascadeScores:
    """The scores whose `dv` rows are the policy's per-stage signal (ctd: unchanged)."""
    if policy == "ctd":
        return scores
    if policy == "uncertainty":
        return uncertainty_signals(scores)
    raise ValueError(f"unknown cascade policy {policy!r}; choose from {', '.join(CASCADE_POLICIES)}")
