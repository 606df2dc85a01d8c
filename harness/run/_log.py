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
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from importlib import metadata
from pathlib import Path
from typing import Any

from ..data._tables import read_json, write_json
from ._layout import RunLayout

__all__ = [
    "RUN_LOG_VERSION",
    "Manifests",
    "RunLog",
    "StageRecord",
    "StageStatus",
    "file_sha256",
    "fingerprint",
]

RUN_LOG_VERSION = 1
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


@dataclass
class RunLog:
    """run.json: the run's configuration, the software that ran it and each stage's last record.
    Rewritten after every stage, so an interrupted run says where it stopped."""

    created: str = field(default_factory=_now)
    version: int = RUN_LOG_VERSION
    config: dict[str, Any] = field(default_factory=dict)  # RunConfig as a dict
    versions: dict[str, str] = field(default_factory=dict)  # python and package versions
    git_revision: str | None = None  # the checkout's commit, when run from a git checkout
    stages: dict[str, StageRecord] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> RunLog:
        """The log at `path`, or a new one when there is none (or it cannot be read): the log is a
        record for people, never an input of a stage."""
        try:
            raw = read_json(path)
            stages = {
                name: StageRecord(StageStatus(r["status"]), r["seconds"], r["detail"], r["at"])
                for name, r in raw.get("stages", {}).items()
            }
            return cls(
                created=str(raw["created"]),
                config=dict(raw.get("config", {})),
                versions=dict(raw.get("versions", {})),
                git_revision=raw.get("git_revision"),
                stages=stages,
            )
        except Exception:
            return cls()

    def started(self, config: dict[str, Any]) -> None:
        """A new invocation: its configuration and the software running it."""
        self.config = config
        self.versions = _versions()
        self.git_revision = _git_revision()

    def record(self, stage: str, status: StageStatus, seconds: float | None, detail: str) -> None:
        self.stages[stage] = StageRecord(
            status, None if seconds is None else round(seconds, 2), detail, _now()
        )

    def write(self, path: Path) -> None:
        write_json(path, asdict(self))


class Manifests:
    """The manifests of one run folder, and its text log."""

    def __init__(self, layout: RunLayout) -> None:
        self.layout = layout

    def log(self, message: str) -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.layout.root.mkdir(parents=True, exist_ok=True)
        with self.layout.text_log.open("a", encoding="utf-8") as handle:
            handle.write(f"{stamp} {message}\n")

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
        for relative, digest in manifest.get("outputs", {}).items():
            path = self.layout.root / relative
            if not path.is_file() or file_sha256(path) != digest:
                return False
        return True

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
        """Relative path -> sha256 of every file under `paths` (files or folders)."""
        out: dict[str, str] = {}
        for path in paths:
            files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
            for file in files:
                if not file.name.startswith("."):
                    out[str(file.relative_to(self.layout.root))] = file_sha256(file)
        return out


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for package in _PACKAGES:
        with suppress(metadata.PackageNotFoundError):
            out[package] = metadata.version(package)
    return out


def _git_revision() -> str | None:
    head = Path(__file__).resolve().parents[2] / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            return (head.parent / ref[5:]).read_text().strip()
        return ref
    except OSError:
        return None
