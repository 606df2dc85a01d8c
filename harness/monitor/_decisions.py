"""The decision log: one JSON line per decision, feedback and alarm of a running monitor."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

__all__ = ["DecisionLog"]


class DecisionLog:
    """Append-only JSONL, one line per decision (and per feedback); opened in append mode, so a
    restart adds to it. The text is written only with `text=True`."""

    def __init__(self, path: Path, *, text: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.path.open("a", encoding="utf-8")
        self.text = text

    def write(self, record: dict[str, Any]) -> None:
        self._handle.write(json.dumps({"time": round(time.time(), 3), **record}) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()
