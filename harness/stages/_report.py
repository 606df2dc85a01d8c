"""`ctd eval`'s report stage: `harness.report.build_report` over the run folder's files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..run import RunContext, RunLog, RunLogError, StageResult, fingerprint

if TYPE_CHECKING:
    from .._workers import WorkerPool

__all__ = ["ReportStage"]

# The stages whose outputs the report reads: the expert's answers and their calibration
# (query, cascade) as well as the probes', the sweeps and the validation.
_READS = ("query", "cascade", "dv", "calibrate", "validate")


@dataclass(frozen=True)
class ReportStage:
    ctx: RunContext
    figures: WorkerPool | None = None  # the figures' workers, maybe started ahead (`figure_workers`)
    name: ClassVar[str] = "report"

    def fingerprint(self) -> tuple[str, dict[str, Any]]:
        """What the report shows: the outputs of the stages it reads, the run's whole config (its
        header prints it) and the dollars run.json records (its cost line), so that a query
        stage that paid for answers again, or an option changed, rebuilds it."""
        manifests = self.ctx.manifests
        content: dict[str, Any] = {
            stage: (manifests.read(stage) or {}).get("outputs", {}) for stage in _READS
        }
        content["config"] = self.ctx.config.to_toml()
        try:
            content["cost_usd"] = RunLog.read(self.ctx.layout.run_log).costs()
        except RunLogError:  # the report says it cannot read them
            content["cost_usd"] = None
        return fingerprint(content), {"stages": list(_READS)}

    def reusable(self) -> bool:
        return True

    def outputs(self) -> list[Path]:
        return [self.ctx.layout.report.root]

    def run(self) -> StageResult:
        from ..report import (
            build_report,  # matplotlib is imported only when a report is built
            read_warnings,
        )

        path = build_report(self.ctx.layout.root, progress=self.ctx.progress.step, figures=self.figures)
        warnings = read_warnings(self.ctx.layout.root)
        return StageResult(str(path) + (f"; {len(warnings)} warnings (below)" if warnings else ""))

    def check_outputs(self) -> None:
        return None
