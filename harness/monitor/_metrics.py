"""The monitor's /metrics through `prometheus-client`: counters and latency histograms kept in a
registry of the monitor's own (never the process-wide default one, so two monitors in a process
never mix), and the gauges that are computed at scrape time (the realised rates with their exact
intervals, the drift evidence, the queue) read by a collector from a callable the monitor gives."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "LATENCY_BUCKETS", "LATENCY_PARTS", "GaugeValue", "MonitorMetrics"]

# Seconds: from a cached forward pass on a GPU to a slow expert.
LATENCY_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LATENCY_PARTS = ("probe", "expert", "total")  # probe: queueing, tokenising and the forward pass
PREFIX = "ctd_monitor_"
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # the format generate_latest writes


@dataclass(frozen=True)
class GaugeValue:
    """One gauge sample computed at scrape time: `ctd_monitor_{name}{labels} value`."""

    name: str
    help: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)


class _Computed(Collector):
    """Turns the monitor's GaugeValues into gauge families, one per name (labels as given)."""

    def __init__(self, gauges: Callable[[], Iterable[GaugeValue]]) -> None:
        self._gauges = gauges

    def collect(self) -> Iterator[Metric]:
        families: dict[str, GaugeMetricFamily] = {}
        for gauge in self._gauges():
            family = families.get(gauge.name)
            if family is None:
                family = GaugeMetricFamily(PREFIX + gauge.name, gauge.help, labels=sorted(gauge.labels))
                families[gauge.name] = family
            family.add_metric([gauge.labels[k] for k in sorted(gauge.labels)], float(gauge.value))
        yield from families.values()


class MonitorMetrics:
    """The counters and histograms a monitor updates as it serves, plus its computed gauges."""

    def __init__(self, gauges: Callable[[], Iterable[GaugeValue]] = tuple) -> None:
        self.registry = CollectorRegistry()

        def counter(name: str, text: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(PREFIX + name, text, labelnames=labels, registry=self.registry)

        self.requests = counter("requests", "Conversations checked.")
        self.delegated = counter(
            "delegated", "Conversations the calibrated policy delegated (DV above the threshold)."
        )
        self.expert_calls = counter("expert_calls", "Delegated conversations sent to the expert.")
        self.expert_scores = counter("expert_scores", "Expert calls that returned a score.")
        self.capped = counter("capped", "Delegated conversations not sent because of --max-delegation-rate.")
        self.bad_requests = counter("bad_requests", "Requests refused with a 4xx.")
        self.feedback_uncertified = counter(
            "feedback_uncertified",
            "Labels posted for decisions served without the expert score the policy delegated for "
            "(not counted by the error watch).",
        )
        self.shed = counter(
            "shed",
            "Requests refused with 503 before any work because the queue's expected wait was too long.",
        )
        self.batches = counter("forward_batches", "Micro-batched forward passes run.")
        self.batched_items = counter("forward_items", "Conversations in those forward passes.")
        self.expert_failures = counter(
            "expert_failures", "Expert calls that gave no score, by reason.", ("reason",)
        )
        self.latency = Histogram(
            PREFIX + "latency_seconds",
            "Latency per part of a check (probe: queueing, tokenising and the forward pass).",
            labelnames=("part",),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        for part in LATENCY_PARTS:  # every part shows from the start, at zero
            self.latency.labels(part=part)
        self.registry.register(_Computed(gauges))

    def exposition(self) -> str:
        """The Prometheus text (format 0.0.4) of everything above."""
        return generate_latest(self.registry).decode()
