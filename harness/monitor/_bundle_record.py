"""bundle.json as a typed, frozen, versioned record: the certified policy, what it was certified on
(by content hash) and the LTT audit record. `BundleRecord.to_json()` is the file's object, key for
key in the order `ctd monitor calibrate` has always written it; `from_json` reads one back with
one clear line for what is wrong. The LTT record (`calibrate`'s `to_dict()`) and the expert entry
(`harness.expert.expert_record`) keep the shapes their owners give them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import calibrate

from .._errors import InputError

__all__ = [
    "BUNDLE_VERSION",
    "CONTROL_MODES",
    "JOINT_BUNDLE_VERSION",
    "BundleCandidates",
    "BundleRecord",
    "BundleSources",
    "ControlMode",
    "ProbeSource",
    "ScoresSource",
    "json_number",
]

BUNDLE_VERSION = 2  # 2: content hashes of what was certified, and the test order and selection named
# 3: a joint bundle (mode "joint", a level per risk in `levels`). A bundle is written at the oldest
# version that holds it: a single-risk bundle stays version 2, byte for byte what tools from before
# joint control write and read, while those tools refuse a joint one in one line rather than serve
# it as something else. Both versions are read.
JOINT_BUNDLE_VERSION = 3
# A bundle holds a certified policy: calibrate's modes that certify (not its empirical selector),
# and joint control of several risks at once.
ControlMode = Literal["budget", "performance", "joint"]
CONTROL_MODES: tuple[str, ...] = (*calibrate.CERTIFIED_MODES, "joint")
# The risk a single-risk mode certifies, by calibrate's joint names (budget: the delegation rate).
SINGLE_RISK = {"budget": "budget", "performance": "error"}


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
    """bundle.json (version BUNDLE_VERSION, or JOINT_BUNDLE_VERSION for mode "joint")."""

    version: int
    run: str  # the run folder, absolute
    created: str  # UTC, ISO 8601
    policy: str
    signal: str
    merge: calibrate.MergeRule
    mode: ControlMode
    alpha: float | None  # the budget, or the error level; None in a joint bundle
    # A joint bundle's level of each risk it certifies (calibrate.JOINT_RISKS: "budget", "error",
    # "fnr"); absent from a single-risk bundle's file (version 2).
    levels: Mapping[str, float] | None = field(default=None, kw_only=True)
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

    @property
    def certified_levels(self) -> dict[str, float]:
        """Every certified risk and its level, by calibrate's joint names ("budget", "error",
        "fnr"): a single-risk bundle's one, or a joint bundle's `levels`."""
        if self.mode == "joint":
            return dict(self.levels or {})
        return {SINGLE_RISK[self.mode]: float(self.alpha)}  # type: ignore[arg-type]

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.levels is None:
            del out["levels"]  # a single-risk bundle: version 2's keys exactly
        else:
            out["levels"] = dict(self.levels)
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
        version = record.get("version")
        if version not in (BUNDLE_VERSION, JOINT_BUNDLE_VERSION):
            raise InputError(
                f"{source}: bundle version {version!r}, expected {BUNDLE_VERSION} or "
                f"{JOINT_BUNDLE_VERSION} (recalibrate it with `ctd monitor calibrate --force`)"
            )
        joint = version == JOINT_BUNDLE_VERSION
        missing = [f.name for f in fields(cls) if f.name not in record and (joint or f.name != "levels")]
        if missing:
            raise InputError(f"{source}: missing key {missing[0]!r}")
        if record["merge"] not in calibrate.MERGE_RULES or record["mode"] not in CONTROL_MODES:
            raise InputError(f"{source}: merge {record['merge']!r} / mode {record['mode']!r} unknown")
        if (
            joint != (record["mode"] == "joint")
            or ("levels" in record) != joint
            or (joint and record["alpha"] is not None)
        ):
            raise InputError(
                f"{source}: mode {record['mode']!r} in a version {version} bundle (a joint bundle is "
                f"version {JOINT_BUNDLE_VERSION} with `levels` and no `alpha`, a single-risk one version "
                f"{BUNDLE_VERSION})"
            )
        levels = _levels(record["levels"], source) if joint else None
        try:
            sources, candidates = record["sources"], record["candidates"]
            made = cls(
                **{
                    **{f.name: record[f.name] for f in fields(cls) if f.name != "levels"},
                    "alpha": None if joint else float(record["alpha"]),
                    "levels": levels,
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
        # Checked here, not where they are used: a level out of range or a threshold that is no
        # number would start a server that refuses every request, or decides none as certified.
        for name, level in (("alpha", made.alpha), ("delta", made.delta)):
            if level is not None and not 0 < level < 1:
                raise InputError(f"{source}: {name} {level!r} must lie in (0, 1)")
        if any(math.isnan(t) for t in (made.threshold, *made.candidates.thresholds)):
            raise InputError(f"{source}: a threshold is not a number (NaN)")
        return made


def _levels(value: object, source: Path) -> dict[str, float]:
    """A joint bundle's `levels`: each of calibrate's joint risks at most once, each in (0, 1)."""
    if not isinstance(value, Mapping) or not value:
        raise InputError(f"{source}: levels {value!r}: not a mapping of risks to levels")
    levels: dict[str, float] = {}
    for risk, level in value.items():
        if risk not in calibrate.JOINT_RISKS:
            raise InputError(
                f"{source}: levels: unknown risk {risk!r} (risks: {', '.join(calibrate.JOINT_RISKS)})"
            )
        if isinstance(level, bool) or not isinstance(level, int | float) or not 0 < level < 1:
            raise InputError(f"{source}: levels: {risk} {level!r} must lie in (0, 1)")
        levels[risk] = float(level)
    return levels
