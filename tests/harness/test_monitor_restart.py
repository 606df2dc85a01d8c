"""What a monitor keeps across checks and restarts, without a model: the delegation cap's window
goes on from the decision log, each check has its own request id (one label per decision), and
only an expert's score (not a failure) is reused for a retry after the log refused a request.
Also the expert entry's and `--max-delegation-rate`'s refusals at start, in one line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from monitor_bundle import stand_in_record, write_untrained_bundle

from harness import InputError
from harness.monitor import DelegationCap, Monitor, read_bundle

# Private: the pieces a Monitor is built from, stood in for (no model, no expert server).
from harness.monitor._bundle import Bundle, BundleRecord
from harness.monitor._decisions import DecisionLog
from harness.monitor._engine import Scored
from harness.monitor._errors import LogUnavailable
from harness.run import BundleLayout


class KeywordScorer:
    """Delegates (DV far above any threshold) exactly the conversations that say "delegate"."""

    gone = None
    pass_cost = None

    async def score(self, batch: list[object]) -> tuple[list[Scored], float]:
        return [Scored(0.4, 10.0 if "delegate" in str(c) else -10.0, False) for c in batch], 0.001

    async def aclose(self) -> None:
        return None


class CountingGate:
    """An expert that answers `answers` in turn (a score, or None with a failure reason)."""

    down = False

    def __init__(self, *answers: tuple[float | None, str | None]) -> None:
        self.answers = list(answers)
        self.asked = 0

    async def ask(self, item: object) -> tuple[float | None, str | None]:
        self.asked += 1
        return self.answers.pop(0) if self.answers else (0.9, None)

    async def aclose(self) -> None:
        return None


def _bundle(folder: Path) -> Bundle:
    record = BundleRecord.from_json(stand_in_record(mode="budget", alpha=0.2), folder / "bundle.json")
    return Bundle(BundleLayout(folder), record)


def _monitor(folder: Path, gate: CountingGate, **options: object) -> Monitor:
    log = DecisionLog(folder / "decisions.jsonl")
    return Monitor(_bundle(folder), KeywordScorer(), gate=gate, decisions=log, **options)  # type: ignore[arg-type]


def _check_all(monitor: Monitor, texts: list[str]) -> list[object]:
    async def run() -> list[object]:
        try:
            return [await monitor.check(text) for text in texts]
        finally:
            await monitor.aclose()

    return asyncio.run(run())


def test_the_delegation_cap_goes_on_from_the_log_after_a_restart(tmp_path: Path) -> None:
    """Cap 0.1: at most 20 calls in any 200 requests. A server that took its 20 and restarted
    used to start from an empty window and call the expert on every delegated request."""
    texts = [f"fine {i}" for i in range(180)] + [f"delegate {i}" for i in range(20)]
    first = CountingGate()
    _check_all(_monitor(tmp_path, first, max_delegation_rate=0.1), texts)
    assert first.asked == 20
    second = CountingGate()
    decisions = _check_all(
        _monitor(tmp_path, second, max_delegation_rate=0.1), [f"delegate b{i}" for i in range(20)]
    )
    assert second.asked == 0 and {d.reason for d in decisions} == {"delegation-cap"}  # type: ignore[attr-defined]
    records = [json.loads(line) for line in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    calls = [r["delegated"] and r["reason"] != "delegation-cap" for r in records if r["event"] == "decision"]
    assert len(calls) == 220 and max(sum(calls[i : i + 200]) for i in range(21)) == 20


def test_a_cap_under_one_call_in_200_widens_its_window_rather_than_calling_nothing() -> None:
    cap = DelegationCap(0.004)  # 0.8 calls in 200 requests: none was ever allowed
    assert cap.window == 250
    calls = [cap.allow(True) for _ in range(10_000)]
    assert sum(calls) == 40 and max(sum(calls[i : i + 250]) for i in range(0, 10_000 - 250)) == 1
    with pytest.raises(InputError, match=r"must lie in \[0.0001, 1\]"):
        DelegationCap(1e-5)


def test_each_check_has_its_own_request_id_and_takes_one_label(tmp_path: Path) -> None:
    """The id was a hash of the text: a second check of the same text took the first's id, and
    with it reset the first's label, so one decision could be labelled twice."""
    monitor = _monitor(tmp_path, CountingGate())

    async def run() -> tuple[object, object, list[object]]:
        try:
            first = await monitor.check("hello there")
            assert await monitor.feedback(first.request_id, 1)
            second = await monitor.check("hello there")
            again = await asyncio.gather(monitor.feedback(first.request_id, 1), return_exceptions=True)
            return first, second, again
        finally:
            await monitor.aclose()

    first, second, again = asyncio.run(run())
    assert first.request_id != second.request_id  # type: ignore[attr-defined]
    assert first.input_hash == second.input_hash  # type: ignore[attr-defined]
    assert [type(a) for a in again] == [InputError]
    records = [json.loads(line) for line in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records].count("feedback") == 1


def test_a_retry_after_a_refused_log_reuses_a_score_but_asks_again_after_a_failure(tmp_path: Path) -> None:
    """The log refusing a record after the expert answered: the retry must not pay again for a
    score it has, but a failure (a timeout) is no answer, and it used to be served again."""
    gate = CountingGate((None, "expert-failed: timeout"), (0.8, None))
    monitor = _monitor(tmp_path, gate)
    assert monitor.decisions is not None
    real_write = monitor.decisions.write
    refusals = [True, True, False]  # the log refuses the first two checks' records

    async def flaky_write(record: dict[str, object], *, reserved: int = 0) -> None:
        if record.get("event") == "decision" and refusals.pop(0):
            monitor.decisions.release(reserved)  # type: ignore[union-attr]
            raise LogUnavailable("decision log unavailable: I/O error")
        await real_write(record, reserved=reserved)

    monitor.decisions.write = flaky_write  # type: ignore[method-assign]

    async def run() -> list[object]:
        outcomes: list[object] = []
        try:
            for _ in range(3):  # the client retries the refused request
                try:
                    outcomes.append(await monitor.check("please delegate this"))
                except LogUnavailable as error:
                    outcomes.append(error)
        finally:
            await monitor.aclose()
        return outcomes

    timed_out, answered, retried = asyncio.run(run())
    assert isinstance(timed_out, LogUnavailable) and isinstance(answered, LogUnavailable)
    # Asked on the first check (a timeout) and again on the second (a failure is not reused);
    # the second's score, paid for, serves the third without a third call.
    assert gate.asked == 2
    assert retried.expert == 0.8 and retried.reason is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("expert", "fragment"),
    [
        ({}, "names no expert; serve it with --no-expert"),
        ({"base_urls": None, "model": "m"}, "expert entry:"),
        (
            {"base_urls": ["http://127.0.0.1:9/v1"], "model": "m", "calibration": []},
            "expected an object, not list",
        ),
    ],
)
def test_a_malformed_expert_entry_is_one_line(
    tmp_path: Path, expert: dict[str, object], fragment: str
) -> None:
    folder = write_untrained_bundle(tmp_path / "bundle")
    record = json.loads((folder / "bundle.json").read_text())
    record["expert"] = expert
    (folder / "bundle.json").write_text(json.dumps(record))
    with pytest.raises(InputError, match=fragment):
        read_bundle(folder).expert_spec()


def test_a_bad_expert_url_is_named_as_the_option_not_the_bundle(tmp_path: Path) -> None:
    folder = write_untrained_bundle(tmp_path / "bundle")
    with pytest.raises(InputError) as caught:
        read_bundle(folder).expert_spec("http://host:99999/v1")
    assert str(caught.value).startswith("--expert-url") and "bundle.json" not in str(caught.value)
