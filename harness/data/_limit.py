"""`--limit N`: at most N examples per split, to try a data set on a few examples first.

The subset is stratified by (group, label): each stratum keeps its share of N (largest
remainders), so a small run still sees every group and both labels in the proportions of the
full split. Within a stratum, examples are taken in the order of a salted hash of their id, so
the subset depends only on the split's content (not on file or row order) and a larger N keeps
every example a smaller N took.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol, TypeVar

__all__ = ["LIMIT_SALT", "stratified_limit"]

LIMIT_SALT = "ctd-limit-v1"
"""Salt of the id hash that orders a stratum; another salt than the dev/test cut's, so that the
subset of a cut dev file is not its first examples in cut order."""


class Stratified(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def group(self) -> str: ...
    @property
    def label(self) -> int: ...


T = TypeVar("T", bound=Stratified)


def _order(example: Stratified) -> tuple[str, str]:
    return hashlib.sha256(f"{LIMIT_SALT}\0{example.id}".encode()).hexdigest(), example.id


def _quotas(sizes: dict[tuple[str, int], int], limit: int) -> dict[tuple[str, int], int]:
    """Each stratum's share of `limit`, rounded by largest remainders (ties: the larger stratum,
    then the stratum key), so that the quotas add up to `limit` exactly."""
    total = sum(sizes.values())
    exact = {key: limit * size / total for key, size in sizes.items()}
    quotas = {key: int(share) for key, share in exact.items()}
    left = limit - sum(quotas.values())
    by_remainder = sorted(sizes, key=lambda key: (-(exact[key] - quotas[key]), -sizes[key], key))
    for key in by_remainder[:left]:
        quotas[key] += 1
    return quotas


def stratified_limit(examples: Sequence[T], limit: int) -> list[T]:
    """At most `limit` of `examples`, stratified by (group, label), in their original order."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    if len(examples) <= limit:
        return list(examples)
    strata: dict[tuple[str, int], list[T]] = {}
    for example in examples:
        strata.setdefault((example.group, example.label), []).append(example)
    quotas = _quotas({key: len(members) for key, members in strata.items()}, limit)
    kept = {id(e) for key, members in strata.items() for e in sorted(members, key=_order)[: quotas[key]]}
    return [example for example in examples if id(example) in kept]
