"""Validation of K-stage cascades at every level of a grid (run by hand, not in CI):

    python tests/bench/bench_cascade.py [--trials 500] [--stages 2]

On simulated cascades (`ctd simulate --stages K`, both scenarios; one seed of 20,000 test rows
to calibrate on, and another table of 20,000 drawn with another random state to measure on),
each trial calibrates on 800 random rows (30% D_est, 70% D_cal) and certifies every
configuration of the product grid jointly: each expert's budget, the cascade's error and, on
some levels, the abstention rate. The chosen configuration is measured on the population (the
table minus D_est) and on the fresh table, per risk and jointly, with the empirical selector
(every configuration whose D_cal counts meet the levels) beside it. Prints one markdown row per
level, and the largest 95% Clopper-Pearson upper bound of the joint violation rate of the
tested selector, which must stay at or below delta + 0.02.
"""

from __future__ import annotations

import argparse
import itertools
import time

import calibrate
from harness.data import scores_from_columns, simulate_scores

DELTA = calibrate.DEFAULT_DELTA
# Error levels per scenario: between the first expert's error and the last one's, where the
# later stages are needed for some and not for others.
ERRORS = {"strong": (0.15, 0.2), "weak": (0.2, 0.25)}
FIRST_BUDGETS = (0.3, 0.5)
LATER_BUDGETS = (0.1, 0.2)


def levels_for(scenario: str, stages: int) -> list[calibrate.CascadeLevels]:
    later = [LATER_BUDGETS] * (stages - 1)
    grid = [
        calibrate.CascadeLevels((first, *rest), error=error)
        for first, *rest in itertools.product(FIRST_BUDGETS, *later)
        for error in ERRORS[scenario]
    ]
    # With a human at the end: abstain on at most 10% and hold a lower error.
    grid += [
        calibrate.CascadeLevels((0.5, *[0.2] * (stages - 1)), error=ERRORS[scenario][0] - 0.05, abstain=0.1),
        calibrate.CascadeLevels((0.3, *[0.1] * (stages - 1)), error=ERRORS[scenario][0], abstain=0.1),
    ]
    return grid


def ci(interval: calibrate.ProportionCI) -> str:
    return f"{interval.proportion:.1%} [{interval.low:.1%}, {interval.high:.1%}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=calibrate.DEFAULT_TRIALS)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args()
    print(
        "| scenario | levels | LTT selected | LTT population | LTT fresh | LTT fresh by risk | "
        "empirical fresh |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    worst = 0.0
    for scenario in ("strong", "weak"):
        table = scores_from_columns(simulate_scores(scenario, args.rows, 1, stages=args.stages, n_dev=1))
        fresh = scores_from_columns(
            simulate_scores(scenario, args.rows, 1, stages=args.stages, n_dev=1, random_state=1)
        )
        started = time.perf_counter()
        results = calibrate.validate_cascade(
            table.cascade_scores(),
            levels=levels_for(scenario, args.stages),
            trials=args.trials,
            cal_size=800,
            fresh=fresh.cascade_scores(),
        )
        for result in results:
            named = ", ".join(f"{name} {level:g}" for name, level in result.levels.named())
            by_risk = ", ".join(f"{k} {v}" for k, v in result.risk_violations["ltt"]["fresh"].items())
            tested = result.violation["ltt"]
            worst = max(worst, tested["population"].high, tested["fresh"].high)
            print(
                f"| {scenario} | {named} | {result.selection['ltt'].proportion:.1%} | "
                f"{ci(tested['population'])} | {ci(tested['fresh'])} | {by_risk} | "
                f"{ci(result.violation['empirical']['fresh'])} |"
            )
        print(
            f"\n{scenario}: {len(results)} levels x {args.trials} trials "
            f"in {time.perf_counter() - started:.1f} s\n"
        )
    verdict = "holds" if worst <= DELTA + 0.02 else "FAILS"
    print(
        f"largest 95% upper bound of the tested selector's violation rate: {worst:.3f} "
        f"({verdict}: <= {DELTA + 0.02:g})"
    )


if __name__ == "__main__":
    main()
