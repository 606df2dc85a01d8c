"""The library API behind `ctd query` and the query stage (`harness.stages._query_stage`):
scoring items with an expert (resolved once by `harness.expert`) through the shared cache into a
table (`query_items`), and what the cache already holds (`preflight_cache`)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

import experts
from experts import ConfigError, ExpertSpec, Item, ItemResult, RunStats, ScoreCache

from .._errors import InputError, check_failed_fraction
from .._signals import stop_signals
from ..data import check_writable, read_dataset, write_table
from ..expert import check_expert
from ..run import ProgressFn, Roots
from ._cost import estimate_queries

__all__ = [
    "ExpertProgress",
    "QuerySummary",
    "check_request_sizes",
    "keyed_items",
    "preflight_cache",
    "query_dataset",
    "query_items",
    "uncached_count",
    "write_query_table",
]


def keyed_items(items: Sequence[Item], spec: ExpertSpec) -> experts.KeyedItems:
    """`items` with their cache keys for `spec`, as the client computes them: once per run, for
    every check before it, its estimate and the client."""
    return experts.ExpertClient(spec, cache=None).keyed(items)


def check_request_sizes(keyed: experts.KeyedItems, spec: ExpertSpec) -> None:
    """Before anything is sent: an item whose request holds more tokens than the expert's whole
    per-minute budget (tpm) is one line naming the item, its tokens and the tpm; the limiter
    would refuse it in the middle of the run, after paying for the items before it."""
    if spec.rate.tpm is None:
        return
    for item, tokens in zip(keyed.items, keyed.tokens, strict=True):
        try:
            spec.rate.check_fits(tokens)
        except ConfigError as exc:
            raise InputError(f"example {item.id!r}: {exc} (expert {spec.name}, {spec.source})") from None


def refuse_uncounted_limit(spec: ExpertSpec, limit: float | None) -> None:
    """A cost limit on an expert with no price would count every request as $0 and never stop
    the run: refused, before anything is sent, unless the expert is a built-in one (served
    locally, free)."""
    if limit is not None and spec.price.free and spec.source != "built-in":
        raise InputError(
            f"--cost-limit {limit:g}: expert {spec.name} ({spec.source}) has no price, so its spending "
            "cannot be counted against the limit; give it price_input and price_output (USD per "
            "million tokens) in experts.toml or with `ctd experts add --price-input --price-output`"
        )


def preflight_cache(path: Path, spec: ExpertSpec, items: Sequence[Item]) -> int:
    """A run's cache, checked before its endpoint check: writable, room on its device, its pages
    sound, no other process holding its lock (`ScoreCache.for_run`); a problem is one
    StorageError naming the file, and nothing has been paid; some of `items` out in a batch file
    whose results were not read back are an InputError (`refuse_pending`). Returns how many of
    `items` have no answer in it: with none, the query stage needs no expert (nor its server)."""
    cache = ScoreCache.for_run(path)
    try:
        unanswered = _unanswered_keys(keyed_items(items, spec), cache)
        _refuse_out(spec, cache, unanswered)
        return len(unanswered)
    finally:
        cache.close()


def uncached_count(items: Sequence[Item], spec: ExpertSpec, cache: ScoreCache) -> int:
    """How many of `items` have no answer in `cache`, by the keys the client computes (a failure
    is never an answer: those items are asked again)."""
    return len(_unanswered_keys(keyed_items(items, spec), cache))


def refuse_pending(keyed: experts.KeyedItems, spec: ExpertSpec, cache: ScoreCache) -> None:
    """An InputError, before anything is sent, when some of the items are unanswered and out in
    a batch file whose results no `--batch-in` has read back: asked live, they would be paid
    twice."""
    _refuse_out(spec, cache, _unanswered_keys(keyed, cache))


def _refuse_out(spec: ExpertSpec, cache: ScoreCache, unanswered: Sequence[str]) -> None:
    """`refuse_pending` for the unanswered keys, known already."""
    files = cache.pending_files(unanswered)
    if files:
        raise InputError(
            f"{sum(files.values())} of the requests to {spec.name} are out in batch files whose results "
            "no --batch-in has read back (asked live, they would be paid twice; `ctd query --batch-in` "
            f"reads the results back): {experts.pending_line(files, cache.path)}"
        )


def _unanswered_keys(keyed: experts.KeyedItems, cache: ScoreCache) -> list[str]:
    """The cache keys of the items that `cache` holds no answer for, in order (a failure is
    never an answer)."""
    stored = cache.get_many(keyed.keys)
    return [key for key in keyed.keys if key not in stored]


class ExpertProgress:
    """An experts.ProgressSink drawn on the run's display as the "expert" task: done/total with
    cache hits, answers shared by items with the same input, in flight, retries, 429s, failures
    and tokens/s."""

    def __init__(self, progress: ProgressFn) -> None:
        self._progress = progress

    def update(self, stats: RunStats) -> None:
        elapsed = max(time.monotonic() - stats.started, 1e-9)
        tokens = (stats.prompt_tokens + stats.completion_tokens) / elapsed
        detail = (
            f"cached {stats.cached}  shared {stats.shared}  in flight {stats.in_flight}  "
            f"retries {stats.retries}  429s {stats.rate_limited}  failed {stats.failed}  {tokens:,.0f} tok/s"
        )
        if stats.waiting:  # items another run on this cache is asking about
            detail += f"  waiting on another run {stats.waiting}"
        self._progress("expert", stats.done, stats.total, detail, unit="examples")


@dataclass(frozen=True)
class QuerySummary:
    expert: str
    out: Path
    cache: Path
    total: int
    cached: int
    scored: int
    shared: int  # items answered by the request of an item with the same input (paid once)
    failed: int
    retries: int
    rate_limited: int
    failure_reasons: dict[str, int]
    dropped: int
    seconds: float
    cost_usd: float = 0.0  # dollars this invocation spent at the expert (the answers' token counts)

    def to_dict(self) -> dict[str, object]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}

    def check_failures(self, max_failed: float) -> None:
        """RunFailed (exit code 1) when more than `max_failed` of the items failed: a run in
        which the expert failed on most items must not look like a success."""
        reasons = ", ".join(
            f"{n} x {r}" for r, n in sorted(self.failure_reasons.items(), key=lambda kv: -kv[1])
        )
        check_failed_fraction(
            self.failed,
            self.total,
            max_failed,
            what=f"the expert failed on examples ({reasons})",
            remedy=f"their rows in {self.out} say why; rerun to ask them again (failures are never cached)",
        )


def query_dataset(
    data: Path,
    spec: ExpertSpec,
    out: Path,
    *,
    cache_path: Path | None = None,
    check: bool = True,
    progress: ProgressFn | None = None,
    cost_limit: float | None = None,
) -> QuerySummary:
    """Score every example of a dataset file with an expert, through the cache, and write a table
    aligned with the file: id, label, expert, label_mass, source, how, reason, attempts.
    The inputs, `out` and the endpoint are checked first (reachable, model served, logprobs): a
    problem is one InputError line and nothing is queried or cached."""
    dataset = read_dataset(data)
    summary = query_items(
        dataset.items,
        dataset.labels,
        spec,
        out,
        reads=[("--data", data)],
        cache_path=cache_path,
        check=check,
        progress=progress,
        spend=experts.Spend(spec.price, limit=cost_limit),
    )
    return replace(summary, dropped=dataset.dropped)


async def score_stoppable(
    client: experts.ExpertClient, items: Sequence[experts.Item] | experts.KeyedItems, *, opened: bool = False
) -> tuple[list[experts.ItemResult], experts.RunStats]:
    """One `score` call of `client`, inside its life (pool, limiter, breaker, claims): opened and
    closed around the call, or `opened` already (a client kept across calls, `ctd score`'s). A
    first SIGTERM or SIGINT drains the client: nothing more is sent and the answers in flight get
    `experts.DRAIN_GRACE` seconds to arrive and be committed, so a resume pays for none of them
    again; a second signal cuts that short. Either way the call raises `experts.Stopped`."""
    signals = 0

    def stop() -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            client.drain(0)
            return
        in_flight = client.drain()
        waiting = f"waiting up to {experts.DRAIN_GRACE:g} s for {in_flight} answers in flight"
        print(f"stopping: {waiting if in_flight else 'no answers in flight'}", file=sys.stderr, flush=True)

    with stop_signals(stop):
        try:
            async with nullcontext() if opened else client:
                scored = await client.score(items)
        except experts.EndpointDown:
            if signals:  # the endpoint failed during the drain: the stop asked for comes first
                raise experts.Stopped("stopped by a signal") from None
            raise
    if signals:  # it came after the last answer: the run still stops, as asked
        raise experts.Stopped("stopped by a signal")
    return scored


def query_items(
    items: list[Item],
    labels: list[int | None],
    spec: ExpertSpec,
    out: Path,
    *,
    reads: Sequence[tuple[str, Path]] = (),
    cache_path: Path | None = None,
    check: bool = True,
    progress: ProgressFn | None = None,
    extra: dict[str, np.ndarray] | None = None,
    with_top_tokens: bool = False,
    spend: experts.Spend | None = None,
    log: Callable[[str], None] | None = None,
) -> QuerySummary:
    """Score `items` with an expert through the cache and write the table `out` (one row per item,
    in order; `reads`: the (option, file) pairs the items came from, which `out` must not be;
    `extra` columns are added as given; `with_top_tokens` adds the expert's next-token
    alternatives, read back from the cache). An interrupted run resumes from the cache:
    answers already committed are never requested again.

    `spend` counts the dollars (and holds the cost limit: `experts.CostLimitReached` stops the
    run, its answers committed); before anything is sent, "about N requests, about $X" goes to
    the progress display and `log`."""
    cache_path = cache_path or Roots.resolve().cache
    # The table replaces what is at --out at the end: never the data, nor the paid answers.
    check_writable(out, "--out", inputs=[*reads, ("--cache", cache_path)])
    keyed = keyed_items(items, spec)  # keying is most of what a pass over the items costs
    check_request_sizes(keyed, spec)
    # The cache opens, and is checked (writable, room, pages sound, no foreign lock), before the
    # endpoint is asked anything: a bad --cache costs no request.
    cache = ScoreCache.for_run(cache_path)
    started = time.monotonic()
    try:
        refuse_pending(keyed, spec, cache)
        spend = spend or experts.Spend(spec.price)
        refuse_uncounted_limit(spec, spend.limit)
        if check:
            report = check_expert(spec)
            if not report.ok:
                raise InputError(report.problem or "the endpoint check failed")
        sink = ExpertProgress(progress) if progress is not None else None
        estimate = estimate_queries(keyed, spec, cache).line(limit=spend.limit, before=spend.before)
        for say in (progress.step if progress is not None else None, log):
            if say is not None:
                say(estimate)
        try:
            results, stats = asyncio.run(
                score_stoppable(experts.ExpertClient(spec, cache=cache, progress=sink, spend=spend), keyed)
            )
        except experts.Stopped:  # the answers that arrived are committed; the rest is not lost
            raise KeyboardInterrupt from None  # what a stop signal is everywhere else in a run
        top_tokens = _top_tokens(keyed, cache) if with_top_tokens else None
    finally:
        cache.close()
    write_query_table(Path(out), results, labels, extra=extra, top_tokens=top_tokens)
    return QuerySummary(
        expert=spec.name,
        out=Path(out),
        cache=cache_path,
        total=stats.total,
        cached=stats.cached,
        scored=stats.scored,
        shared=stats.shared,
        failed=stats.failed,
        retries=stats.retries,
        rate_limited=stats.rate_limited,
        failure_reasons=dict(stats.failure_reasons),
        dropped=0,
        seconds=round(time.monotonic() - started, 3),
        cost_usd=spend.spent,
    )


def write_query_table(
    out: Path,
    results: Sequence[ItemResult],
    labels: Sequence[int | None],
    *,
    extra: dict[str, np.ndarray] | None = None,
    top_tokens: np.ndarray | None = None,
) -> None:
    """The table of `ctd query` (and of its `--batch-in`): one row per item, in order; `extra`
    columns go after the id, `top_tokens` (see `_top_tokens`) last."""
    write_table(
        out,
        {
            "id": np.array([r.id for r in results]),
            **(extra or {}),
            "label": np.array([-1 if label is None else label for label in labels]),
            "expert": np.array([np.nan if r.score is None else r.score for r in results]),
            "label_mass": np.array([np.nan if r.label_mass is None else r.label_mass for r in results]),
            "source": np.array([r.source for r in results]),
            "how": np.array([r.how or "" for r in results]),  # "" when failed (experts._recovery)
            "reason": np.array([r.reason or "" for r in results]),
            "attempts": np.array([r.attempts for r in results]),
            **({} if top_tokens is None else {"top_tokens": top_tokens}),
        },
    )


def _top_tokens(keyed: experts.KeyedItems, cache: ScoreCache) -> np.ndarray:
    """Per item, the expert's next-token alternatives and their logprobs, read back from the
    answers the cache stored (JSON text, a list of [token, logprob], most likely first; "" when
    the item failed or its scoring method has no such answer)."""
    stored = cache.responses(keyed.keys)
    out = []
    for key in keyed.keys:
        top = experts.top_logprobs(stored[key]) if key in stored else []
        out.append(json.dumps(top, ensure_ascii=False) if top else "")
    return np.array(out, dtype=str)
