"""What `Monitor.check` answers: one frozen `Decision` per conversation, with its request id (one
per check, for its label) and the hash of its input that the decision log keeps instead of the
text."""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import Any

__all__ = ["Decision", "Latency", "input_hash", "new_request_id"]


@dataclass(frozen=True)
class Latency:
    probe_ms: float  # admission, tokenising, queueing and the micro-batched forward pass
    expert_ms: float  # 0 when the expert was not asked
    total_ms: float

    def to_json(self) -> dict[str, float]:
        return {"probe_ms": self.probe_ms, "expert_ms": self.expert_ms, "total_ms": self.total_ms}


@dataclass(frozen=True)
class Decision:
    """One conversation's outcome. `expert` is None when there is no expert score, and `reason`
    says why: "not-delegated", "expert-disabled", "delegation-cap", "expert-down" or
    "expert-failed: TAG". `score` is the merged score (the probe's when there is no expert score)
    and `label` is 1[score >= 0.5]. `request_id` names this check alone (its label is posted
    with it); `input_hash` is the same for the same conversation checked again."""

    request_id: str
    input_hash: str
    probe: float
    dv: float
    delegated: bool
    expert: float | None
    score: float
    label: int
    reason: str | None
    truncated: bool
    latency: Latency

    def to_json(self) -> dict[str, Any]:
        # Field by field: `dataclasses.asdict` deep-copies each value, a tenth of the server's
        # main-thread time per check. The keys and their order are asdict's (a test compares).
        return {
            "request_id": self.request_id,
            "input_hash": self.input_hash,
            "probe": self.probe,
            "dv": self.dv,
            "delegated": self.delegated,
            "expert": self.expert,
            "score": self.score,
            "label": self.label,
            "reason": self.reason,
            "truncated": self.truncated,
            "latency_ms": self.latency.to_json(),
        }


def input_hash(conversation: str | list[dict[str, str]]) -> str:
    """A hash of the conversation (its canonical JSON): what the log keeps instead of the text."""
    text = json.dumps(conversation, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def new_request_id() -> str:
    """An id for one check, unique across checks and restarts: the same text checked twice is two
    decisions, each taking its own label."""
    return secrets.token_hex(12)
