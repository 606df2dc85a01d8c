"""`ctd eval`'s query stage: every dev and test example through the expert and the shared cache,
with the run's own local server (llama.cpp or vLLM) when the run starts one; the expert it asked
is written beside its table."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

import experts
from experts import ConfigError, ExpertSpec

from .._errors import InputError, check_failed_fraction
from ..data import Example, read_table, write_table
from ..run import RunContext, StageResult, fingerprint
from ._expert_calibration import (
    content_free_items,
    fit_expert_calibration,
    score_content_free,
    write_expert_calibration,
)
from ._query import QuerySummary, preflight_cache, query_items, uncached_count

__all__ = ["QueryStage", "expert_identity"]


@dataclass(frozen=True)
class QueryStage:
    """`ctd eval`'s query stage: every dev and test example through the expert and the shared
    cache into query/expert_scores.parquet, and the expert asked (its resolved spec, no key)
    into query/expert.json for `ctd monitor calibrate`. The endpoint was checked once before the
    run (`ResolvedExpert.preflight`); `start_server` says that check found a local server to
    start, and `may_serve` that the run may start one (a local llama.cpp or vLLM expert,
    `--serve auto`): then a local server this run found running (another run's) that goes away
    mid-stage is replaced by one of its own, and the stage goes on from the cache. A server the
    run starts is its own: on the expert's port when that is free, else on a free one (requests
    go there, the cache key stays the expert's URL), and ready only when that very process
    answers.

    `checked` False: every answer was in the cache when the run began, so the expert was neither
    checked nor started (it may be down). Answers gone from the cache since then (a `ctd cache`
    command, another file at $CTD_CACHE) are met here: the expert is checked, and its server
    started, at that point."""

    ctx: RunContext
    start_server: bool = False
    may_serve: bool = False
    checked: bool = True
    # Whose dollars these are in the run's costs: the query stage's, or a later stage's part
    # ("cascade/2": the cascade stage asks each later expert through this stage's code).
    spend_key: str = "query"
    name: ClassVar[str] = "query"

    def fingerprint(self) -> tuple[str, dict[str, Any]]:
        inputs = {f"data.{s}": self.ctx.data.content_hash(s) for s in ("dev", "test")}
        settings = {"inputs": inputs, "expert": expert_identity(self.ctx.expert.spec)}
        calibration = self.ctx.config.expert_calibration
        # Only a calibration is fingerprinted, so a run from before the option stays up to date
        # under `--expert-calibration none`; under the default (dev) its later stages are redone
        # from the cache (the calibrated scores differ), with no request sent.
        if calibration != "none":
            settings["expert_calibration"] = calibration
        return fingerprint(settings), inputs

    def reusable(self) -> bool:
        return True

    def outputs(self) -> list[Path]:
        # A manifest written before expert.json existed records the table alone, and a rerun
        # checks what its manifest records: such a run stays up to date (its bundle resolves
        # the expert as before, see `harness.monitor._certify.queried_expert`).
        return [
            self.ctx.layout.query.expert_scores,
            self.ctx.layout.query.expert,
            self.ctx.layout.query.expert_calibration,
        ]

    def examples(self) -> list[Example]:
        """What the stage asks the expert about: every dev example, then every test example."""
        return [*self.ctx.data.dev, *self.ctx.data.test]

    def asked_items(self) -> list[experts.Item]:
        """Every item the stage asks about: the examples', then any content-free inputs."""
        return [e.item() for e in self.examples()] + self._content_free()

    def left_the_cache(self) -> int:
        """How many of the stage's answers the cache no longer holds (`ctd cache forget`), read
        without changing the cache: an InputError when it holds none of them (another cache
        than the run's, or none there), since asking them all again is no retry."""
        path = self.ctx.roots.cache
        items = self.asked_items()
        missing = len(items)
        if path.is_file():
            cache = experts.ScoreCache(path)
            try:
                missing = uncached_count(items, self.ctx.expert.spec, cache)
            finally:
                cache.close()
        if items and missing == len(items):
            raise InputError(
                f"--retry-failed: none of the run's {len(items)} answers of {self.ctx.expert.spec.name} "
                f"is in the cache {path} (not the cache the run used? it is $CTD_CACHE); nothing was asked"
            )
        return missing

    def run(self) -> StageResult:
        ctx = self.ctx
        examples = self.examples()
        if not self.checked:
            missing = preflight_cache(ctx.roots.cache, ctx.expert.spec, self.asked_items())
            if missing:
                ctx.manifests.log(f"query: {missing} answers left the cache since the run began")
                start_server = ctx.expert.preflight(serve=self.may_serve)
                return replace(self, checked=True, start_server=start_server).run()
        out = ctx.layout.query.expert_scores
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self._server() as spec:
                summary = self._query(examples, out, spec)
        except experts.EndpointDown as error:
            # Another run's local server, found answering at the expert's URL before the run and
            # used on purpose, stopped when that run ended: start this run's own and go on from
            # the cache.
            if self.start_server or not self.may_serve or ctx.expert.check().reachable:
                raise
            ctx.manifests.log(
                f"the local server for {ctx.expert.spec.name} (another run's) went away: {error}"
            )
            with replace(self, start_server=True)._server() as spec:
                summary = self._query(examples, out, spec)
        ctx.expert.write(ctx.layout.query.expert)
        ctx.manifests.log(
            f"query: {summary.total} examples, {summary.cached} from the cache, {summary.scored} scored, "
            f"{summary.shared} shared with an identical example, "
            f"{summary.failed} failed {summary.failure_reasons or ''} in {summary.seconds:.1f} s, "
            f"${summary.cost_usd:.4f} spent"
        )
        shared = f"{summary.shared} shared, " if summary.shared else ""  # identical examples, paid once
        detail = f"{summary.scored} scored, {shared}{summary.cached} cached, {summary.failed} failed"
        if summary.cost_usd:
            detail += f", ${summary.cost_usd:.4f} spent"
        if summary.failed:
            detail += " (rerun with --retry-failed to ask again for those)"
        return StageResult(detail, {"failed": summary.failed})

    def _content_free(self) -> list[experts.Item]:
        """The content-free inputs the run asks too (contextual calibration), else none."""
        return content_free_items() if self.ctx.config.expert_calibration == "contextual" else []

    def _query(self, examples: list[Example], out: Path, spec: ExpertSpec) -> QuerySummary:
        """Every example through the expert (`spec`, where requests go) and the cache into `out`,
        then the run's expert calibration fitted (the content-free inputs asked through the same
        client, cache and spend) and written beside it."""
        summary = self._query_examples(examples, out, spec)
        kind = self.ctx.config.expert_calibration
        content_free = None
        if kind == "contextual":
            spend = self._spend(spec)
            before = spend.spent
            content_free = score_content_free(spec, self.ctx.roots.cache, spend)
            summary = replace(summary, cost_usd=summary.cost_usd + spend.spent - before)  # in the detail too
        calibration = fit_expert_calibration(kind, read_table(out).columns, content_free)
        write_expert_calibration(self.ctx.layout.query, calibration)
        if kind != "none":
            prior = "" if calibration.prior is None else f", prior P(high) {calibration.prior:.3f}"
            self.ctx.manifests.log(
                f"query: expert calibration {kind}: logit shift {calibration.shift:+.3f}{prior}"
            )
        return summary

    def _spend(self, spec: ExpertSpec) -> experts.Spend:
        """The stage's dollars, counted against --cost-limit with the run's earlier spending."""
        return self.ctx.costs.spend_for(self.spend_key, spec.price, self.ctx.config.cost_limit)

    def _query_examples(self, examples: list[Example], out: Path, spec: ExpertSpec) -> QuerySummary:
        """Every example through the expert (`spec`, where requests go) and the cache into `out`,
        its dollars counted in the run's costs."""
        ctx = self.ctx
        spend = self._spend(spec)
        return query_items(
            [e.item() for e in examples],
            [e.label for e in examples],
            spec,
            out,
            cache_path=self.ctx.roots.cache,
            check=False,  # checked once, before the run
            progress=self.ctx.progress,
            extra={
                "split": np.array([e.split for e in examples]),
                "group": np.array([e.group for e in examples]),
                "text": np.array([e.preview() for e in examples]),
            },
            with_top_tokens=True,
            spend=spend,
            log=lambda line: ctx.manifests.log(f"query: {line}"),
        )

    @contextmanager
    def _server(self) -> Iterator[ExpertSpec]:
        """The run's expert for the length of the stage: as resolved, or when the check found no
        server, routed to a local llama.cpp server of the run's own, started here."""
        expert, manifests = self.ctx.expert, self.ctx.manifests
        spec = expert.spec
        if not self.start_server:
            yield spec
            return
        manifests.log(f"starting a local {spec.server} server for {spec.name}")
        self.ctx.progress.step(f"starting a local {spec.server} server for {spec.name}")
        if "torch" in sys.modules:  # the probe stage ran in this process: free the GPU it cached
            from probes import release_device_memory

            release_device_memory()
        server = expert.local_server(log=self.ctx.layout.query.server_log, move_if_taken=True)
        try:
            server.start()
        except ConfigError as error:
            raise InputError(f"{expert.named}: the local server did not start: {error}") from None
        assert server.process is not None
        asked = spec.resolved_urls()[0].rstrip("/")
        taken = f", {asked} being taken" if server.url != asked else ""
        manifests.log(
            f"the local server for {spec.name} answers at {server.url} "
            f"(pid {server.process.pid}{taken}; its log: {server.log})"
        )
        try:
            yield replace(spec, served_at=(server.url,))
        except experts.EndpointDown as error:
            assert server.process is not None
            code = server.process.poll()
            if code is None:
                raise
            raise experts.EndpointDown(
                f"the local server for {spec.name} exited with code {code} during the run "
                f"(its log: {server.log}); {error}"
            ) from None
        finally:
            server.stop()
            manifests.log(f"stopped the local server for {spec.name}")

    def check_outputs(self) -> None:
        """List the examples the expert failed on in query/failed.csv (they are left out of the
        scores table), and stop before the DV stage when more than --max-failed of a split
        failed: leaving many examples out can bias the calibration set."""
        layout = self.ctx.layout
        table = read_table(layout.query.expert_scores).columns
        failed = table["source"].astype(str) == "failed"
        write_table(
            layout.query.failed,
            {k: table[k][failed].astype(str) for k in ("split", "group", "id", "label", "reason")},
        )
        for split in ("dev", "test"):
            rows = table["split"].astype(str) == split
            check_failed_fraction(
                int((rows & failed).sum()),
                int(rows.sum()),
                self.ctx.config.max_failed,
                what=f"the expert failed on {split} examples",
                remedy=(
                    f"rerun with --retry-failed to ask again for those (their ids: {layout.query.failed}), "
                    "or raise --max-failed to go on without them"
                ),
            )


def expert_identity(spec: ExpertSpec) -> dict[str, Any]:
    """What decides the expert's answers (the cache key's fields), never the API key. The
    template by its content too, as the cache key has it: a template file edited since the run
    asks the expert again, under the same name or path."""
    return {
        "name": spec.name,
        "endpoint": spec.endpoint_id(),
        "model": spec.model,
        "method": spec.method,
        "template": spec.template,
        "template_sha256": experts.load_template(spec.template).sha256,
        "top_logprobs": spec.top_logprobs,
    }
