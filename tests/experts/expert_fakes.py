"""Fakes shared by the expert unit tests: a clock that moves only when slept on, and a scripted
likelihood (echo) answer."""

from __future__ import annotations

import asyncio
import re
from typing import Any


class FakeTime:
    """A clock that only moves when someone sleeps on it (by exactly the seconds asked). Raises
    after `max_sleeps` sleeps, so that a waiting loop that never ends fails instead of hanging."""

    def __init__(self, start: float = 1000.0, *, max_sleeps: int = 10_000) -> None:
        self.now = start
        self.sleeps: list[float] = []
        self.max_sleeps = max_sleeps

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if len(self.sleeps) > self.max_sleeps:
            raise RuntimeError(f"still waiting after {self.max_sleeps} sleeps: {self.sleeps[-3:]}")
        self.now += seconds
        await asyncio.sleep(0)


def likelihood_answer(prompt_chars: int, answer: str, token_lls: list[float]) -> dict[str, Any]:
    """An echo answer: a prompt token at 0 (no logprob), one ending just before the answer, the
    answer's words, then the generated token (which scoring must ignore)."""
    words = re.findall(r"\S+\s*", answer)
    assert len(words) == len(token_lls)
    offsets = [0, prompt_chars - 3]
    offsets += [prompt_chars + sum(len(w) for w in words[:k]) for k in range(len(words))]
    offsets.append(prompt_chars + len(answer))
    choice = {
        "index": 0,
        "logprobs": {
            "tokens": ["<p>", "<p2>", *words, "gen"],
            "text_offset": offsets,
            "token_logprobs": [None, -50.0, *token_lls, -99.0],
        },
    }
    return {"choices": [choice]}
