"""What the report shows of the DV probe itself: its quality per seed, from summary.json, and
one millisecond-scale library call on the scores table, the mean v of the top-k rows by each
signal (no stage writes it)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

import calibrate

from .._errors import InputError
from ._data import Sweep

__all__ = ["MEAN_V_FRACTIONS", "MEAN_V_SIGNALS", "dv_quality_rows", "mean_value_curves"]

# k/N = 0.01, ..., 1: k / 100 is correctly rounded, so 0.05 here == the literal 0.05.
MEAN_V_FRACTIONS: NDArray[np.float64] = np.arange(1, 101) / 100


def dv_quality_rows(sweep: Sweep, by_seed: dict[int, calibrate.Scores]) -> list[dict[str, Any]]:
    """The DV quality per seed that `calibrate_scores` wrote into summary.json: MSE and Spearman
    of the DV score against the true v on each seed's test rows, and n, their number (counted in
    the scores table when an older summary.json lacks it)."""
    found = sweep.summary.get("dv_quality")
    if not isinstance(found, dict):
        raise InputError(f"{sweep.files.summary}: no 'dv_quality' (run `ctd calibrate` again)")
    rows = []
    for seed, q in sorted(found.items(), key=lambda item: int(item[0])):
        n = q.get("n", by_seed[int(seed)].n if int(seed) in by_seed else -1)
        rows.append(
            {
                "seed": int(seed),
                "n": int(n),
                "mse": _number(q.get("mse")),
                "spearman": _number(q.get("spearman")),
            }
        )
    return rows


def _number(value: object) -> float:
    return float("nan") if value is None else float(value)  # JSON writes NaN as null


MEAN_V_SIGNALS: tuple[str, ...] = ("dv", "uncertainty", "oracle")


def mean_value_curves(by_seed: dict[int, calibrate.Scores]) -> dict[str, NDArray[np.float64]]:
    """Mean v of the top-k test rows by each signal, k/N on MEAN_V_FRACTIONS: an array of
    shape (seeds, fractions) per signal, plus "all" (mean v of every row, shape (seeds,)).
    Uncertainty ranks by closeness to the median probe score of the seed's test rows."""
    out: dict[str, list] = {name: [] for name in (*MEAN_V_SIGNALS, "all")}
    for _, scores in sorted(by_seed.items()):
        value = scores.value
        signals = {
            "dv": scores.dv,
            "uncertainty": calibrate.uncertainty_signal(scores.probe, scores.probe),
            "oracle": value,
        }
        for name, signal in signals.items():
            out[name].append(calibrate.mean_value_at_k(signal, value, MEAN_V_FRACTIONS))
        out["all"].append(float(value.mean()))
    return {name: np.array(values, dtype=np.float64) for name, values in out.items()}
