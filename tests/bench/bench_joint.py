"""Acceptance bench of joint control (issue 30), run by hand, not in CI:

    python tests/bench/bench_joint.py [--trials 500] [--rows 20000] [--cal-size 800]

On simulated tables of both scenarios (`harness.simulate_scores`, one probe seed), every cell of
a 5 x 5 grid of (budget, error) levels is validated over `--trials` random calibration samples
of `--cal-size` rows drawn from a `--rows`-row table (30% D_est, 70% D_cal), and each returned
policy is measured on the population (the table minus D_est) and on fresh rows from the same
generator (another table of `--rows` rows). A trial violates when its policy's delegations OR
errors exceed floor(alpha m) on the m rows measured. Printed per cell, as markdown:

- joint control (fixed-sequence, the default) and the fallback procedure: the population and
  fresh violation rates' 95% Clopper-Pearson upper bounds, the selection rate and the mean
  number of thresholds certified;
- the anti-conservative union variant (each risk tested alone at delta, a threshold certified
  when ANY test certifies it; `union_of_single_risk_tests` in tests/calibrate/test_joint.py):
  its population violation rate's 95% lower bound.

The script exits non-zero unless every cell's upper bound is at most delta + 0.02 for both
procedures and the union variant exceeds delta + 0.02 somewhere.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import calibrate
from calibrate import JointLevel, ValidationConfig
from harness import scores_from_columns, simulate_scores

# The anti-conservative variant is written once, beside the unit test that catches it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "calibrate"))
from test_joint import union_of_single_risk_tests

BUDGETS = (0.1, 0.2, 0.3, 0.4, 0.5)
# From near the probe alone's error (0.25 in both scenarios) down towards what a cascade reaches.
ERRORS = (0.15, 0.175, 0.2, 0.225, 0.25)
DELTA = 0.1
MARGIN = 0.02


def tables(scenario: str, rows: int) -> tuple[dict[int, calibrate.Scores], dict[int, calibrate.Scores]]:
    """The table the calibration samples come from, and fresh rows of the same generator."""
    drawn = scores_from_columns(simulate_scores(scenario, rows, 1, n_dev=0, random_state=0))  # type: ignore[arg-type]
    fresh = scores_from_columns(simulate_scores(scenario, rows, 1, n_dev=0, random_state=1))  # type: ignore[arg-type]
    return drawn.test_scores(), fresh.test_scores()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--cal-size", type=int, default=800)
    args = parser.parse_args()
    levels = [JointLevel(b, e) for b in BUDGETS for e in ERRORS]
    worst: dict[str, float] = {}
    union_worst = 0.0
    print(
        f"delta {DELTA}, {args.trials} trials per cell, --cal-size {args.cal_size} of {args.rows} rows "
        f"(D_est {round(0.3 * args.cal_size)}), fresh: {args.rows} other rows of the generator\n"
    )
    for scenario in ("strong", "weak"):
        by_seed, fresh = tables(scenario, args.rows)
        scores = by_seed[0]
        probe_error = float(np.mean(calibrate.predict(scores.probe) != scores.label.astype(bool)))
        expert_error = float(np.mean(calibrate.predict(scores.expert) != scores.label.astype(bool)))
        results = {}
        for fwer in ("fixed-sequence", "fallback"):
            config = ValidationConfig(trials=args.trials, cal_size=args.cal_size, delta=DELTA, fwer=fwer)  # type: ignore[arg-type]
            started = time.perf_counter()
            results[fwer] = calibrate.validate_joint(by_seed, levels=levels, config=config, fresh=fresh)
            print(f"{scenario}, {fwer}: {time.perf_counter() - started:.1f} s")
        config = ValidationConfig(trials=args.trials, cal_size=args.cal_size, delta=DELTA)
        union = calibrate.validate_joint(
            by_seed, levels=levels, config=config, fresh=fresh, procedure=union_of_single_risk_tests
        )
        print(
            f"\n### {scenario}: probe alone errs {probe_error:.3f}, expert alone {expert_error:.3f}\n\n"
            "| budget | error | FS pop. UB | FS fresh UB | FS selected | FS certified | "
            "FB pop. UB | FB fresh UB | FB selected | FB certified | empirical pop. rate | union pop. LB |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        )
        for k, level in enumerate(levels):
            cells = [f"{level.budget:g}", f"{level.error:g}"]
            for fwer, short in (("fixed-sequence", "FS"), ("fallback", "FB")):
                r = results[fwer][k]
                pop, new = r.tested.population, r.tested.fresh
                assert new is not None
                high = max(pop.violation.high, new.violation.high)
                worst[short] = max(worst.get(short, 0.0), high)
                certified = float(np.mean(r.per_trial["certified"]))
                cells += [
                    f"{pop.violation.high:.3f}",
                    f"{new.violation.high:.3f}",
                    f"{pop.selection_rate:.1%}",
                    f"{certified:.2f}",
                ]
            empirical = results["fixed-sequence"][k].empirical
            assert empirical is not None
            cells.append(f"{empirical.population.violation_rate:.1%}")
            low = union[k].tested.population.violation.low
            union_worst = max(union_worst, low)
            cells.append(f"{low:.3f}")
            print("| " + " | ".join(cells) + " |")
    print(
        f"\nmax 95% upper bound of the violation rate (population and fresh, every cell): fixed-sequence "
        f"{worst['FS']:.3f}, fallback {worst['FB']:.3f} (limit {DELTA + MARGIN:.2f}); union variant's "
        f"largest 95% lower bound {union_worst:.3f}"
    )
    held = max(worst.values()) <= DELTA + MARGIN
    caught = union_worst > DELTA + MARGIN
    print(f"joint guarantee held: {held}; union variant caught: {caught}")
    if not (held and caught):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
