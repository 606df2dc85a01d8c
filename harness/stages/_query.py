"""The library API behind `ctd query`, `ctd experts`, `ctd cache` and the query stage
(`harness.stages._query_stage`): which expert (`pick_expert`, the one resolver of every command),
whether it can answer (`check_expert`, asked once per run), and scoring items through the shared
cache into a table (`query_items`)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

import experts
from experts import (
    ConfigError,
    EndpointCheck,
    ExpertSpec,
    InvalidSetting,
    Item,
    RunStats,
    ScoreCache,
    check_endpoint,
)

from .._errors import InputError, check_failed_fraction
from ..data._datasets import read_dataset
from ..data._tables import check_writable, write_table
from ..run._layout import Roots
from ..run._signals import run_stoppable, stop_signals
from ..run._stage import ProgressFn

__all__ = [
    "ExpertProgress",
    "QuerySummary",
    "check_expert",
    "check_request_sizes",
    "local_server",
    "pick_expert",
    "preflight_cache",
    "preflight_expert",
    "query_dataset",
    "query_items",
    "uncached_count",
]


def _is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def pick_expert(
    expert: str | None,
    url: str | None = None,
    model: str | None = None,
    method: experts.ScoringMethod | None = None,
) -> ExpertSpec:
    """The expert of every command: `--expert NAME` (registered), or a base URL given as
    `--expert URL` or `--expert-url URL`, with `--expert-model NAME`. Registry errors become one
    line; a URL that cannot work (credentials in it included) is named by its option, redacted."""
    if (expert is None) == (url is None):
        raise InputError("give --expert NAME (or a base URL with --expert-model NAME), or --expert-url URL")
    option, target = ("--expert-url", url) if url is not None else ("--expert", expert)
    assert target is not None
    try:
        if _is_url(target) or url is not None:
            if not model:
                raise InputError(f"{option} {target}: a URL needs --expert-model (the served model name)")
            spec = experts.expert_from_url(target, model)
        else:
            spec = experts.resolve_expert(target)
    except InvalidSetting as exc:
        if exc.setting == "base_urls" and (url is not None or _is_url(target)):
            raise InputError(f"{option} {exc.shown}: {exc.problem}") from None
        if exc.setting == "model" and model is not None:
            raise InputError(f"--expert-model {exc.shown}: {exc.problem}") from None
        raise InputError(str(exc)) from None
    except ConfigError as exc:
        raise InputError(f"{option} {target}: {exc}" if _is_url(target) else str(exc)) from None
    return replace(spec, method=method) if method else spec


def check_request_sizes(items: list[Item], spec: ExpertSpec) -> None:
    """Before anything is sent: an item whose request holds more tokens than the expert's whole
    per-minute budget (tpm) is one line naming the item, its tokens and the tpm; the limiter
    would refuse it in the middle of the run, after paying for the items before it."""
    if spec.rate.tpm is None:
        return
    template = experts.load_template(spec.template)
    for item in items:
        request = experts.build_request(
            spec.method, template, item.conversation, spec.model, top_logprobs=spec.top_logprobs
        )
        try:
            spec.rate.check_fits(request.tokens)
        except ConfigError as exc:
            raise InputError(f"example {item.id!r}: {exc} (expert {spec.name}, {spec.source})") from None


def check_expert(spec: ExpertSpec) -> EndpointCheck:
    """Can the endpoint score (reachable, model served, logprobs or echo)? Nothing is cached.
    A stop signal ends it as KeyboardInterrupt."""
    return run_stoppable(check_endpoint(spec))


def local_server(
    spec: ExpertSpec,
    *,
    named: str,
    port: int | None = None,
    log: Path | None = None,
    move_if_taken: bool = False,
    vllm: experts.VllmSettings | None = None,
    prepare: bool = True,
) -> experts.LocalServer:
    """The local server for `spec` (not started). A llama.cpp entry serves the embedded model's
    GGUF, found (or fetched once) by the same function that gives the probe stage its weights; a
    vLLM entry whose hf_model is the embedded model serves the Hugging Face folder converted from
    that GGUF (the probe stage's own). InputError, starting with `named` (the expert as the user
    gave it: "--expert X", "the default expert smollm2"), when the weights or the server's
    package are missing. `move_if_taken`: a run's own server, which serves on a free
    port when the expert's is taken; `vllm`: a vLLM server's resources (default: the device's);
    `prepare=False`: the command only (a dry run), the GGUF not converted for vLLM."""
    gguf = folder = None
    if spec.server == "llama.cpp" or (spec.server == "vllm" and spec.hf_model == _EMBEDDED):
        # Imported here: only a local expert on the embedded model needs it (probes is heavy).
        from probes import ProbeError, embedded_gguf

        try:
            gguf = embedded_gguf()
            if spec.server == "vllm":
                gguf, folder = None, _embedded_folder(gguf, convert=prepare)
        except ProbeError as error:
            raise InputError(f"{named}: {error}") from None
    try:
        server = experts.LocalServer(
            spec, port=port, gguf=gguf, folder=folder, vllm=vllm, log=log, move_if_taken=move_if_taken
        )
    except ConfigError as error:
        raise InputError(f"{named}: {error}") from None
    if server.missing():
        raise InputError(f"{named}: {server.missing()}")
    return server


_EMBEDDED = "smollm2"  # probes.EMBEDDED_MODEL, spelled here so that the registry check costs no import


def _embedded_folder(gguf: Path, *, convert: bool = True) -> Path:
    """The embedded model as a Hugging Face folder (float weights, tokenizer, chat template), made
    once from its GGUF by the probe stage's conversion and shared with it (a minute, once)."""
    from probes import gguf_as_folder

    return gguf_as_folder(gguf, convert=convert)


def preflight_expert(spec: ExpertSpec, *, named: str, serve: bool) -> bool:
    """A run's one endpoint check, before any expensive work. True when the expert is a local
    server (llama.cpp or vLLM) that `serve` allows the run to start for the query stage: none
    answers at its URL, or what answers there lists other models (another program on its port:
    the run's own server then moves to a free port). Its weights are then found or fetched, and
    its package checked. Any other problem (a server of its model that cannot score, one that
    refuses the key) is one InputError starting with `named`."""
    report = check_expert(spec)
    if report.ok:
        return False
    another_program = bool(report.served_models) and not report.model_served
    if serve and spec.server != "external" and (not report.reachable or another_program):
        local_server(spec, named=named)
        return True
    raise InputError(f"{named}: {report.problem}")


def preflight_cache(path: Path, spec: ExpertSpec, items: Sequence[Item]) -> int:
    """A run's cache, checked before its endpoint check: writable, room on its device, its pages
    sound, no other process holding its lock (`ScoreCache.for_run`); a problem is one
    StorageError naming the file, and nothing has been paid. Returns how many of `items` have no
    answer in it: with none, the query stage needs no expert (nor its server)."""
    cache = ScoreCache.for_run(path)
    try:
        return uncached_count(items, spec, cache)
    finally:
        cache.close()


def uncached_count(items: Sequence[Item], spec: ExpertSpec, cache: ScoreCache) -> int:
    """How many of `items` have no answer in `cache`, by the keys the client computes (a failure
    is never an answer: those items are asked again)."""
    keys = _cache_keys(items, spec)
    stored = cache.get_many(keys)
    return sum(key not in stored for key in keys)


def _cache_keys(items: Sequence[Item], spec: ExpertSpec) -> list[str]:
    """Each item's cache key, computed as the client computes it."""
    keys_of = experts.ExpertClient(spec, cache=None)
    return [keys_of.request_for(item)[1] for item in items]


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
) -> QuerySummary:
    """Score every example of a dataset file with an expert, through the cache, and write a table
    aligned with the file: id, label, expert, label_mass, source, reason, attempts.
    The inputs, `out` and the endpoint are checked first (reachable, model served, logprobs): a
    problem is one InputError line and nothing is queried or cached."""
    dataset = read_dataset(data)
    summary = query_items(
        dataset.items, dataset.labels, spec, out, cache_path=cache_path, check=check, progress=progress
    )
    return replace(summary, dropped=dataset.dropped)


async def _score_once(
    client: experts.ExpertClient, items: Sequence[experts.Item]
) -> tuple[list[experts.ItemResult], experts.RunStats]:
    """The run's one `score` call inside the client's life (pool, limiter, breaker, claims).
    A first SIGTERM or SIGINT drains the client: nothing more is sent and the answers in flight
    get `experts.DRAIN_GRACE` seconds to arrive and be committed, so a resume pays for none of
    them again; a second signal cuts that short. Either way the call raises `experts.Stopped`."""
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
            async with client:
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
    cache_path: Path | None = None,
    check: bool = True,
    progress: ProgressFn | None = None,
    extra: dict[str, np.ndarray] | None = None,
    with_top_tokens: bool = False,
) -> QuerySummary:
    """Score `items` with an expert through the cache and write the table `out` (one row per item,
    in order; `extra` columns are added as given; `with_top_tokens` adds the expert's next-token
    alternatives, read back from the cache). An interrupted run resumes from the cache:
    answers already committed are never requested again."""
    check_writable(out, "--out")
    check_request_sizes(items, spec)
    # The cache opens, and is checked (writable, room, pages sound, no foreign lock), before the
    # endpoint is asked anything: a bad --cache costs no request.
    cache_path = cache_path or Roots.resolve().cache
    cache = ScoreCache.for_run(cache_path)
    started = time.monotonic()
    try:
        if check:
            report = check_expert(spec)
            if not report.ok:
                raise InputError(report.problem or "the endpoint check failed")
        sink = ExpertProgress(progress) if progress is not None else None
        try:
            results, stats = asyncio.run(
                _score_once(experts.ExpertClient(spec, cache=cache, progress=sink), items)
            )
        except experts.Stopped:  # the answers that arrived are committed; the rest is not lost
            raise KeyboardInterrupt from None  # what a stop signal is everywhere else in a run
        top = {"top_tokens": _top_tokens(items, spec, cache)} if with_top_tokens else {}
    finally:
        cache.close()
    write_table(
        Path(out),
        {
            "id": np.array([r.id for r in results]),
            **(extra or {}),
            "label": np.array([-1 if label is None else label for label in labels]),
            "expert": np.array([np.nan if r.score is None else r.score for r in results]),
            "label_mass": np.array([np.nan if r.label_mass is None else r.label_mass for r in results]),
            "source": np.array([r.source for r in results]),
            "reason": np.array([r.reason or "" for r in results]),
            "attempts": np.array([r.attempts for r in results]),
            **top,
        },
    )
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
    )


def _top_tokens(items: list[Item], spec: ExpertSpec, cache: ScoreCache) -> np.ndarray:
    """Per item, the expert's next-token alternatives and their logprobs, read back from the
    answers the cache stored (JSON text, a list of [token, logprob], most likely first; "" when
    the item failed or its scoring method has no such answer)."""
    keys = _cache_keys(items, spec)
    stored = cache.responses(keys)
    out = []
    for key in keys:
        top = experts.top_logprobs(stored[key]) if key in stored else []
        out.append(json.dumps(top, ensure_ascii=False) if top else "")
    return np.array(out, dtype=str)
