"""`ctd eval`'s report stage: `harness.report.build_report` over the run folder's files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..run import RunContext, StageResult, fingerprint
from ._calibrate import CALIBRATE_SETTINGS
from ._validate import VALIDATE_SETTINGS

if TYPE_CHECKING:
    from .._workers import WorkerPool

__all__ = ["ReportStage"]

_READS = ("dv", "calibrate", "validate")  # the stages whose outputs the report reads


@dataclass(frozen=True)
class ReportStage:
    ctx: RunContext
    figures: WorkerPool | None = None  # the figures' workers, maybe started ahead (`figure_workers`)
    name: ClassVar[str] = "report"

    def fingerprint(self) -> tuple[str, dict[str, Any]]:
        manifests = self.ctx.manifests
        content: dict[str, Any] = {
            stage: (manifests.read(stage) or {}).get("outputs", {}) for stage in _READS
        }
        content["config"] = self.ctx.config.section(*CALIBRATE_SETTINGS, *VALIDATE_SETTINGS)
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
