"""What the stages of one `ctd eval` invocation share: resolved once, before the first stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from probes import ModelInfo

from ..data import DataSplits
from ..expert import ResolvedExpert
from ._config import RunConfig
from ._costs import RunCosts
from ._layout import RunLayout
from ._log import Manifests
from ._roots import Roots
from ._stage import ProgressFn

__all__ = ["RunContext"]


@dataclass(frozen=True)
class RunContext:
    config: RunConfig
    roots: Roots  # the runs root, the shared activation store and expert cache
    layout: RunLayout  # this run's folder
    manifests: Manifests
    data: DataSplits
    expert: ResolvedExpert  # the expert, resolved once from --expert (and --expert-model)
    model: ModelInfo  # the monitored model's identity and shape (no weights loaded)
    progress: ProgressFn  # the run's display (shows nothing under --json)
    costs: RunCosts = field(default_factory=RunCosts)  # dollars: earlier invocations' and this one's
