"""The Python API: `monitor = await Monitor.load(bundle)`, then `await monitor.check(conversation)`
returns a frozen `Decision`, one per conversation and without batch context: the probe and DV
scores from one micro-batched forward pass, delegation iff DV > the bundle's threshold, the expert
asked only then, the merged score, and why there is no expert score when there is none.

A check is admitted first (`_admission`: refused with `Overloaded` when the queue's expected wait
is too long, before anything is paid for), then joins a micro-batch, which the scorer (`_engine`)
tokenises and scores off the event loop (a huge conversation never stalls it)."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import calibrate
from experts import Item

from .._errors import InputError
from ._admission import MAX_PENDING, MAX_QUEUE_SECONDS, Admission
from ._batcher import MicroBatcher
from ._bundle import Bundle, read_bundle
from ._decision import Decision, Latency, input_hash, new_request_id
from ._decisions import DecisionLog, record_bound
from ._drift import DEFAULT_MTFA, Alarm, AlarmLines, DelegationCap, RateWatch, check_mtfa
from ._engine import Scored
from ._errors import LogUnavailable, Overloaded
from ._expert import ExpertGate
from ._metrics import GaugeValue, MonitorMetrics

if TYPE_CHECKING:
    from probes import Conversation

    from ._engine import Outcome, ThreadScorer
    from ._restart import RestartingScorer

__all__ = ["Monitor"]

log = logging.getLogger("ctd.monitor")
FEEDBACK_MEMORY = 100_000  # recent decisions whose label feedback can still be matched
PAID_MEMORY = 10_000  # expert answers of refused requests kept for their retry
# The `risk` label of each certified risk's gauges (the bundle's risk names: calibrate.JOINT_RISKS).
GAUGE_RISK = {"budget": "delegation", "error": "error", "fnr": "fnr"}


class Monitor:
    """A loaded bundle answering `check` calls (see the module docstring). Build with `load`."""

    def __init__(
        self,
        bundle: Bundle,
        scorer: ThreadScorer | RestartingScorer,
        *,
        gate: ExpertGate | None,
        decisions: DecisionLog | None = None,
        max_delegation_rate: float | None = None,
        max_batch: int = 32,
        max_wait: float = 0.005,
        drift_mtfa: float = DEFAULT_MTFA,
        max_queue: float = MAX_QUEUE_SECONDS,
        max_pending: int = MAX_PENDING,
    ) -> None:
        bundle.check_cap(max_delegation_rate)
        self.bundle = bundle
        self.scorer = scorer
        self.gate = gate
        self.decisions = decisions
        self.cap = DelegationCap(max_delegation_rate) if max_delegation_rate is not None else None
        self.metrics = MonitorMetrics(self._gauges)
        self.admission = Admission(max_queue=max_queue, max_pending=max_pending, max_batch=max_batch)
        # Two batches in flight: one tokenised while the one before runs its forward pass.
        self.forward: MicroBatcher[Conversation, Outcome] = MicroBatcher(
            self._forward, max_batch=max_batch, max_wait=max_wait, concurrency=2
        )
        # Each certified risk is watched: the delegation rate (budget or joint mode), the cascade's
        # error (from labels posted back; performance or joint mode); the other is counted and
        # shown. The uncertified one gets a target of 1, which no rate exceeds: it only counts.
        levels = bundle.levels
        self.delegation = RateWatch("delegation", levels.get("budget", 1.0), mtfa=drift_mtfa)
        self.errors = RateWatch("error", levels.get("error", 1.0), mtfa=drift_mtfa)
        self.alarm_lines = AlarmLines()
        # request id -> (the label decided, whether the certified cascade decided it, labelled yet)
        self._labels: OrderedDict[str, tuple[int, bool, bool]] = OrderedDict()
        # input hash -> the expert's score, kept until a decision with it is logged: a request
        # refused because the log failed after the expert answered does not pay again when
        # retried. Only scores: a failure was paid for nothing and is asked again.
        self._paid: OrderedDict[str, float] = OrderedDict()
        self._seq = 0
        if self.cap is not None and decisions is not None:
            # The window goes on from the log's last decisions: what an earlier server called.
            recent = decisions.last_decisions(self.cap.window)
            self.cap.resume([_called(record) for record in recent])

    @classmethod
    async def load(
        cls,
        bundle: Path | str,
        *,
        expert_url: str | None = None,
        expert: bool = True,
        expert_cache: Path | None = None,
        model: str | None = None,
        log_path: Path | None = None,
        log_text: bool = False,
        max_delegation_rate: float | None = None,
        max_batch: int = 32,
        max_wait: float = 0.005,
        batch_tokens: int | None = None,
        drift_mtfa: float = DEFAULT_MTFA,
        max_queue: float = MAX_QUEUE_SECONDS,
        max_pending: int = MAX_PENDING,
        scorer_process: bool | None = False,
    ) -> Monitor:
        """Read the bundle, load the model and probes (seconds to minutes, off the event loop),
        and get ready to check. `expert=False` never asks the expert (the probe-only cascade).
        `batch_tokens`: padded tokens in one forward pass at most (default `probes.BATCH_TOKENS`).
        `drift_mtfa`: the drift detector's mean number of requests to a false alarm.
        `scorer_process`: tokenise and score in a process of its own (True), in threads of this one
        (False), or None: a process when there is a GPU (`_engine.start_scorer` says why). A
        process is spawned: a script that asks for one needs `if __name__ == "__main__":`."""
        from probes import BATCH_TOKENS

        from ._engine import start_scorer

        check_mtfa(drift_mtfa)  # a bad setting is one line before the model loads

        read = read_bundle(Path(bundle))
        read.check_cap(max_delegation_rate)  # before the model loads
        spec = read.expert_spec(expert_url) if expert else None
        scorer = await start_scorer(
            read.layout.safety_probe,
            read.layout.dv_probe,
            model=model,
            batch_tokens=BATCH_TOKENS if batch_tokens is None else batch_tokens,
            max_batch=max_batch,
            process=scorer_process,
        )
        decisions = None
        try:
            decisions = DecisionLog(log_path, text=log_text) if log_path is not None else None
            gate = ExpertGate(spec, cache=expert_cache) if spec is not None else None
            monitor = cls(
                read,
                scorer,
                gate=gate,
                decisions=decisions,
                max_delegation_rate=max_delegation_rate,
                max_batch=max_batch,
                max_wait=max_wait,
                drift_mtfa=drift_mtfa,
                max_queue=max_queue,
                max_pending=max_pending,
            )
            await monitor.warm_up()
            if gate is not None:  # last: nothing after it can fail and leave its client open
                await gate.open()  # one client (pool, limiter, breaker) until `aclose`
        except BaseException:
            if decisions is not None:  # its lock too: a second load in this process must not find it held
                decisions.close()
            await scorer.aclose()  # a scorer process must not outlive a failed load
            raise
        return monitor

    async def warm_up(self, passes: int = 1) -> None:
        """Forward passes before serving (the scorer paid for allocation and fitted the cost of a
        pass by its size when it started): they give the queue a measured cost, so that it sheds
        from the first burst on. Not counted in /metrics."""
        from ._engine import WARM_UP

        for _ in range(passes):
            _, seconds = await self.scorer.score([WARM_UP])
            self.admission.served(1, seconds)

    async def _forward(self, batch: list[Conversation]) -> list[Outcome]:
        outcomes, seconds = await self.scorer.score(batch)  # the event loop keeps serving
        scored = sum(isinstance(o, Scored) for o in outcomes)
        if scored:  # conversations the template rejected cost no pass: they must not price one
            self.admission.served(scored, seconds)
            self.metrics.batches.inc()
            self.metrics.batched_items.inc(scored)
        return outcomes

    async def _probe(self, conversation: Conversation) -> Scored:
        """The scores of one admitted conversation (Overloaded when it is not admitted; the chat
        template's refusal is an InputError)."""
        try:
            with self.admission.admitted():
                outcome = await self.forward.submit(conversation)
        except Overloaded:
            self.metrics.shed.inc()
            raise
        if isinstance(outcome, InputError):
            raise outcome
        return outcome

    def shed_if_full(self) -> None:
        """Raise Overloaded now if a new check would be refused (counted as shed): the server asks
        before it reads a request's body."""
        try:
            self.admission.check()
        except Overloaded:
            self.metrics.shed.inc()
            raise

    async def check(self, conversation: str | list[dict[str, str]]) -> Decision:
        """The decision for one conversation (a string is one user turn). A conversation the
        model's chat template rejects is an InputError; an expert failure is never raised. A check
        that would wait longer than the queue bound is refused with Overloaded before any work.
        With a decision log, the answer comes once its record is on disk, and a log that cannot
        take the record refuses the request (LogUnavailable) before the expert is asked."""
        reserved = 0
        if self.decisions is not None:
            reserved = record_bound(conversation if self.decisions.text else None)
            self.decisions.reserve(reserved)
        try:
            decision, called = await self._decide(conversation)
            if self.decisions is not None:
                record = {"event": "decision", **decision.to_json()}
                if self.decisions.text:
                    record["text"] = conversation
                try:
                    await self.decisions.write(record, reserved=reserved)
                finally:
                    reserved = 0  # released by the write, whatever happened
        finally:
            if reserved and self.decisions is not None:
                self.decisions.release(reserved)
        self._paid.pop(decision.input_hash, None)
        await self._record(decision, called)
        return decision

    async def _decide(self, conversation: str | list[dict[str, str]]) -> tuple[Decision, bool]:
        """(the decision, whether the expert was called for it)."""
        started = time.perf_counter()
        scored = await self._probe(conversation)
        probe, dv = scored.probe, scored.dv
        probed = time.perf_counter()
        delegated = self.bundle.delegates(dv)
        call = self.cap.allow(delegated) if self.cap is not None else delegated
        rid, content = new_request_id(), input_hash(conversation)
        expert: float | None = None
        if not delegated:
            reason: str | None = "not-delegated"
        elif self.gate is None:
            reason = "expert-disabled"
        elif not call:
            reason = "delegation-cap"
        elif content in self._paid:  # answered before, but its decision could not be logged
            expert, reason = self._paid[content], None
        else:
            self._seq += 1  # item ids unique per call: the same text asked twice is two items
            expert, reason = await self.gate.ask(Item(f"{content}-{self._seq}", conversation))
            if expert is not None:  # until a decision with it is logged and answered
                self._paid[content] = expert
                while len(self._paid) > PAID_MEMORY:
                    self._paid.popitem(last=False)
        answered = time.perf_counter()
        expert = self.bundle.expert_score(expert)
        score = self.bundle.merged(probe, expert)
        decision = Decision(
            request_id=rid,
            input_hash=content,
            probe=probe,
            dv=dv,
            delegated=delegated,
            expert=expert,
            score=score,
            label=int(calibrate.predict(score)),
            reason=reason,
            truncated=scored.truncated,
            latency=Latency(
                probe_ms=(probed - started) * 1e3,
                expert_ms=(answered - probed) * 1e3,
                total_ms=(answered - started) * 1e3,
            ),
        )
        return decision, call

    async def _record(self, decision: Decision, called: bool) -> None:
        """Count an answered decision and feed the drift watch."""
        m = self.metrics
        m.requests.inc()
        m.delegated.inc(decision.delegated)
        m.capped.inc(decision.reason == "delegation-cap")
        if decision.delegated and called and self.gate is not None:
            m.expert_calls.inc()
            if decision.expert is not None:
                m.expert_scores.inc()
            else:
                m.expert_failures.labels(reason=str(decision.reason)).inc()
        for part, ms in decision.latency.to_json().items():
            m.latency.labels(part=part.removesuffix("_ms")).observe(ms / 1e3)
        await self._alarm(self.delegation.add(decision.delegated))
        # The error watch scores the certified cascade: a delegated decision served without an
        # expert score (cap, outage, failure) is not what was certified.
        certified = not decision.delegated or decision.expert is not None
        self._labels[decision.request_id] = (decision.label, certified, False)
        self._labels.move_to_end(decision.request_id)
        while len(self._labels) > FEEDBACK_MEMORY:
            self._labels.popitem(last=False)

    async def _alarm(self, alarm: Alarm | None) -> None:
        if alarm is None:
            return
        line = self.alarm_lines.line(alarm, time.monotonic())
        if line is not None:
            log.warning(line)
        if self.decisions is not None:
            try:  # an alarm is logged here and in the process log; a full disk must not hide it
                await self.decisions.write({"event": "alarm", **asdict(alarm)})
            except LogUnavailable as error:
                log.error("%s; this drift alarm is not in the decision log: %s", error, alarm.describe())

    async def feedback(self, rid: str, label: int) -> bool:
        """The true label of a checked conversation: feeds the error watch when the decision was the
        certified cascade's. False when the request id is unknown (never checked, or older than the
        last FEEDBACK_MEMORY decisions); InputError when it was labelled already (a retried post
        must not count twice). With a decision log, it returns once the record is on disk. The
        error watch's guarantee needs labels for every decision or for a random sample of them:
        labels posted only for complaints are not the certified error rate."""
        if label not in (0, 1):
            raise InputError(f"label {label!r}: must be 0 or 1")
        decided = self._labels.get(rid)
        if decided is None:
            return False
        decided_label, certified, labelled = decided
        if labelled:
            raise InputError(f"request_id {rid!r}: already labelled; a decision takes one label")
        error = decided_label != label
        # Labelled before the log's write is awaited: a second post meanwhile is refused, not
        # counted twice. A write that fails leaves the decision unlabelled, to be posted again.
        self._labels[rid] = (decided_label, certified, True)
        if self.decisions is not None:
            try:
                reserved = record_bound(None)
                self.decisions.reserve(reserved)
                record = {"event": "feedback", "request_id": rid, "label": label, "error": error}
                await self.decisions.write({**record, "certified": certified}, reserved=reserved)
            except BaseException:
                if rid in self._labels:
                    self._labels[rid] = (decided_label, certified, False)
                raise
        if certified:
            await self._alarm(self.errors.add(error))
        else:
            self.metrics.feedback_uncertified.inc()
        return True

    def prometheus(self) -> str:
        """/metrics: the counters, the latency histograms, the queue, the realised delegation rate
        and error rate with their exact 95% intervals, and the drift alarms with their evidence."""
        return self.metrics.exposition()

    def _gauges(self) -> Iterator[GaugeValue]:
        """The gauges computed at scrape time (the metrics' collector calls this)."""
        # One gauge per certified risk (a joint bundle certifies several), named as the rates are.
        certified = {GAUGE_RISK[risk]: level for risk, level in self.bundle.levels.items()}
        for risk, level in certified.items():
            yield GaugeValue("certified_alpha", "The level LTT certified.", level, {"risk": risk})
        yield GaugeValue("threshold", "Delegate when DV is above this.", self.bundle.threshold)
        for watch in (self.delegation, self.errors):
            if watch.seen:
                ci, risk = watch.interval(), {"risk": watch.risk}
                yield GaugeValue("rate", "Realised rate over every request so far.", ci.proportion, risk)
                yield GaugeValue(
                    "rate_ci95_low", "Exact (Clopper-Pearson) 95% interval, low end.", ci.low, risk
                )
                yield GaugeValue(
                    "rate_ci95_high", "Exact (Clopper-Pearson) 95% interval, high end.", ci.high, risk
                )
        yield from self._drift_gauges(certified)
        queue = self.admission.state()
        yield GaugeValue("queue_pending", "Admitted checks not yet through the forward pass.", queue.pending)
        yield GaugeValue(
            "queue_max_seconds", "Expected-wait bound above which checks are shed.", self.admission.max_queue
        )
        if queue.seconds_per_item is not None and queue.seconds_per_batch is not None:
            yield GaugeValue(
                "forward_seconds_per_batch",
                "Fitted forward cost per batch (recent batches).",
                queue.seconds_per_batch,
            )
            yield GaugeValue(
                "forward_seconds_per_item", "Fitted forward cost per conversation.", queue.seconds_per_item
            )
        if queue.expected_wait is not None:
            yield GaugeValue(
                "queue_expected_wait_seconds",
                "A new check's expected wait for its forward result.",
                queue.expected_wait,
            )
        if self.gate is not None:
            yield GaugeValue("expert_down", "1 while the expert is considered down.", float(self.gate.down))

    def _drift_gauges(self, certified: Mapping[str, float]) -> Iterator[GaugeValue]:
        """The e-detector's evidence for each certified risk it watches (harness/monitor/_drift.py;
        the false-negative rate is certified but not watched)."""
        for watch in (self.delegation, self.errors):
            if watch.risk not in certified:
                continue
            now, risk = watch.last, {"risk": watch.risk}
            yield GaugeValue(
                "drift_alarm", "1 once the drift detector alarmed (latched).", float(watch.alarm), risk
            )
            yield GaugeValue(
                "drift_alarms",
                "Drift alarms so far (the evidence restarts from 0 after each).",
                watch.alarms,
                risk,
            )
            yield GaugeValue("drift_evidence", "e-SR statistic since the last restart.", now.statistic, risk)
            yield GaugeValue(
                "drift_threshold",
                "Alarm threshold: the guaranteed mean requests to a false alarm.",
                now.threshold,
                risk,
            )
            yield GaugeValue("drift_requests_since_restart", "Outcomes the evidence covers.", now.since, risk)

    def reopen_log(self) -> None:
        """SIGHUP: go on in a new decision log at the same path once the current one was renamed
        away (log rotation); without a log, nothing to do."""
        if self.decisions is None:
            log.warning("SIGHUP: this monitor keeps no decision log; ignored")
        else:
            self.decisions.reopen()

    async def aclose(self) -> None:
        await self.forward.aclose()
        await self.scorer.aclose()
        if self.gate is not None:
            await self.gate.aclose()
        if self.decisions is not None:
            await self.decisions.aclose()


def _called(record: dict[str, object]) -> bool:
    """Whether a logged decision counted as an expert call in the cap's window: delegated, and
    neither capped nor served without an expert (a decision logged by a server with no cap
    counts too: its calls were made)."""
    return bool(record.get("delegated")) and record.get("reason") not in ("delegation-cap", "expert-disabled")
