"""bundle.json as a typed, frozen, versioned record: the certified policy, what it was certified on
(by content hash) and the LTT audit record. `BundleRecord.to_json()` is the file's object, key for
key in the order `ctd monitor calibrate` has always written it; `from_json` reads one back with
one clear line for what is wrong. The LTT record (`calibrate`'s `to_dict()`) and the expert entry
(`harness.expert.expert_record`) keep the shapes their owners give them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import calibrate

from .._errors import InputError

__all__ = [
    "BUNDLE_VERSION",
    "CONTROL_MODES",
    "BundleCandidates",
    "BundleRecord",
    "BundleSources",
    "ControlMode",
    "ProbeSource",
    "ScoresSource",
    "json_number",
]

BUNDLE_VERSION = 2  # 2: content hashes of what was certified, and the test order and selection named
# A bundle holds a certified policy: calibrate's modes that certify (not its empirical selector).
ControlMode = calibrate.CertifiedMode
CONTROL_MODES: tuple[str, ...] = calibrate.CERTIFIED_MODES


def json_number(value: float) -> float | str:
    """A threshold as bundle.json holds it: +inf (never delegate) is "inf"."""
    return "inf" if value == math.inf else float(value)


def _threshold(value: float | str) -> float:
    return math.inf if value == "inf" else float(value)


@dataclass(frozen=True)
class ScoresSource:
    """The run's scores table: its path relative to the run folder and its content hash."""

    path: str
    sha256: str


@dataclass(frozen=True)
class ProbeSource:
    """One probe of the run: its stem relative to the run folder and the hash of each file."""

    path: str
    safetensors: str  # sha256 of STEM.safetensors
    json: str  # sha256 of STEM.json

    def sha256(self, suffix: str) -> str:
        """The recorded hash of the file with `suffix` (".safetensors" or ".json")."""
        return {".safetensors": self.safetensors, ".json": self.json}[suffix]


@dataclass(frozen=True)
class BundleSources:
    """What was certified, by content, so that `ctd monitor audit` can tell a changed run."""

    scores: ScoresSource
    safety: ProbeSource
    dv: ProbeSource

    def probe(self, part: str) -> ProbeSource:
        """The "safety" or "dv" probe's source."""
        return self.safety if part == "safety" else self.dv


@dataclass(frozen=True)
class BundleCandidates:
    """The candidate thresholds the LTT record's indices point into, with their D_est statistics."""

    thresholds: tuple[float, ...]  # +inf: never delegate
    est_budget: tuple[float, ...]
    est_objective: tuple[float, ...]

    def to_json(self) -> dict[str, list[float | str]]:
        return {
            "thresholds": [json_number(t) for t in self.thresholds],
            "est_budget": list(self.est_budget),
            "est_objective": list(self.est_objective),
        }


@dataclass(frozen=True)
class BundleRecord:
    """bundle.json (version BUNDLE_VERSION)."""

    version: int
    run: str  # the run folder, absolute
    created: str  # UTC, ISO 8601
    policy: str
    signal: str
    merge: calibrate.MergeRule
    mode: ControlMode
    alpha: float  # the budget, or the error level
    delta: float
    # Budget control: Pareto over (budget, objective), tested by D_est budget, selected by the
    # objective. Performance control: over (budget, error), tested by D_est error, selected by
    # D_est budget; its objective is the error ("accuracy").
    objective: calibrate.Objective
    test_order: str
    selection: str
    threshold: float  # delegate when DV > threshold; +inf: never
    arch: str
    dv_target: str
    seed: int
    split_seed: int
    n_test: int
    est_budget: float | None  # what D_est saw at the chosen threshold (None: no threshold chosen)
    est_error: float | None
    expert: Mapping[str, Any]  # the expert entry, without keys (`harness.expert.spec_from_record`)
    ltt: Mapping[str, Any]  # calibrate's LTT record (`to_dict()` of its result)
    candidates: BundleCandidates
    sources: BundleSources
    cal_ids: tuple[str, ...]  # the test examples that tested the thresholds
    est_ids: tuple[str, ...]  # and those that chose them: the audit can be redone

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out |= {
            "threshold": json_number(self.threshold),
            "expert": dict(self.expert),
            "ltt": dict(self.ltt),
            "candidates": self.candidates.to_json(),
            "sources": asdict(self.sources),
            "cal_ids": list(self.cal_ids),
            "est_ids": list(self.est_ids),
        }
        return out

    @classmethod
    def from_json(cls, record: Mapping[str, Any], source: Path) -> BundleRecord:
        """The record of a bundle.json; a wrong version, a missing key or a bad entry is one
        InputError line naming `source`."""
        if record.get("version") != BUNDLE_VERSION:
            raise InputError(
                f"{source}: bundle version {record.get('version')!r}, expected {BUNDLE_VERSION} "
                "(recalibrate it with `ctd monitor calibrate --force`)"
            )
        missing = [f.name for f in fields(cls) if f.name not in record]
        if missing:
            raise InputError(f"{source}: missing key {missing[0]!r}")
        if record["merge"] not in calibrate.MERGE_RULES or record["mode"] not in CONTROL_MODES:
            raise InputError(f"{source}: merge {record['merge']!r} / mode {record['mode']!r} unknown")
        try:
            sources, candidates = record["sources"], record["candidates"]
            return cls(
                **{
                    **{f.name: record[f.name] for f in fields(cls)},
                    "alpha": float(record["alpha"]),
                    "delta": float(record["delta"]),
                    "threshold": _threshold(record["threshold"]),
                    "expert": dict(record["expert"]),
                    "ltt": dict(record["ltt"]),
                    "candidates": BundleCandidates(
                        thresholds=tuple(_threshold(t) for t in candidates["thresholds"]),
                        est_budget=tuple(candidates["est_budget"]),
                        est_objective=tuple(candidates["est_objective"]),
                    ),
                    "sources": BundleSources(
                        scores=ScoresSource(**sources["scores"]),
                        safety=ProbeSource(**sources["safety"]),
                        dv=ProbeSource(**sources["dv"]),
                    ),
                    "cal_ids": tuple(record["cal_ids"]),
                    "est_ids": tuple(record["est_ids"]),
                }
            )
        except (TypeError, ValueError, KeyError) as error:  # a field missing or of the wrong kind
            raise InputError(f"{source}: not a bundle record ({type(error).__name__}: {error})") from None
