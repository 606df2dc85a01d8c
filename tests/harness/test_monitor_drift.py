"""The monitor's drift detector (`RateWatch`, an e-Shiryaev-Roberts e-detector) simulated through
its own class: false alarms at exactly the certified rate, the mean time to false alarm it
guarantees, and the delay to detect 2x drift from the start and after 50,000 good requests, each
side by side with the old sliding-window alarm (tests/window_alarm.py) on the same streams."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import numpy as np
import pytest
from ctd_cli import assert_one_line_error, run_ctd
from monitor_bundle import stand_in_record, write_untrained_bundle
from window_alarm import window_alarms

from harness import InputError
from harness.monitor import (
    DEFAULT_MTFA,
    JOINT_BUNDLE_VERSION,
    Bundle,
    BundleRecord,
    Monitor,
    RateWatch,
    Scored,
    read_bundle,
)

# Private: the decision log, whose write the two posts race.
from harness.monitor._decisions import DecisionLog
from harness.run import BundleLayout

STREAM = 100_000  # requests per false-alarm stream
GOOD_BEFORE = 50_000  # good requests before a late drift starts
AFTER = 5_000  # requests simulated after a drift starts (every detection so far took < 600)


def _streams(alpha: float, rate: float, before: int, count: int, seed: int) -> list[np.ndarray]:
    """`count` streams: `before` outcomes at alpha, then AFTER at `rate` (none when rate is None)."""
    out = []
    for number in range(count):
        rng = np.random.default_rng([seed, number])
        out.append(np.concatenate([rng.random(before) < alpha, rng.random(AFTER) < rate]))
    return out


def _first_after(alarm_times: list[int] | np.ndarray, start: int) -> int | None:
    """Requests from the change to the first alarm after it (None when none came)."""
    later = [int(t) - start for t in alarm_times if t > start]
    return later[0] if later else None


def test_extend_leaves_the_state_add_leaves_to_the_bit() -> None:
    rng = np.random.default_rng(7)
    stream = np.concatenate([rng.random(30_000) < 0.1, rng.random(3_000) < 0.25, rng.random(20_000) < 0.1])
    one_by_one, at_once, in_pieces = (RateWatch("delegation", 0.1, mtfa=1e3) for _ in range(3))
    raised = [a for a in (one_by_one.add(bool(x)) for x in stream) if a is not None]
    assert at_once.extend(stream) == raised and len(raised) > 5  # drift and false alarms at A = 1e3
    for piece in np.array_split(stream, [1, 2, 300, 7_000, 7_001, 40_000]):
        in_pieces.extend(piece)
    for other in (at_once, in_pieces):
        assert other.last == one_by_one.last  # the statistic to the bit, the counts, the alarms
        assert (other.first_raised, other.latest_raised) == (
            one_by_one.first_raised,
            one_by_one.latest_raised,
        )
        assert other.interval() == one_by_one.interval()


@pytest.mark.parametrize("alpha", [0.01, 0.1, 0.3, 0.9])
def test_every_bet_is_a_positive_fair_e_value_at_the_certified_rate(alpha: float) -> None:
    """From R_0 = 0 the first statistic is the mean e-value; at rate alpha its expectation is 1."""
    after_event, after_none = RateWatch("delegation", alpha), RateWatch("delegation", alpha)
    after_event.add(True)
    after_none.add(False)
    assert after_none.statistic > 0 and after_event.statistic > 1
    assert alpha * after_event.statistic + (1 - alpha) * after_none.statistic == pytest.approx(1, abs=1e-12)


def test_the_mean_time_to_false_alarm_is_at_least_the_threshold() -> None:
    """At A = 300 the statistic restarts after each alarm, so the gaps between alarms are
    independent draws of the time to a false alarm; their mean must not fall below A (measured
    1.07-1.15 A; 0.9 A is about 5 standard errors below the lowest)."""
    for alpha in (0.1, 0.3):
        watch = RateWatch("delegation", alpha, mtfa=300)
        seen = [
            a.seen
            for a in watch.extend(np.random.default_rng([11, round(alpha * 10)]).random(300_000) < alpha)
        ]
        gaps = np.diff([0, *seen])
        print(f"alpha {alpha}: {gaps.size} false alarms, mean time to one {gaps.mean() / 300:.3f} A")
        assert gaps.size > 600, (alpha, gaps.size)
        assert gaps.mean() >= 0.9 * 300, (alpha, gaps.mean())


def test_false_alarms_over_100000_requests_at_the_certified_rate_against_the_old_window_alarm() -> None:
    """The guarantee: P(a false alarm within m requests) <= m / A = 0.1% at the default A = 1e8, so
    the e-detector shows none in 24 streams (any at all has probability 2.4% at most). The same
    check fails on the old alarm: its 1e-4 per look over 2,000 looks false-alarmed in 3-8% of such
    streams (measured here 7 and 6 of 200, in bench_drift.py 6 and 8 of 100), so it is run on 200
    per alpha (cheap: vectorised) and shows some at each (none would have chance 0.2% at 3%)."""
    assert DEFAULT_MTFA == 1e8
    new_alarms, old_alarms = {}, {}
    for alpha in (0.1, 0.3):
        rngs = [np.random.default_rng([3, round(alpha * 10), n]) for n in range(200)]
        streams = [rng.random(STREAM) < alpha for rng in rngs]
        new_alarms[alpha] = sum(bool(RateWatch("delegation", alpha).extend(s)) for s in streams[:12])
        old_alarms[alpha] = sum(bool(window_alarms(s, alpha).size) for s in streams)
    print(f"streams with a false alarm: e-detector {new_alarms} of 12, old window {old_alarms} of 200")
    assert new_alarms == {0.1: 0, 0.3: 0}
    assert old_alarms[0.1] >= 1 and old_alarms[0.3] >= 1


@pytest.mark.parametrize(
    ("alpha", "before", "new_within", "old_median_above"),
    [(0.1, 0, 800, None), (0.3, 0, 250, None), (0.1, GOOD_BEFORE, 800, None), (0.3, GOOD_BEFORE, 250, 1.5)],
)
def test_twice_the_certified_rate_is_detected_within_a_stated_delay_against_the_old_window_alarm(
    alpha: float, before: int, new_within: int, old_median_above: float | None
) -> None:
    """Every one of 16 streams detects 2x drift within `new_within` requests (measured at most 556
    at alpha 0.1 and 176 at 0.3). After 50,000 good requests the e-detector's evidence is as ready
    as at the start while the old window still holds good requests: its median delay is then
    shorter than the old alarm's by a stated factor (measured 400/302 = 1.3 and 200/79 = 2.5)."""
    new_delays, old_delays = [], []
    for stream in _streams(alpha, 2 * alpha, before, 16, seed=5):
        watch = RateWatch("delegation", alpha)
        new_delays.append(_first_after([a.seen for a in watch.extend(stream)], before))
        old_delays.append(_first_after(window_alarms(stream, alpha), before))
        assert watch.alarm and watch.last.statistic < watch.threshold  # latched, and restarted
    print(f"alpha {alpha}, drift after {before}: e-detector delays {new_delays}, old window {old_delays}")
    assert all(d is not None and d <= new_within for d in new_delays), new_delays
    assert all(d is not None for d in old_delays), old_delays
    if old_median_above is not None:
        assert np.median(old_delays) >= old_median_above * np.median(new_delays)


@pytest.mark.parametrize(("mode", "risk"), [("budget", "delegation"), ("performance", "error")])
def test_metrics_show_the_certified_watch_evidence_threshold_and_latched_alarm(
    tmp_path: Path, mode: str, risk: str
) -> None:
    """`Monitor.prometheus()` without a model: the scorer is only used by a forward pass."""
    record = BundleRecord.from_json(stand_in_record(mode=mode, alpha=0.2), tmp_path / "bundle.json")
    bundle = Bundle(BundleLayout(tmp_path), record)
    monitor = Monitor(bundle, None, gate=None, drift_mtfa=150)  # type: ignore[arg-type]
    watch = monitor.delegation if risk == "delegation" else monitor.errors
    before = monitor.prometheus().splitlines()
    assert f'ctd_monitor_drift_alarm{{risk="{risk}"}} 0.0' in before
    assert f'ctd_monitor_drift_threshold{{risk="{risk}"}} 150.0' in before
    assert watch.extend(np.ones(100, bool)) and watch.extend(np.zeros(3, bool)) == []
    after = monitor.prometheus().splitlines()
    assert f'ctd_monitor_drift_alarm{{risk="{risk}"}} 1.0' in after
    assert f'ctd_monitor_drift_alarms{{risk="{risk}"}} {float(watch.alarms)!r}' in after and watch.alarms >= 1
    assert f'ctd_monitor_drift_evidence{{risk="{risk}"}} {watch.statistic!r}' in after
    assert f'ctd_monitor_drift_requests_since_restart{{risk="{risk}"}} {float(watch.since)!r}' in after
    other = "error" if risk == "delegation" else "delegation"  # the uncertified watch only counts
    assert not any(line.startswith("ctd_monitor_drift_") and other in line for line in after)


def test_a_joint_bundle_watches_and_shows_each_certified_risk_and_refuses_a_cap(tmp_path: Path) -> None:
    """A joint record (version 3): each level is a `certified_alpha` gauge, the delegation and
    error watches run at their own levels, and a cap on expert calls is refused (it would void
    the error and false-negative parts)."""
    levels = {"budget": 0.3, "error": 0.15, "fnr": 0.1}
    joint = stand_in_record(version=JOINT_BUNDLE_VERSION, mode="joint", alpha=None, levels=levels)
    bundle = Bundle(BundleLayout(tmp_path), BundleRecord.from_json(joint, tmp_path / "bundle.json"))
    monitor = Monitor(bundle, None, gate=None, drift_mtfa=150)  # type: ignore[arg-type]
    assert (monitor.delegation.target, monitor.errors.target) == (0.3, 0.15)
    shown = monitor.prometheus().splitlines()
    for risk, level in (("delegation", 0.3), ("error", 0.15), ("fnr", 0.1)):
        assert f'ctd_monitor_certified_alpha{{risk="{risk}"}} {level!r}' in shown
    for risk in ("delegation", "error"):  # both certified risks the monitor observes are watched
        assert f'ctd_monitor_drift_threshold{{risk="{risk}"}} 150.0' in shown
    with pytest.raises(
        InputError, match=r"--max-delegation-rate: .* certifies an error at most 0\.15 and a "
    ):
        Monitor(bundle, None, gate=None, max_delegation_rate=0.2)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["10", "nan"])  # the bounds themselves: test_monitor_parts.py
def test_serve_refuses_a_drift_mtfa_out_of_bounds_in_one_line_before_reading_the_bundle(
    tmp_path: Path, value: str
) -> None:
    result = run_ctd("monitor", "serve", str(tmp_path / "absent"), "--drift-mtfa", value, cwd=tmp_path)
    assert_one_line_error(result, "--drift-mtfa", "must lie in [100, 1e+12]")


class InstantScorer:
    """A scorer that answers at once: every conversation certain, never delegated."""

    gone = None
    pass_cost = None

    async def score(self, batch: list[object]) -> tuple[list[Scored], float]:
        return [Scored(0.9, -1.0, False) for _ in batch], 0.001

    async def aclose(self) -> None:
        return None


def test_a_label_posted_twice_at_once_counts_once(tmp_path: Path) -> None:
    """Two posts of one decision's label while the decision log writes the first: one is taken,
    the other refused as already labelled; the log holds one feedback record. (Marked labelled
    only after the write, both were taken and counted.)"""
    record = BundleRecord.from_json(stand_in_record(mode="performance", alpha=0.2), tmp_path / "bundle.json")
    bundle = Bundle(BundleLayout(tmp_path), record)
    log_path = tmp_path / "decisions.jsonl"
    monitor = Monitor(bundle, InstantScorer(), gate=None, decisions=DecisionLog(log_path))  # type: ignore[arg-type]

    async def post_twice() -> list[object]:
        try:
            decision = await monitor.check("hello")
            twice = [monitor.feedback(decision.request_id, 0) for _ in range(2)]
            return await asyncio.gather(*twice, return_exceptions=True)
        finally:
            await monitor.aclose()

    outcomes = asyncio.run(post_twice())
    assert outcomes.count(True) == 1, outcomes
    assert [type(o) for o in outcomes if o is not True] == [InputError], outcomes
    events = [json.loads(line)["event"] for line in log_path.read_text().splitlines()]
    assert events.count("feedback") == 1, events


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"alpha": 1.5}, "alpha 1.5 must lie in (0, 1)"),
        ({"delta": 0.0}, "delta 0.0 must lie in (0, 1)"),
        ({"threshold": "nan"}, "a threshold is not a number"),
    ],
)
def test_a_record_out_of_range_is_refused_as_it_is_read(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    """A level outside (0, 1) stopped `ctd monitor serve` in a traceback once the model had loaded;
    a NaN threshold served, delegated nothing and made /healthz a 500."""
    with pytest.raises(InputError, match=re.escape(message)):
        BundleRecord.from_json(stand_in_record(**changes), tmp_path / "bundle.json")


def test_a_damaged_expert_calibration_is_refused_when_the_bundle_is_read(tmp_path: Path) -> None:
    """Found when the first delegated request had paid the expert, as a 422 blaming the request."""
    folder = write_untrained_bundle(tmp_path / "bundle")
    record = json.loads((folder / "bundle.json").read_text())
    record["expert"] = {"calibration": {"kind": "contextual"}}  # no shift
    (folder / "bundle.json").write_text(json.dumps(record))
    with pytest.raises(InputError, match="expert calibration: missing field 'shift'"):
        read_bundle(folder)
