"""`ctd eval`'s cascade stage, run only with later experts (`--expert small,large`).

Each later expert k = 2..K is asked about every dev and test example, exactly as the query stage
asks the first (the same code, cache, server handling and expert calibration; its files in
cascade/query-K/). Its DV probe is trained on dev on the value of its answer over the stage
before's, v_k = (2y - 1)(e_k - e_{k-1}) (e_1: the first expert's score as the run uses it), and
scores test (cascade/dv-K/). The run's scores table is then written again with every stage's
columns, expert_K and dv_K, into cascade/scores.parquet (the rows every expert answered), the
table `ctd validate` and the cascade's calibration read. The first stage's files are untouched:
a run of one expert is what it always was.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from probes import ProbeConfig

from ..data import BINARY_SUFFIX, read_scores, read_table, stage_columns, write_scores
from ..expert import ResolvedExpert
from ..run import ExpertSettings, RunContext, StageLayout, StageResult, file_sha256, fingerprint
from ._dv import dv_stage
from ._expert_calibration import cascade_expert_scores
from ._query_stage import QueryStage, expert_identity

__all__ = ["CascadeStage"]


@dataclass(frozen=True)
class CascadeStage:
    """The later experts of the run's cascade, each asked and given its DV probe, into cascade/."""

    ctx: RunContext
    name: ClassVar[str] = "cascade"

    def experts(self) -> list[ResolvedExpert]:
        """The later experts, resolved as the first is (registry names; the run's serving and
        calibration settings)."""
        config = self.ctx.config
        return [
            ExpertSettings(
                expert=name, serve=config.serve, expert_calibration=config.expert_calibration
            ).resolve()
            for name in config.cascade
        ]

    @property
    def target(self) -> str:
        """The DV target of the later stages: the run's (the continuous one under "both")."""
        return "binary" if self.ctx.config.dv_target == "binary" else "continuous"

    def fingerprint(self) -> tuple[str, dict[str, Any]]:
        layout = self.ctx.layout
        inputs = {
            "scores": file_sha256(layout.scores),
            "stores": file_sha256(layout.probe.stores),
            **{f"data.{s}": self.ctx.data.content_hash(s) for s in ("dev", "test")},
        }
        settings = {
            "experts": [expert_identity(e.spec) for e in self.experts()],
            "target": self.target,
            **self.ctx.config.section("expert_calibration", "epochs"),
        }
        return fingerprint({"inputs": inputs, "settings": settings}), inputs

    def reusable(self) -> bool:
        layout, config = self.ctx.layout, self.ctx.config
        return all(
            layout.cascade.dv(k).artifact(self.target, arch, seed).with_suffix(".json").is_file()
            for k in range(2, 2 + len(config.cascade))
            for arch in config.archs
            for seed in config.seeds
        )

    def outputs(self) -> list[Path]:
        return [self.ctx.layout.cascade.scores]

    def queries(self) -> list[QueryStage]:
        """The query stage of each later expert k = 2..K, in cascade/query-K/. checked=False: its
        endpoint is checked (and its server started) only if some answer is not in the cache."""
        ctx = self.ctx
        return [
            QueryStage(
                replace(ctx, expert=expert, layout=StageLayout(ctx.layout.root, k)),
                may_serve=ctx.config.serve == "auto" and expert.spec.server != "external",
                checked=False,
                spend_key=f"{self.name}/{k}",
            )
            for k, expert in enumerate(self.experts(), start=2)
        ]

    def left_the_cache(self) -> int:
        """How many of the later experts' answers the cache no longer holds (`ctd cache forget`);
        see `QueryStage.left_the_cache`."""
        return sum(query.left_the_cache() for query in self.queries())

    def run(self) -> StageResult:
        ctx, layout = self.ctx, self.ctx.layout
        before = cascade_expert_scores(layout.query)  # stage 1's answers as the cascade uses them
        stages: list[dict[str, NDArray]] = []
        details = []
        failed = 0
        for k, query in enumerate(self.queries(), start=2):
            expert, at_stage = query.ctx.expert, query.ctx
            failed += int(query.run().manifest.get("failed", 0))
            answers = cascade_expert_scores(at_stage.layout.query)
            folder = layout.cascade.dv(k)
            folder.root.mkdir(parents=True, exist_ok=True)
            result = dv_stage(
                layout.probe.root,
                answers,
                folder.scores(self.target),
                target=self.target,  # type: ignore[arg-type]
                training=ProbeConfig(epochs=ctx.config.epochs),
                progress=ctx.progress,
                artifacts=(layout.probe.artifact, partial(folder.artifact, self.target)),
                baseline=before,
            )
            stages.append(read_table(folder.scores(self.target)).columns)
            spearman = np.mean([m.test_spearman for m in result.metrics.mean.values()])
            details.append(f"stage {k} ({expert.spec.name}) DV Spearman {spearman:.3f}")
            before = answers
        columns = _with_stages(read_scores(layout.scores).columns(), stages)
        layout.cascade.root.mkdir(parents=True, exist_ok=True)
        write_scores(layout.cascade.scores, columns)
        table = read_scores(layout.cascade.scores)  # the contract holds
        test_rows = int((table.split == "test").sum())
        detail = f"{'; '.join(details)}; {test_rows} test rows every expert answered"
        if failed:
            detail += f"; later experts failed on {failed} (rerun with --retry-failed to ask again for those)"
        return StageResult(detail, {"failed": failed})

    def check_outputs(self) -> None:
        return None


def _with_stages(base: dict[str, NDArray], stages: list[dict[str, NDArray]]) -> dict[str, NDArray]:
    """The run's scores rows (the binary twins left out: the cascade's DV probes have one target)
    that every later stage scored, with each stage's expert_K and dv_K columns."""

    def keys(table: dict[str, NDArray]) -> list[tuple[str, str, int, str]]:
        parts = (table["split"], table["id"], table["seed"], table["arch"])
        return [(str(s), str(i), int(e), str(a)) for s, i, e, a in zip(*parts, strict=True)]

    base_keys = keys(base)
    keep = np.array([not a.endswith(BINARY_SUFFIX) for *_, a in base_keys])
    looked_up = []
    for table in stages:
        where = {key: row for row, key in enumerate(keys(table))}
        rows = np.array([where.get(key, -1) for key in base_keys])
        keep &= rows >= 0
        looked_up.append((table, rows))
    out = {name: values[keep] for name, values in base.items()}
    for k, (table, rows) in enumerate(looked_up, start=2):
        expert, dv = stage_columns(k)
        out[expert] = np.asarray(table["expert"], dtype=np.float64)[rows[keep]]
        out[dv] = np.asarray(table["dv"], dtype=np.float64)[rows[keep]]
    return out
