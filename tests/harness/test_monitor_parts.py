"""The monitor's parts that need no model: micro-batching, the drift detector, the
delegation cap, request parsing (malformed bodies), the Prometheus text and the decision log."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import InputError
from harness.monitor import DEFAULT_MTFA, Decision, DelegationCap, Latency, RateWatch

# Private: the monitor's parts, unit-tested one by one.
from harness.monitor._batcher import MicroBatcher
from harness.monitor._decisions import DecisionLog
from harness.monitor._drift import AlarmLines
from harness.monitor._metrics import GaugeValue, MonitorMetrics
from harness.monitor._server import MAX_BODY_BYTES, BadRequest, parse_check, parse_feedback, read_json_body


def test_concurrent_submits_share_batches_and_keep_their_own_results() -> None:
    seen: list[list[int]] = []

    async def run(batch: list[int]) -> list[int]:
        seen.append(batch)
        await asyncio.sleep(0.01)
        return [x * x for x in batch]

    async def main() -> list[int]:
        batcher: MicroBatcher[int, int] = MicroBatcher(run, max_batch=8, max_wait=0.005)
        out = await asyncio.gather(*(batcher.submit(i) for i in range(40)))
        await batcher.aclose()
        return list(out)

    assert asyncio.run(main()) == [i * i for i in range(40)]
    assert sum(len(b) for b in seen) == 40 and max(len(b) for b in seen) == 8 and len(seen) == 5


def test_an_idle_item_waits_at_most_max_wait_and_a_failed_batch_fails_every_caller() -> None:
    async def run(batch: list[int]) -> list[int]:
        if 13 in batch:
            raise RuntimeError("boom")
        return batch

    async def main() -> tuple[float, list[object]]:
        batcher: MicroBatcher[int, int] = MicroBatcher(run, max_batch=64, max_wait=0.05)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await batcher.submit(1)
        waited = loop.time() - started
        outcomes = await asyncio.gather(*(batcher.submit(i) for i in (12, 13, 14)), return_exceptions=True)
        await batcher.aclose()
        return waited, outcomes

    waited, outcomes = asyncio.run(main())
    assert 0.04 <= waited < 1.0
    assert all(isinstance(o, RuntimeError) for o in outcomes)  # none left waiting, none dropped


@pytest.mark.parametrize(("alpha", "within"), [(0.1, 800), (0.3, 250)])
def test_twice_the_certified_rate_raises_the_alarm_with_its_evidence_and_latches_it(
    alpha: float, within: int
) -> None:
    for seed in range(20):
        stream = np.random.default_rng(seed).random(5000) < 2 * alpha
        watch = RateWatch("delegation", alpha)
        alarm = next((a for a in (watch.add(bool(x)) for x in stream) if a is not None), None)
        assert alarm is not None and alarm.seen <= within, (seed, alarm)
        # The evidence: the e-SR statistic reached the threshold A over the requests since start.
        assert alarm.raised and alarm.statistic >= alarm.threshold == DEFAULT_MTFA
        assert alarm.since == alarm.seen and alarm.since_events / alarm.since > alpha and alarm.alarms == 1
        assert "drift: the delegation rate is above the certified" in alarm.describe()
        assert watch.first_raised == alarm and watch.alarm  # latched after the restart:
        assert watch.last.statistic < DEFAULT_MTFA and watch.alarms >= 1


def test_a_lasting_drift_gets_a_log_line_a_minute_counting_the_alarms_between() -> None:
    """At nine times the certified rate the detector alarms every dozen requests; at 500
    requests/s that is dozens of lines a second. The process log gets each risk's first alarm,
    then one line per minute at most, saying how many alarms it did not show; every alarm still
    comes out of the watch (to the decision log and /metrics)."""
    watch = RateWatch("delegation", 0.1)
    alarms = watch.extend(np.random.default_rng(7).random(200_000) < 0.9)  # 400 s at 500 requests/s
    assert len(alarms) > 10_000 and [a.alarms for a in alarms] == list(range(1, len(alarms) + 1))
    when = [a.seen / 500 for a in alarms]
    lines = AlarmLines(every=60.0)
    said = [(i, line) for i, a in enumerate(alarms) if (line := lines.line(a, now=when[i])) is not None]
    assert said[0] == (0, alarms[0].describe())  # the first alarm: its own line, nothing to count
    assert len(said) == 7  # at 0 s, then the first alarm 60 s or more after each line
    for (before, _), (at, line) in itertools.pairwise(said):
        assert when[at] - when[before] >= 60.0 > when[at - 1] - when[before]
        assert line == alarms[at].describe() + (
            f"; {at - before - 1} more delegation alarms since the last line ({at + 1} in all; "
            "a line at most every 60 s)"
        )
    # Another risk's first alarm has its own line at once.
    first_error = RateWatch("error", 0.1).extend(np.ones(100, dtype=bool))[0]
    assert lines.line(first_error, now=when[-1]) == first_error.describe()


def test_traffic_at_the_certified_rate_raises_no_alarm_and_an_uncertified_watch_never_does() -> None:
    for seed in range(20):
        stream = np.random.default_rng(100 + seed).random(2000) < 0.3  # the worst case: exactly alpha
        watch = RateWatch("delegation", 0.3)
        assert not watch.extend(stream) and not watch.alarm, seed
        assert watch.last.seen == 2000 and 0 < watch.last.statistic < DEFAULT_MTFA
    # The check can fail: at a threshold of 100 requests the same traffic alarms.
    stream = np.random.default_rng(100).random(2000) < 0.3
    assert RateWatch("delegation", 0.3, mtfa=100).extend(stream)
    # A target of 1 cannot be exceeded: the watch counts, even 100,000 events in a row.
    uncertified = RateWatch("error", 1.0, mtfa=100)
    assert not uncertified.extend(np.ones(100_000, bool)) and uncertified.interval().proportion == 1


@pytest.mark.parametrize("mtfa", [99.0, 2e12, float("inf"), float("nan")])
def test_a_mean_time_to_false_alarm_out_of_bounds_is_refused_in_one_line(mtfa: float) -> None:
    with pytest.raises(InputError, match=r"^--drift-mtfa .*must lie in \[100, 1e\+12\]$"):
        RateWatch("delegation", 0.1, mtfa=mtfa)


def test_the_delegation_cap_holds_over_every_window_and_counts_what_it_skipped() -> None:
    cap = DelegationCap(0.2)
    delegated = np.random.default_rng(0).random(2000) < 0.5
    calls = np.array([cap.allow(bool(d)) for d in delegated])
    assert not (calls & ~delegated).any()
    windows = np.convolve(calls.astype(int), np.ones(200, int), mode="valid")
    assert windows.max() <= 40
    assert cap.skipped == int(delegated.sum() - calls.sum()) > 0


MALFORMED: list[tuple[bytes, str | None, int, str]] = [
    (b"{not json", "application/json", 400, "malformed JSON at line 1"),
    (b"", "application/json", 400, "empty body"),
    (b"[1, 2]", "application/json", 400, "messages[0]: must be an object"),
    (b"3", "application/json", 400, "body is a JSON int"),
    (b'""', "application/json", 400, "'input' must be a non-empty string"),
    (b'{"messages": []}', "application/json", 400, "'messages' must be a non-empty list"),
    (
        b'{"messages": [{"role": "robot", "content": "hi"}]}',
        "application/json",
        400,
        "messages[0].role 'robot'",
    ),
    (b'{"messages": [{"role": "user", "content": 3}]}', "application/json", 400, "messages[0].content"),
    (b'{"messages": [{"role": "user"}]}', "application/json", 400, "messages[0].content"),
    (b'{"messages": "hello"}', "application/json", 400, "'messages' must be a non-empty list"),
    (b'{"input": ""}', "application/json", 400, "'input' must be a non-empty string"),
    (b'{"input": "a", "messages": []}', "application/json", 400, "exactly one of 'messages'"),
    (b'{"text": "a"}', "application/json", 400, "exactly one of 'messages'"),
    (b'{"input": "a", "extra": 1}', "application/json", 400, "unknown field 'extra'"),
    (b'{"messages": [{"role": "user", "content": "  "}]}', "application/json", 400, "every message is empty"),
    (b"input=hello", "application/x-www-form-urlencoded", 415, "send application/json"),
    (b"\xff\xfe{}", "application/json", 400, "not UTF-8"),
    (b'{"input": "' + b"a" * MAX_BODY_BYTES + b'"}', "application/json", 413, "the limit is"),
    # Python's own limits and Unicode it cannot encode: each raised past the JSONDecodeError handler.
    (b'{"input": ' + b"7" * 10_000 + b"}", "application/json", 400, "integer string conversion"),
    (b"[" * 100_000 + b"]" * 100_000, "application/json", 400, "JSON nested too deeply"),
    (b'{"input": "ok \\ud800"}', "application/json", 400, "'input': character 3 is a lone surrogate"),
    (b'"\\udc00"', "application/json", 400, "'input': character 0 is a lone surrogate"),
    (
        b'[{"role": "user", "content": "\\ud83d"}]',
        "application/json",
        400,
        "messages[0].content: character 0",
    ),
    (
        b'[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "a.png"}}]}]',
        "application/json",
        400,
        "messages[0].content[0]: a part of type 'image_url'; only text parts are read",
    ),
    (b'[{"role": "user", "content": []}]', "application/json", 400, "messages[0].content: must be"),
    (b'[{"role": "user", "content": ["hi"]}]', "application/json", 400, "content[0]: must be a part"),
    (
        b'[{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]',
        "application/json",
        400,
        "messages[0].content: character 0 is a lone surrogate",
    ),
    (
        b'[{"role": "user", "content": "hi", "tool_calls": [{"function": {"name": "f"}}]}]',
        "application/json",
        400,
        "messages[0].tool_calls: only an assistant message makes tool calls",
    ),
    (
        b'[{"role": "assistant", "content": null, "tool_calls": [{"function": {"arguments": "{}"}}]}]',
        "application/json",
        400,
        "messages[0].tool_calls[0].function.name: must be a non-empty string",
    ),
    (
        b'[{"role": "assistant", "content": null, "tool_calls": [{"type": "code", "code": "ls"}]}]',
        "application/json",
        400,
        "messages[0].tool_calls[0]: must be a call such as",
    ),
    (b'[{"role": "assistant", "content": null}]', "application/json", 400, "messages[0].content: must be"),
    (
        b'[{"role": "assistant", "content": "hi", "reasoning_content": "..."}]',
        "application/json",
        400,
        "messages[0]: unknown field 'reasoning_content'",
    ),
    (b'[{"role": ["user"], "content": "hi"}]', "application/json", 400, "messages[0].role ['user']: must be"),
    (
        b'[{"role": "assistant", "content": null, "audio": {"id": "a1"}}]',
        "application/json",
        400,
        "messages[0].audio: an audio reply is not read",
    ),
    (
        b'[{"role": "user", "content": "hi", "function_call": {"name": "f", "arguments": "{}"}}]',
        "application/json",
        400,
        "messages[0].function_call: only an assistant message makes tool calls",
    ),
    (
        b'[{"role": "assistant", "refusal": 3}]',
        "application/json",
        400,
        "messages[0].refusal: must be a string",
    ),
    (
        b'[{"role": "tool", "content": "ok", "tool_call_id": 7}]',
        "application/json",
        400,
        "messages[0].tool_call_id: must be a string",
    ),
    (
        b'[{"role": "user", "content": "hi", "name": []}]',
        "application/json",
        400,
        "messages[0].name: must be",
    ),
]


@pytest.mark.parametrize(("body", "content_type", "status", "message"), MALFORMED)
def test_each_malformed_check_body_is_one_clear_4xx(
    body: bytes, content_type: str | None, status: int, message: str
) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_check(read_json_body(body, content_type))
    assert caught.value.status == status and message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_replies_as_the_openai_api_returns_them_and_its_other_role_names_are_read() -> None:
    """A client appends the API's reply to its history as it came (the SDK's
    `message.to_dict()`): null fields are not read, a refusal is the reply's text, a legacy
    `function_call` is a tool-call line; `developer` is read as system, `function` as tool."""
    reply = {
        "role": "assistant",
        "content": "Paris.",
        "refusal": None,
        "annotations": [],
        "audio": None,
        "function_call": None,
        "tool_calls": None,
    }
    refused = {**reply, "content": None, "refusal": "I can't help with that."}
    legacy = {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "shell", "arguments": '{"cmd": "ls"}'},
    }
    parts = [{"type": "text", "text": "Sure:"}, {"type": "refusal", "refusal": "not that part"}]
    conversation = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "capital of France?"},
        reply,
        {"role": "user", "content": "now help me hide it"},
        refused,
        legacy,
        {"role": "function", "name": "shell", "content": "a.txt"},
        {"role": "assistant", "content": parts},
    ]
    assert parse_check({"messages": conversation}) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "now help me hide it"},
        {"role": "assistant", "content": "I can't help with that."},
        {"role": "assistant", "content": '[tool call] shell({"cmd": "ls"})'},
        {"role": "tool", "content": "a.txt"},
        {"role": "assistant", "content": "Sure:\nnot that part"},
    ]


def test_good_bodies_parse_and_feedback_is_checked() -> None:
    assert parse_check({"input": "hello"}) == "hello"
    messages = [{"role": "system", "content": "be safe"}, {"role": "user", "content": "hi"}]
    assert parse_check({"messages": messages}) == messages
    assert parse_check(messages) == messages  # a bare list of messages
    assert parse_check("hello") == "hello"  # a bare string
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]  # OpenAI's content parts
    assert parse_check([{"role": "user", "content": parts}]) == [{"role": "user", "content": "first\nsecond"}]
    # An agent's turn: its tool calls are read as lines of text after its content, the tool's answer
    # as its content (the call's id is checked, not read).
    call = {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "rm -rf /"}'}}
    listing = {"function": {"name": "ls", "arguments": {}}}  # arguments as an object: read as its JSON
    agent = [
        {"role": "user", "content": "clean up"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "done", "tool_call_id": "c1"},
        {"role": "assistant", "content": "cleaned", "tool_calls": [listing]},
    ]
    assert [m["content"] for m in parse_check(agent)] == [
        "clean up",
        '[tool call] shell({"cmd": "rm -rf /"})',
        "done",
        "cleaned\n[tool call] ls({})",
    ]
    assert parse_feedback({"request_id": "abc", "label": 1}) == ("abc", 1)
    for body in ({"request_id": "abc", "label": 2}, {"request_id": "", "label": 0}, {"label": 1}):
        with pytest.raises(BadRequest):
            parse_feedback(body)
    with pytest.raises(BadRequest, match="'label' True"):
        parse_feedback({"request_id": "abc", "label": True})
    with pytest.raises(BadRequest, match="'request_id': character 1 is a lone surrogate"):
        parse_feedback({"request_id": "a\ud800", "label": 1})


def test_prometheus_text_is_well_formed_with_cumulative_histograms() -> None:
    gauges = [
        GaugeValue("drift_alarm", "Alarm.", 1.0, {"risk": "delegation"}),
        GaugeValue("threshold", "T.", 0.25),
    ]
    metrics = MonitorMetrics(lambda: gauges)
    metrics.requests.inc(3)
    metrics.delegated.inc()
    for seconds in (0.003, 0.2, 40.0):
        metrics.latency.labels(part="total").observe(seconds)
    metrics.expert_failures.labels(reason="expert-down").inc(2)
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition())}
    assert families["ctd_monitor_requests"].type == "counter"
    assert families["ctd_monitor_latency_seconds"].type == "histogram"
    assert families["ctd_monitor_drift_alarm"].type == "gauge"
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples
    }
    assert samples[("ctd_monitor_requests_total", ())] == 3
    assert samples[("ctd_monitor_expert_failures_total", (("reason", "expert-down"),))] == 2
    assert samples[("ctd_monitor_drift_alarm", (("risk", "delegation"),))] == 1.0
    assert samples[("ctd_monitor_threshold", ())] == 0.25
    buckets = sorted(
        (float(s.labels["le"]), s.value)
        for s in families["ctd_monitor_latency_seconds"].samples
        if s.name.endswith("_bucket") and s.labels["part"] == "total"
    )
    counts = [value for _, value in buckets]
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] == 3 and buckets[-1][0] == float("inf")
    assert samples[("ctd_monitor_latency_seconds_count", (("part", "probe"),))] == 0  # shown from the start


def test_the_decision_log_appends_across_restarts_and_keeps_no_text_unless_asked(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    first = DecisionLog(path)
    first.write_sync({"event": "decision", "request_id": "a"})
    first.close()
    second = DecisionLog(path, text=True)
    second.write_sync({"event": "decision", "request_id": "b", "text": "hello"})
    second.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["request_id"] for r in records] == ["a", "b"] and "text" not in records[0]


def test_serve_refuses_a_missing_bundle_and_bad_options_in_one_line(tmp_path: Path) -> None:
    from ctd_cli import assert_one_line_error, run_ctd

    assert_one_line_error(
        run_ctd("monitor", "serve", str(tmp_path / "nowhere"), cwd=tmp_path), "not a monitor bundle"
    )
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "bundle.json").write_text(json.dumps({"version": 2, "threshold": 0.1}))
    assert_one_line_error(run_ctd("monitor", "serve", str(bundle), cwd=tmp_path), "missing key 'run'")
    assert_one_line_error(
        run_ctd("monitor", "calibrate", "--run", "t", cwd=tmp_path),
        "give --budget ALPHA or --accuracy LEVEL, or both",
    )


@pytest.mark.parametrize("expert", [None, 0.25])
def test_a_decision_reads_out_as_its_fields_do(expert: float | None) -> None:
    """`Decision.to_json` writes its fields by hand (asdict deep-copies, a tenth of the server's
    time per check): the same keys, order and values as `dataclasses.asdict`, the latency renamed.
    A field added to the class and not to `to_json` fails here."""
    decision = Decision(
        request_id="r1", input_hash="h1", probe=0.7, dv=-0.1, delegated=expert is not None, expert=expert,
        score=0.6, label=1, reason=None if expert is not None else "not-delegated", truncated=False,
        latency=Latency(probe_ms=1.5, expert_ms=0.0, total_ms=1.5),
    )  # fmt: skip
    expected = dataclasses.asdict(decision)
    expected["latency_ms"] = expected.pop("latency")
    assert list(decision.to_json().items()) == list(expected.items())
    assert json.dumps(decision.to_json()) == json.dumps(expected)
