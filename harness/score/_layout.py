"""Every path of a `ctd score` output folder: the manifest, one Parquet file per shard, and the
temporary files a shard is written through."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ScoreLayout"]


@dataclass(frozen=True)
class ScoreLayout:
    root: Path

    @property
    def manifest(self) -> Path:
        """What the job is (bundle, inputs, shard cut): a rerun resumes only the same job."""
        return self.root / "score.json"

    def shard(self, index: int) -> Path:
        return self.root / f"shard-{index:05d}.parquet"

    def shard_temp(self, index: int) -> Path:
        """Where a shard is written before it takes its name (a writer per shard at a time)."""
        return self.root / f".shard-{index:05d}.parquet.{_pid()}.tmp"

    def temps(self) -> Iterator[Path]:
        """Temporary files left by a killed job: its shards', and its manifest's (`write_json`)."""
        yield from self.root.glob(".shard-*.parquet.*.tmp")
        yield from self.root.glob(f".{self.manifest.name}.*.tmp")

    def shards(self) -> Iterator[Path]:
        return self.root.glob("shard-*.parquet")


def _pid() -> str:
    import os
    import socket

    return f"{socket.gethostname()}-{os.getpid()}"
