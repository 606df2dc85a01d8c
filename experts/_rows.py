"""The cache rows an expert's answers and failures are stored as, by every writer of them: the
client (`experts._attempts`) and a batch's results (`experts._batch`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ._cache import SCHEMA_VERSION, now
from ._errors import ExpertError
from ._prompts import PromptTemplate
from ._recovery import plain_how
from ._registry import ExpertSpec
from ._scoring import Score

__all__ = ["AnswerRows"]


@dataclass(frozen=True)
class AnswerRows:
    """The rows of one expert with one template; `endpoint` is `spec.endpoint_id()`, read once."""

    spec: ExpertSpec
    template: PromptTemplate
    endpoint: str

    def score(
        self,
        key: str,
        item_id: str,
        payload: Any,
        score: Score,
        *,
        seconds: float,
        usage: dict[str, Any],
        how: str | None = None,
    ) -> dict[str, Any]:
        """The cache's row for an answered item (`payload`: the endpoint's JSON answer, a list of
        them for likelihood scoring), as every writer of answers stores it: the client, and a
        batch's results (`experts._batch`, `seconds` 0: a batch times no single request). `how`
        says how the score was obtained (`experts._recovery`; the plain request's by default)."""
        return {
            "key": key,
            "expert": self.spec.name,
            "item_id": storable(item_id),
            "endpoint": self.endpoint,
            "model": self.spec.model,
            "method": self.spec.method,
            "template_sha256": self.template.sha256,
            "schema_version": SCHEMA_VERSION,
            "score": score.p,
            "label_mass": score.label_mass,
            "how": how or plain_how(self.spec.method),
            "response": json.dumps(payload, separators=(",", ":")),
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "latency_ms": seconds * 1000.0,
            "created": now(),
        }

    def failure(self, key: str, item_id: str, error: ExpertError, *, attempts: int) -> dict[str, Any]:
        """The failures table's row for an item that got no score (never a cache hit)."""
        return {
            "key": key,
            "expert": self.spec.name,
            "item_id": storable(item_id),
            "reason": error.reason,
            "message": storable(str(error)[:500]),
            "attempts": attempts,
            "created": now(),
        }


def storable(text: str) -> str:
    """`text` as SQLite can store it: a lone surrogate (JSON's "\\ud800", valid JSON but not
    Unicode, in a server's error message or a data file's id) written as its escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
