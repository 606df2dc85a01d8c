"""What the query stage will cost, said before it sends anything: "about N requests, about $X"."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

import experts
from experts import ExpertSpec, ScoreCache, Spend

__all__ = ["QueryEstimate", "estimate_queries"]


@dataclass(frozen=True)
class QueryEstimate:
    """The requests the cache misses need and their dollars: `usd` from the usual estimate of
    tokens (characters / 4), `usd_at_most` from the bound the cost limit uses (`experts.Spend`,
    before any answer has shown what the chat template adds: loose), with the batch discount
    when `batch`."""

    expert: str
    requests: int
    usd: float
    usd_at_most: float
    free: bool
    batch: bool = False
    local: bool = True  # free as a built-in (local) expert, not for want of a price

    def line(self, *, limit: float | None = None, before: float = 0.0) -> str:
        what = "batch lines" if self.batch else "requests"
        if self.free:
            why = "priced at 0: a local model" if self.local else "no price set for it"
            text = f"about {self.requests} {what}, $0: {self.expert} costs nothing ({why})"
        else:
            discount = " with the batch discount" if self.batch else ""
            text = (
                f"about {self.requests} {what}, about ${self.usd:.4f} (at most ${self.usd_at_most:.4f}"
                f" asked once) at {self.expert}'s prices{discount}"
            )
        if limit is not None:
            text += f"; cost limit ${limit:.4f}, ${before:.4f} spent before"
        return text


def estimate_queries(
    keyed: experts.KeyedItems,
    spec: ExpertSpec,
    cache: ScoreCache | None,
    *,
    batch: bool = False,
    leave_out: Set[str] = frozenset(),
) -> QueryEstimate:
    """The estimate for the items of `keyed`: one request per body of each distinct uncached
    input (items with the same input share one; a failure is asked again), but for the keys in
    `leave_out`."""
    pending: dict[str, experts.Item] = {}
    for item, key in zip(keyed.items, keyed.keys, strict=True):
        if key not in leave_out:
            pending.setdefault(key, item)
    stored = cache.get_many(list(pending)) if cache is not None and pending else {}
    client = experts.ExpertClient(spec, cache=None)
    bound, price = Spend(spec.price), spec.price
    requests, usd, at_most = 0, 0.0, 0.0
    for key, item in pending.items():
        if key in stored:
            continue
        request = client.request(item)  # one at a time: a run's requests are never all held
        requests += len(request.bodies)
        generated = sum(int(body.get("max_tokens", 0)) for body in request.bodies)
        usd += price.usd(request.tokens, generated, batch=batch)
        tokens = bound.bound(request)
        at_most += price.usd(tokens.prompt, tokens.completion, batch=batch)
    return QueryEstimate(
        expert=spec.name,
        requests=requests,
        usd=usd,
        usd_at_most=at_most,
        free=price.free,
        batch=batch,
        local=spec.source == "built-in",
    )
