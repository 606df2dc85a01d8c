"""A run: its configuration (`RunConfig`), where its files live (`Roots`, `RunLayout`), its
records (`RunLog`, the manifests), the `Stage` interface and the runner that skips what is up to
date. Which stages `ctd eval` runs is listed in `harness._eval`."""

from ._config import RunConfig, load_run_config
from ._context import RunContext
from ._layout import Roots, RunLayout
from ._log import Invocation, Manifests, RunLog, RunLogError, StageRecord, StageStatus
from ._runner import run_stages
from ._sections import ExpertSettings, ProbeSettings
from ._stage import Stage, StageOutcome, StageResult

__all__ = [
    "ExpertSettings",
    "Invocation",
    "Manifests",
    "ProbeSettings",
    "Roots",
    "RunConfig",
    "RunContext",
    "RunLayout",
    "RunLog",
    "RunLogError",
    "Stage",
    "StageOutcome",
    "StageRecord",
    "StageResult",
    "StageStatus",
    "load_run_config",
    "run_stages",
]
