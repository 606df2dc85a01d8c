"""Library API behind `ctd query`, `ctd experts` and `ctd cache`."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

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

__all__ = [
    "QuerySummary",
    "RichProgress",
    "check_expert",
    "check_request_sizes",
    "default_cache_path",
    "pick_expert",
    "query_dataset",
    "score_items",
]


def default_cache_path() -> Path:
    """$CTD_CACHE, else runs/cache/experts.sqlite under the runs root."""
    if os.environ.get("CTD_CACHE"):
        return Path(os.environ["CTD_CACHE"])
    return Path(os.environ.get("CTD_RUNS_DIR", "runs")) / "cache" / "experts.sqlite"


_URL_OPTIONS = {"base_urls": "--expert-url", "model": "--expert-model"}


def pick_expert(
    name: str | None, url: str | None, model: str | None, method: experts.ScoringMethod | None = None
) -> ExpertSpec:
    """--expert NAME, or --expert-url URL --expert-model NAME (registry errors become one line;
    a URL that cannot work, credentials in it included, is named by its option, redacted)."""
    if (name is None) == (url is None):
        raise InputError("give --expert NAME, or --expert-url URL with --expert-model NAME")
    try:
        if name is not None:
            spec = experts.resolve_expert(name)
        else:
            if not model:
                raise InputError("--expert-url needs --expert-model (the served model name)")
            spec = experts.expert_from_url(str(url), model)
    except InvalidSetting as exc:
        if url is None or exc.setting not in _URL_OPTIONS:
            raise InputError(str(exc)) from None
        raise InputError(f"{_URL_OPTIONS[exc.setting]} {exc.shown}: {exc.problem}") from None
    except ConfigError as exc:
        raise InputError(str(exc)) from None
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
    return asyncio.run(check_endpoint(spec))


class RichProgress:
    """Progress of an expert run: done/total with cache hits, in flight, retries, 429s, tokens/s
    and ETA; redrawn at most ten times a second."""

    def __init__(self, console: Console | None = None) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[detail]}"),
            TimeRemainingColumn(),
            console=console or Console(stderr=True),
            transient=False,
        )
        self._task = self._progress.add_task("expert", total=None, detail="")
        self._last = 0.0

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, stats: RunStats) -> None:
        now = time.monotonic()
        if now - self._last < 0.1 and stats.done < stats.total:
            return
        self._last = now
        elapsed = max(now - stats.started, 1e-9)
        tokens = (stats.prompt_tokens + stats.completion_tokens) / elapsed
        detail = (
            f"cached {stats.cached}  in flight {stats.in_flight}  retries {stats.retries}  "
            f"429s {stats.rate_limited}  failed {stats.failed}  {tokens:,.0f} tok/s"
        )
        if stats.waiting:  # items another run on this cache is asking about
            detail += f"  waiting on another run {stats.waiting}"
        self._progress.update(self._task, total=stats.total, completed=stats.done, detail=detail)


@dataclass(frozen=True)
class QuerySummary:
    expert: str
    out: Path
    cache: Path
    total: int
    cached: int
    scored: int
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
    progress: bool = True,
) -> QuerySummary:
    """Score every example of a dataset file with an expert, through the cache, and write a table
    aligned with the file: id, label, expert, label_mass, source, reason, attempts.
    The inputs, `out` and the endpoint are checked first (reachable, model served, logprobs): a
    problem is one InputError line and nothing is queried or cached."""
    dataset = read_dataset(data)
    summary = score_items(
        dataset.items, dataset.labels, spec, out, cache_path=cache_path, check=check, progress=progress
    )
    return replace(summary, dropped=dataset.dropped)


def score_items(
    items: list[Item],
    labels: list[int | None],
    spec: ExpertSpec,
    out: Path,
    *,
    cache_path: Path | None = None,
    check: bool = True,
    progress: bool = True,
    extra: dict[str, np.ndarray] | None = None,
) -> QuerySummary:
    """Score `items` with an expert through the cache and write the table `out` (one row per item,
    in order; `extra` columns are added as given). An interrupted run resumes from the cache:
    answers already committed are never requested again."""
    check_writable(out, "--out")
    check_request_sizes(items, spec)
    # The cache opens before the endpoint is asked anything: a bad --cache costs no request.
    cache_path = cache_path or default_cache_path()
    cache = ScoreCache(cache_path)
    started = time.monotonic()
    try:
        if check:
            report = check_expert(spec)
            if not report.ok:
                raise InputError(report.problem or "the endpoint check failed")
        if progress:
            with RichProgress() as sink:
                client = experts.ExpertClient(spec, cache=cache, progress=sink)
                results, stats = asyncio.run(client.score(items))
        else:
            results, stats = asyncio.run(experts.ExpertClient(spec, cache=cache).score(items))
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
        },
    )
    return QuerySummary(
        expert=spec.name,
        out=Path(out),
        cache=cache_path,
        total=stats.total,
        cached=stats.cached,
        scored=stats.scored,
        failed=stats.failed,
        retries=stats.retries,
        rate_limited=stats.rate_limited,
        failure_reasons=dict(stats.failure_reasons),
        dropped=0,
        seconds=round(time.monotonic() - started, 3),
    )
