"""Benchmark of the calibration engine (run by hand, not in CI):

    python tests/bench/bench_calibrate.py

1. The whole default sweep (5 policies x 20 budgets x 3 batch sizes x 3 seeds x 2 objectives)
   on a 1,600-row test split per seed. Target: under 2 s on 2 cores.
2. 500-trial guarantee validation at one budget, in the variants `ctd validate` offers.
   Target: under 1 s.
3. The same 500 trials through MAPIE's `BinaryClassificationController` (budget risk,
   fixed-sequence testing, 100 thresholds), one `calibrate` call per trial on the same D_cal
   examples. Target: validation at least 20x faster.

Everything is timed in one run, side by side, and reported as medians and ratios.
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from timing import timings

import calibrate
from harness import scores_from_columns, simulate_scores

TRIALS = 500
ALPHA = 0.3
DELTA = 0.1


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    return statistics.median(timings(run, repeats))


def scores_by_seed() -> dict[int, calibrate.Scores]:
    return scores_from_columns(simulate_scores("strong", 1600, 3, n_dev=0)).test_scores()


def mapie_per_trial(scores: calibrate.Scores, trials: int) -> Callable[[], object]:
    """One MAPIE controller calibration per trial, on each trial's D_cal, thresholding the DV
    score (as a rank in [0, 1], since MAPIE thresholds probabilities)."""
    from mapie.risk_control import BinaryClassificationController

    splits = calibrate.random_splits(scores.n, trials, [0, 0])
    rank = np.argsort(np.argsort(scores.dv)) / (scores.n - 1)

    def predict(index: np.ndarray) -> np.ndarray:
        u = rank[index[:, 0]]
        return np.column_stack([1 - u, u])

    def run() -> object:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for cal in splits.cal:
                controller = BinaryClassificationController(
                    predict_function=predict,
                    risk="predicted_positive_fraction",
                    target_level=ALPHA,
                    confidence_level=1 - DELTA,
                    best_predict_param_choice="precision",
                    list_predict_params=np.linspace(0, 0.99, 100),
                    fwer_method="fixed_sequence",
                )
                controller.calibrate(cal[:, None], scores.label[cal])
        return controller

    return run


def main() -> None:
    by_seed = scores_by_seed()
    one_seed = {0: by_seed[0]}
    rows: list[tuple[str, float, str]] = []

    sweep = median_seconds(lambda: calibrate.sweep(by_seed), repeats=5)
    rows.append(("default sweep, 1,800 rows (3 seeds x 1,600 test rows)", sweep, "< 2 s"))

    config = calibrate.ValidationConfig(delta=DELTA, trials=TRIALS)
    variants: dict[str, tuple[calibrate.ValidationMode, float, calibrate.ValidationConfig]] = {
        "budget, Pareto on AUROC (`ctd validate` default)": ("budget", ALPHA, config),
        "budget, Pareto on accuracy": ("budget", ALPHA, replace(config, objective="accuracy")),
        "budget-only LTT (`--no-pareto`)": ("budget", ALPHA, replace(config, pareto=False)),
        "performance, alpha = 0.2, with the empirical selector": ("performance", 0.2, config),
    }
    timings = {}
    for name, (mode, alpha, options) in variants.items():
        timings[name] = median_seconds(
            lambda m=mode, a=alpha, c=options: calibrate.validate(one_seed, mode=m, alpha=a, config=c),
            repeats=5,
        )

    mapie = median_seconds(mapie_per_trial(by_seed[0], TRIALS), repeats=3)
    for name, seconds in timings.items():
        rows.append((f"{TRIALS}-trial validation: {name}", seconds, f"< 1 s; {mapie / seconds:.1f}x MAPIE"))
    rows.append((f"MAPIE BinaryClassificationController x {TRIALS} trials", mapie, "reference"))

    print("| what | median time | target / ratio |")
    print("| --- | --- | --- |")
    for name, seconds, note in rows:
        print(f"| {name} | {seconds * 1000:.0f} ms | {note} |")


if __name__ == "__main__":
    main()
