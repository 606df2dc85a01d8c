"""The expert's label prior, divided out: a logit shift fitted once and applied to every raw expert
score P(high) before anything else reads it (the DV targets, the sweeps, the report, a monitor).

Both methods are one shift b on the logit scale, p' = sigmoid(logit(p) + b):

- contextual (Zhao et al. 2021, "Calibrate Before Use"): q = the mean P(high) the expert gives
  content-free inputs; p' is proportional to (p / q, (1 - p) / (1 - q)), that is b = -logit(q);
- dev: b maximises the Bernoulli log-likelihood of the dev split's labels under p' (one parameter,
  the dev split only: the test split's labels never reach it).

A score of exactly 0 or 1 (next-token scoring gives one when the other label's token is not
among the top logprobs) is certain: no shift moves it, so it stays as it is, it has no say in
the dev fit (its likelihood is the same for every b), and a content-free prior of exactly 0 or 1
cannot be divided out.

Pure numpy; the expert is asked elsewhere (the content-free inputs are ordinary items through the
same client, template and cache).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

__all__ = [
    "CONTENT_FREE_INPUTS",
    "EXPERT_CALIBRATIONS",
    "ExpertCalibration",
    "ExpertCalibrationKind",
    "contextual_calibration",
    "fit_logit_shift",
]

ExpertCalibrationKind = Literal["none", "contextual", "dev"]
EXPERT_CALIBRATIONS: tuple[ExpertCalibrationKind, ...] = get_args(ExpertCalibrationKind)

# The content-free inputs of contextual calibration (the paper's "N/A", "" and "[MASK]"): what the
# expert says about no content at all is its prior.
CONTENT_FREE_INPUTS: tuple[str, ...] = ("N/A", "", "[MASK]")

# Scores are clipped this far from 0 and 1 on the logit scale, so that `apply` computes a finite
# logit for a score of exactly 0 or 1 before it keeps that score as it is.
_EPS = 1e-12


def _logit(p: np.ndarray) -> np.ndarray:
    """logit(p) = log(p / (1 - p)), p clipped to [eps, 1 - eps]."""
    clipped = np.clip(p, _EPS, 1 - _EPS)
    return np.log(clipped) - np.log1p(-clipped)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    """sigmoid(z) = 1 / (1 + exp(-z)), without overflow."""
    return np.exp(-np.logaddexp(0.0, -z))


@dataclass(frozen=True)
class ExpertCalibration:
    """A fitted calibration of the expert's P(high): `apply(p)` = sigmoid(logit(p) + shift).
    `kind` "none" is the identity (shift 0). `prior` is contextual's q (mean P(high) on the
    content-free inputs), `n` how many scores the fit read (content-free inputs, or dev rows
    scored strictly between 0 and 1)."""

    kind: ExpertCalibrationKind = "none"
    shift: float = 0.0
    prior: float | None = None
    n: int = 0

    def __post_init__(self) -> None:
        if self.kind not in EXPERT_CALIBRATIONS:
            raise ValueError(
                f"expert calibration {self.kind!r}: choose from {', '.join(EXPERT_CALIBRATIONS)}"
            )
        if not math.isfinite(self.shift):
            raise ValueError(f"expert calibration {self.kind}: shift {self.shift!r} is not finite")
        if self.kind == "none" and self.shift != 0.0:
            raise ValueError("expert calibration none: shift must be 0")

    def apply(self, p: np.ndarray | float) -> np.ndarray:
        """p' = sigmoid(logit(p) + shift); NaN (no expert score) stays NaN, "none" returns p as given."""
        scores = np.asarray(p, dtype=np.float64)
        if self.kind == "none":
            return scores
        with np.errstate(invalid="ignore"):
            shifted = _sigmoid(_logit(scores) + self.shift)
        # a certain answer (0 or 1) stays certain; NaN (no score) stays NaN
        return np.where((scores == 0) | (scores == 1) | np.isnan(scores), scores, shifted)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "shift": self.shift, "prior": self.prior, "n": self.n}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> ExpertCalibration:
        """The calibration a `to_json` wrote (ValueError on a bad field)."""
        prior = record.get("prior")
        return cls(
            kind=record["kind"],
            shift=float(record["shift"]),
            prior=None if prior is None else float(prior),
            n=int(record.get("n", 0)),
        )


def contextual_calibration(content_free_scores: Sequence[float] | np.ndarray) -> ExpertCalibration:
    """q = mean P(high) over the content-free inputs; shift = -logit(q), so p' ~ (p / q, (1-p) / (1-q))."""
    scores = np.asarray(content_free_scores, dtype=np.float64)
    scores = scores[np.isfinite(scores)]
    if scores.size == 0:
        raise ValueError("contextual calibration: the expert scored none of the content-free inputs")
    prior = float(scores.mean())
    if prior in (0.0, 1.0):
        raise ValueError(
            f"contextual calibration: the expert gave every content-free input P(high) = {prior:g} "
            "exactly (the other label's token was not among its top logprobs), a prior that cannot "
            "be divided out"
        )
    return ExpertCalibration(
        "contextual", shift=float(-_logit(np.array(prior))), prior=prior, n=int(scores.size)
    )


def fit_logit_shift(scores: np.ndarray, labels: np.ndarray) -> ExpertCalibration:
    """b = argmax_b sum y log s(z+b) + (1-y) log(1-s(z+b)), z = logit(p), over the rows with 0 < p < 1
    (those `apply` moves): the b where their mean s(z+b) = their mean y; 0 when those rows hold one
    label only (or none), as no finite b is then best."""
    p = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if p.shape != y.shape or p.ndim != 1:
        raise ValueError(f"dev calibration: {p.shape} scores for {y.shape} labels")
    keep = np.isfinite(p)
    p, y = p[keep], y[keep]
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("dev calibration: labels must be 0 or 1")
    if p.size == 0 or y.min() == y.max():
        raise ValueError(
            f"dev calibration: needs both labels among the scored dev examples "
            f"({int(y.sum())} high of {y.size})"
        )
    movable = (p > 0) & (p < 1)
    p, y = p[movable], y[movable]
    if p.size == 0 or y.min() == y.max():
        # No finite shift is best (the likelihood of what it moves only grows toward one end):
        # the scores stay as the expert gave them.
        return ExpertCalibration("dev", shift=0.0, n=int(p.size))
    z, target = _logit(p), float(y.mean())
    # The log-likelihood is concave in b and its derivative sum(y - s(z + b)) falls from n * mean y
    # to -n * (1 - mean y): one root, bracketed where every s(z + b) is past the mean label.
    low, high = float(-z.max() - 50.0), float(-z.min() + 50.0)
    for _ in range(200):  # bisection: the bracket halves each step, to float resolution
        middle = 0.5 * (low + high)
        if _sigmoid(z + middle).mean() < target:
            low = middle
        else:
            high = middle
        if high - low < 1e-12:
            break
    return ExpertCalibration("dev", shift=0.5 * (low + high), n=int(p.size))
