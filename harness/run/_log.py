"""The records a run keeps: `RunLog` (run.json, typed and versioned), the manifests that decide
what a rerun may skip, and the text log.

A stage is skipped when its manifest's fingerprint equals the one computed now and every output
it recorded still has the recorded hash. Nothing else is trusted, so a changed option, a changed
input file or a deleted output reruns exactly the stages that depend on it. An interrupted stage
has no manifest and runs again.
"""

from __future__ import annotations

import hashlib
import json
import platform
import threading
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

from experts import redact

from .._errors import InputError, named
from ..data import read_json, write_json
from ._layout import RunLayout

__all__ = [
    "RUN_LOG_VERSION",
    "Invocation",
    "Manifests",
    "RunLog",
    "RunLogError",
    "StageRecord",
    "StageStatus",
    "file_sha256",
    "fingerprint",
    "git_revision",
]

RUN_LOG_VERSION = 2  # 2: a list of invocations; 1: one record per stage, overwritten
_PACKAGES = ("ctd-harness", "numpy", "scipy", "torch", "transformers", "accelerate", "httpx")


class StageStatus(StrEnum):
    RUNNING = "running"
    RAN = "ran"
    SKIPPED = "skipped"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(value: object) -> str:
    """A stable hash of a JSON-able value (a stage's settings and the hashes of its inputs)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class StageRecord:
    """One stage's entry in run.json."""

    status: StageStatus
    seconds: float | None  # None while running
    detail: str  # one line: what the stage produced, or the error that stopped it
    at: str  # UTC time of this record
    cost_usd: float | None = None  # dollars this invocation's stage spent at the expert (None: none)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> StageRecord:
        cost = raw.get("cost_usd")
        return cls(StageStatus(raw["status"]), raw["seconds"], raw["detail"], raw["at"], cost)


@dataclass
class Invocation:
    """One `ctd eval` of the run: its configuration, the software that ran it and the record of
    each stage it ran or skipped."""

    started: str = field(default_factory=_now)  # UTC
    config: dict[str, Any] = field(default_factory=dict)  # RunConfig as a dict
    versions: dict[str, str] = field(default_factory=dict)  # python and package versions
    git_revision: str | None = None  # the checkout's commit, when run from a git checkout
    stages: dict[str, StageRecord] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Invocation:
        return cls(
            started=str(raw["started"]),
            config=dict(raw.get("config", {})),
            versions=dict(raw.get("versions", {})),
            git_revision=raw.get("git_revision"),
            stages={name: StageRecord.from_json(r) for name, r in raw.get("stages", {}).items()},
        )


class RunLogError(InputError):
    """run.json cannot be read as a run log of a version this code knows."""


@dataclass
class RunLog:
    """run.json: every invocation of the run, each with its configuration, software and stage
    records. Rewritten after every stage, so an interrupted run says where it stopped.

    The file also holds `stages`, for reading at a glance: each stage's latest record that did
    work (ran, failed, interrupted or running). A rerun that skips a stage records the skip in
    its invocation and leaves that record alone, so the timing of the run that did the work
    stays. Version 1 files (one record per stage, rewritten by every invocation) are read as a
    single invocation; a newer version is refused with a `RunLogError`."""

    created: str = field(default_factory=_now)
    version: int = RUN_LOG_VERSION
    invocations: list[Invocation] = field(default_factory=list)
    # Stages run at the same time record from their own threads (harness.run.Together)
    _lock: ClassVar[threading.RLock] = threading.RLock()

    @classmethod
    def read(cls, path: Path) -> RunLog:
        """The log at `path`; a new one when there is no file. RunLogError when the file is not
        a run log this version of the code can read (nothing is overwritten then)."""
        if not path.is_file():
            return cls()
        try:
            raw = read_json(path)
            version = int(raw.get("version", 1))
            if version > RUN_LOG_VERSION:
                raise RunLogError(
                    f"{path}: run log version {version} was written by a newer ctd-harness "
                    f"(this one reads up to {RUN_LOG_VERSION}); upgrade, or use another --name"
                )
            if version == 1:
                first = Invocation.from_json({**raw, "started": raw["created"]})
                return cls(created=str(raw["created"]), invocations=[first])
            return cls(
                created=str(raw["created"]),
                invocations=[Invocation.from_json(i) for i in raw["invocations"]],
            )
        except RunLogError:
            raise
        except (InputError, OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise RunLogError(
                f"{path}: not a readable run log ({error}); move it away to start a new record"
            ) from None

    @property
    def stages(self) -> dict[str, StageRecord]:
        """Each stage's latest record that did work; a stage only ever skipped (the invocation
        that ran it was recorded elsewhere) keeps its latest skip."""
        latest: dict[str, StageRecord] = {}
        for invocation in self.invocations:
            for name, record in invocation.stages.items():
                if record.status is not StageStatus.SKIPPED or name not in latest:
                    latest[name] = record
        return latest

    def started(self, config: dict[str, Any]) -> None:
        """A new invocation: its configuration and the software running it."""
        self.invocations.append(Invocation(config=config, versions=_versions(), git_revision=git_revision()))

    def record(
        self,
        stage: str,
        status: StageStatus,
        seconds: float | None,
        detail: str,
        cost_usd: float | None = None,
    ) -> None:
        if not self.invocations:
            raise RuntimeError("RunLog.record before RunLog.started")
        with self._lock:
            self.invocations[-1].stages[stage] = StageRecord(
                status, None if seconds is None else round(seconds, 2), redact(detail), _now(), cost_usd
            )

    def costs(self) -> dict[str, float]:
        """Dollars each stage spent, summed over every invocation of the run (a rerun after a
        cost limit, or after an interruption, adds what it spent to what the earlier ones did)."""
        totals: dict[str, float] = {}
        for invocation in self.invocations:
            for name, record in invocation.stages.items():
                if record.cost_usd is not None:
                    totals[name] = totals.get(name, 0.0) + record.cost_usd
        return totals

    def write(self, path: Path) -> None:
        with self._lock:
            record = asdict(self)
            record["stages"] = {name: asdict(r) for name, r in self.stages.items()}
            record["cost_usd"] = self.costs()
            write_json(path, record)


class Manifests:
    """The manifests of one run folder, and its text log."""

    def __init__(self, layout: RunLayout) -> None:
        self.layout = layout

    def log(self, message: str) -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.layout.root.mkdir(parents=True, exist_ok=True)
        try:
            with self.layout.text_log.open("a", encoding="utf-8") as handle:
                handle.write(f"{stamp} {redact(message)}\n")  # an error's text may hold what a server said
        except OSError as exc:  # a full disk at the write or the close names no file
            raise named(exc, self.layout.text_log) from None

    def read(self, stage: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.layout.manifest(stage).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None

    def up_to_date(self, stage: str, fingerprint: str) -> bool:
        """The stage finished with this fingerprint and its outputs are unchanged."""
        manifest = self.read(stage)
        if not manifest or manifest.get("fingerprint") != fingerprint or manifest.get("status") != "done":
            return False
        return not self.changed_outputs(stage)

    def changed_outputs(self, stage: str) -> list[str]:
        """The outputs the stage's manifest records that are gone or no longer have the recorded
        sha256 (relative to the run folder, in the manifest's order); [] without a manifest."""
        manifest = self.read(stage) or {}
        changed = []
        for relative, digest in manifest.get("outputs", {}).items():
            path = self.layout.root / relative
            try:
                same = path.is_file() and file_sha256(path) == digest
            except OSError:  # unreadable now: as good as changed
                same = False
            if not same:
                changed.append(relative)
        return changed

    def finish(
        self, stage: str, fingerprint: str, inputs: dict[str, Any], outputs: list[Path], extra: dict[str, Any]
    ) -> None:
        manifest = {
            "stage": stage,
            "status": "done",
            "fingerprint": fingerprint,
            "inputs": inputs,
            "outputs": self._hashes(outputs),
            "finished": _now(),
            **extra,
        }
        write_json(self.layout.manifest(stage), manifest)

    def invalidate(self, stage: str) -> None:
        self.layout.manifest(stage).unlink(missing_ok=True)

    def _hashes(self, paths: list[Path]) -> dict[str, str]:
        """Relative path -> sha256 of every file under `paths` (files or folders), but none that is
        hidden or inside a hidden folder: a writer's temporaries, or a staging folder that a killed
        writer left (harness.data.staging_folder) and the next one removes."""
        out: dict[str, str] = {}
        for path in paths:
            files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
            for file in files:
                inside = file.relative_to(path).parts if path.is_dir() else (file.name,)
                if not any(part.startswith(".") for part in inside):
                    out[str(file.relative_to(self.layout.root))] = file_sha256(file)
        return out


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for package in _PACKAGES:
        with suppress(metadata.PackageNotFoundError):
            out[package] = metadata.version(package)
    return out


def git_revision() -> str | None:
    """The commit of the checkout this code runs from, when it is a git checkout: read from the
    files under .git (no subprocess), in a plain checkout or a `git worktree` (where .git is a
    file naming the worktree's folder and the branches live in the main repository's folder)."""
    dot_git = Path(__file__).resolve().parents[2] / ".git"
    try:
        if dot_git.is_file():  # a worktree: "gitdir: PATH"
            dot_git = Path(dot_git.read_text().strip().removeprefix("gitdir: "))
        common = dot_git
        if (dot_git / "commondir").is_file():
            common = (dot_git / (dot_git / "commondir").read_text().strip()).resolve()
        head = (dot_git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head  # a detached HEAD holds the commit itself
        ref = head.removeprefix("ref: ")
        for folder in (dot_git, common):
            if (folder / ref).is_file():
                return (folder / ref).read_text().strip()
        for line in (common / "packed-refs").read_text().splitlines():
            if line.endswith(f" {ref}"):
                return line.split()[0]
    except OSError:
        pass
    return None
