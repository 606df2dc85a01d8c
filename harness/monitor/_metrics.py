"""The monitor's counters and latency histograms, and their Prometheus text exposition (format
0.0.4: `# HELP`, `# TYPE`, then `name{labels} value` lines; histograms as cumulative `_bucket`
lines with `le`, plus `_sum` and `_count`)."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["LATENCY_BUCKETS", "Histogram", "MonitorMetrics", "exposition"]

# Seconds: from a cached forward pass on a GPU to a slow expert.
LATENCY_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
PREFIX = "ctd_monitor_"


@dataclass
class Histogram:
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    n: int = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.total += seconds
        self.n += 1


@dataclass
class MonitorMetrics:
    """Everything /metrics shows besides the drift watches (the monitor adds those)."""

    requests: int = 0
    delegated: int = 0  # the policy said delegate (the certified quantity)
    expert_calls: int = 0
    expert_scores: int = 0
    capped: int = 0  # delegated, but skipped by --max-delegation-rate
    bad_requests: int = 0
    feedback_uncertified: int = 0  # labels of decisions served without the expert score delegated
    expert_failures: Counter[str] = field(default_factory=Counter)  # by reason
    latency: dict[str, Histogram] = field(
        default_factory=lambda: {part: Histogram() for part in ("probe", "expert", "total")}
    )
    batches: int = 0
    batched_items: int = 0


def _line(name: str, value: float | int, labels: dict[str, str] | None = None) -> str:
    text = ",".join(f'{k}="{_escape(v)}"' for k, v in (labels or {}).items())
    shown = repr(float(value)) if isinstance(value, float) else str(value)
    if shown in ("inf", "nan", "-inf"):
        shown = {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}[shown]
    return f"{PREFIX}{name}{{{text}}} {shown}" if text else f"{PREFIX}{name} {shown}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(metrics: MonitorMetrics, gauges: list[tuple[str, str, float, dict[str, str] | None]]) -> str:
    """The Prometheus text of `metrics` and of extra gauges (name, help, value, labels)."""
    out: list[str] = []

    def head(name: str, kind: str, text: str) -> None:
        out.append(f"# HELP {PREFIX}{name} {text}")
        out.append(f"# TYPE {PREFIX}{name} {kind}")

    for name, text, value in (
        ("requests_total", "Conversations checked.", metrics.requests),
        (
            "delegated_total",
            "Conversations the calibrated policy delegated (DV above the threshold).",
            metrics.delegated,
        ),
        ("expert_calls_total", "Delegated conversations sent to the expert.", metrics.expert_calls),
        ("expert_scores_total", "Expert calls that returned a score.", metrics.expert_scores),
        (
            "capped_total",
            "Delegated conversations not sent because of --max-delegation-rate.",
            metrics.capped,
        ),
        ("bad_requests_total", "Requests refused with a 4xx.", metrics.bad_requests),
        (
            "feedback_uncertified_total",
            "Labels posted for decisions served without the expert score the policy delegated for "
            "(not counted by the error watch).",
            metrics.feedback_uncertified,
        ),
        ("forward_batches_total", "Micro-batched forward passes run.", metrics.batches),
        ("forward_items_total", "Conversations in those forward passes.", metrics.batched_items),
    ):
        head(name, "counter", text)
        out.append(_line(name, value))
    head("expert_failures_total", "counter", "Expert calls that gave no score, by reason.")
    for reason, count in sorted(metrics.expert_failures.items()):
        out.append(_line("expert_failures_total", count, {"reason": reason}))
    head("latency_seconds", "histogram", "Latency per part of a check (probe: queue and forward pass).")
    for part, hist in metrics.latency.items():
        cumulative = 0
        for bound, count in zip((*hist.buckets, float("inf")), hist.counts, strict=True):
            cumulative += count
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(_line("latency_seconds_bucket", cumulative, {"part": part, "le": le}))
        out.append(_line("latency_seconds_sum", float(hist.total), {"part": part}))
        out.append(_line("latency_seconds_count", hist.n, {"part": part}))
    for name, text, value, labels in gauges:
        if not any(line.startswith(f"# HELP {PREFIX}{name} ") for line in out):
            head(name, "gauge", text)
        out.append(_line(name, value, labels))
    return "\n".join(out) + "\n"
