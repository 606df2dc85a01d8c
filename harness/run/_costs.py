"""A run's dollars: what the earlier invocations of the run spent (from run.json) and what this
one's stages spend, so that a cost limit holds for the run as a whole, across resumes."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from experts import Price, Spend

__all__ = ["RunCosts"]


@dataclass
class RunCosts:
    """`before`: dollars spent by earlier invocations (`RunLog.costs`); `spends`: this
    invocation's, one `experts.Spend` per stage that pays an expert."""

    before: float = 0.0
    spends: dict[str, Spend] = field(default_factory=dict)
    # Writes a stage's dollars so far where a rerun reads them (run.json's record of the running
    # stage), as answers arrive but at most every `record_every` seconds: a run killed outright
    # (no Ctrl-C, no SIGTERM) loses from its record the answers that arrived within that time
    # after its last write (however long ago), not the stage's whole spending.
    record: Callable[[str, float], None] | None = None
    record_every: float = 1.0
    _recorded_at: dict[str, float] = field(default_factory=dict)

    def spend_for(self, stage: str, price: Price, limit: float | None) -> Spend:
        # `stage` may be "STAGE/PART" (a stage that pays several experts at several prices, e.g.
        # each later expert of a cascade): run.json records the stage's sum.
        """The stage's spend, counting against `limit` what the run spent before it, in this
        invocation's other stages included; the same one when the stage asks again (a stage that
        goes on after replacing its expert's server keeps counting)."""
        if stage in self.spends:
            return self.spends[stage]
        others = sum(spend.spent for name, spend in self.spends.items() if name != stage)
        spend = Spend(price, limit=limit, before=self.before + others)
        if self.record is not None and not price.free:
            spend.on_close = lambda: self._record(_stage_of(stage))
        self.spends[stage] = spend
        return spend

    def _record(self, stage: str) -> None:
        now = time.monotonic()
        if self.record is None or now - self._recorded_at.get(stage, -math.inf) < self.record_every:
            return
        self._recorded_at[stage] = now
        self.record(stage, self.spent(stage) or 0.0)

    def spent(self, stage: str) -> float | None:
        """Dollars `stage` spent in this invocation (all its parts); None if it pays no expert."""
        # list(): the query stage may add a spend from its thread while another stage's is read
        parts = [spend.spent for key, spend in list(self.spends.items()) if _stage_of(key) == stage]
        return sum(parts) if parts else None


def _stage_of(key: str) -> str:
    """The stage a spend's key belongs to: "STAGE" or "STAGE/PART"."""
    return key.split("/", 1)[0]
