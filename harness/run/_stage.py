"""The one interface every stage of a run follows, and what a stage reports back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ._log import StageStatus

__all__ = ["ProgressFn", "Stage", "StageOutcome", "StageResult"]


class ProgressFn(Protocol):
    """progress(what, done, total, detail, unit): a stage's long work, drawn as a bar (or a plain
    line when the output is not a terminal) by the run's display, counted in `unit` ("tokens",
    "examples"); `step(text)` names a slow step that has no bar (loading a model)."""

    def __call__(self, what: str, done: int, total: int, detail: str = "", unit: str = "") -> None: ...

    def step(self, text: str) -> None: ...


@dataclass(frozen=True)
class StageResult:
    """What a finished stage produced: one line for people, and facts for its manifest."""

    detail: str
    manifest: dict[str, Any] = field(default_factory=dict)  # e.g. {"failed": 3}: read by later runs


@dataclass(frozen=True)
class StageOutcome:
    """What happened to one stage in this invocation."""

    stage: str
    status: StageStatus  # RAN or SKIPPED
    seconds: float
    detail: str = ""


class Stage(Protocol):
    """A step from files in the run folder to files in the run folder. Not a vehicle for code
    reuse: each stage is a small object holding what it needs, and the runner only calls these."""

    name: str

    def fingerprint(self) -> tuple[str, dict[str, Any]]:
        """A hash of everything the outputs depend on (settings, input hashes), and the inputs as
        recorded in the manifest. Equal fingerprint and intact outputs: the stage is skipped."""
        ...

    def outputs(self) -> list[Path]:
        """The files and folders the stage writes (hashed into its manifest)."""
        ...

    def reusable(self) -> bool:
        """Besides an up-to-date manifest, may the last outputs be reused? False when something
        the stage wrote outside the run folder (the shared activation store) is gone."""
        ...

    def run(self) -> StageResult:
        """Do the work, writing `outputs()`."""
        ...

    def check_outputs(self) -> None:
        """After the stage (run or skipped): raise when its outputs must not be used by the next
        stage (too many expert failures); most stages have nothing to check."""
        ...
