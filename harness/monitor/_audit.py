"""`ctd monitor audit BUNDLE`: redo a bundle's certification from its run's files and say whether
it matches. Each check compares content: the run's scores table and the probes it was certified
on (sha256), the bundle's own probe copies, and the LTT record itself, recomputed from the scores
of the D_est and D_cal examples the bundle names."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import InputError
from ..data import dumps, read_json
from ..run import BundleLayout, RunLayout, file_sha256
from ._bundle_record import BUNDLE_VERSION, JOINT_BUNDLE_VERSION, BundleRecord, json_number
from ._certify import PROBE_SUFFIXES, certify, certify_joint, deploy_splits, test_rows

__all__ = ["Audit", "AuditCheck", "audit_bundle"]


@dataclass(frozen=True)
class AuditCheck:
    """One comparison: what was compared, whether it matched, and what was found."""

    what: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Audit:
    bundle: Path
    run: Path
    checks: tuple[AuditCheck, ...]

    @property
    def matches(self) -> bool:
        return all(check.ok for check in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {
            "bundle": str(self.bundle),
            "run": str(self.run),
            "matches": self.matches,
            "checks": [{"what": c.what, "ok": c.ok, "detail": c.detail} for c in self.checks],
        }


def _same_content(what: str, path: Path, recorded: str | None) -> AuditCheck:
    if not path.is_file():
        return AuditCheck(what, False, f"{path} is missing")
    found = file_sha256(path)
    if found != recorded:
        return AuditCheck(what, False, f"{path} changed: sha256 {found[:12]}, certified {str(recorded)[:12]}")
    return AuditCheck(what, True, f"{path.name} sha256 {found[:12]}")


def _as_json(value: object) -> object:
    """`value` as it reads back from the bundle's JSON, so numbers compare exactly as recorded."""
    return json.loads(dumps(value))


def _recompute(record: BundleRecord, layout: RunLayout) -> AuditCheck:
    """The LTT record recomputed from the run's scores of the examples the bundle names, once
    those are checked to be the cut its split seed gives."""
    rows = test_rows(layout, record.arch, record.seed)
    # The cut itself: the one split_seed gives (so D_est and D_cal are disjoint and not hand-picked).
    splits = deploy_splits(rows.scores.n, record.split_seed)
    cut = ([str(i) for i in rows.ids[splits.est[0]]], [str(i) for i in rows.ids[splits.cal[0]]])
    if rows.scores.n != record.n_test or cut != (list(record.est_ids), list(record.cal_ids)):
        return AuditCheck(
            "LTT record",
            False,
            f"its D_est/D_cal examples are not the cut of split seed {record.split_seed}",
        )
    if record.mode == "joint":  # every risk at the levels the record names (a changed level differs)
        candidates, result = certify_joint(
            rows.scores,
            splits,
            levels=record.certified_levels,
            delta=record.delta,
            objective=record.objective,
        )
    else:
        candidates, result = certify(
            rows.scores,
            splits,
            mode=record.mode,
            alpha=record.alpha,  # type: ignore[arg-type]
            delta=record.delta,
            objective=record.objective,
        )
    recomputed = {
        "ltt": result.to_dict(),
        "candidates": {
            "thresholds": ["inf" if np.isposinf(t) else float(t) for t in candidates.thresholds],
            "est_budget": candidates.est_budget.tolist(),
            "est_objective": candidates.est_objective.tolist(),
        },
        "threshold": "inf" if np.isposinf(result.threshold) else float(result.threshold),
    }
    recorded = record.to_json()
    for key, value in recomputed.items():
        if _as_json(value) != recorded[key]:
            return AuditCheck("LTT record", False, f"recomputed {key!r} differs from the bundle's")
    ltt = record.ltt
    n_cal = ltt["n_cal"] if record.mode != "joint" else len(record.cal_ids)
    return AuditCheck(
        "LTT record",
        True,
        f"recomputed on {ltt['n_est']} D_est and {n_cal} D_cal examples: {len(ltt['certified'])} "
        f"of {len(ltt['order'])} thresholds certified, threshold {json_number(record.threshold)}",
    )


def audit_bundle(folder: Path, run: RunLayout | None = None) -> Audit:
    """Audit the bundle in `folder` against `run` (default: the run folder it records)."""
    bundle = BundleLayout(Path(folder))
    if not bundle.record.is_file():
        raise InputError(f"{folder}: not a monitor bundle (no {bundle.record.name})")
    record = read_json(bundle.record)
    if record.get("version") not in (BUNDLE_VERSION, JOINT_BUNDLE_VERSION) or "sources" not in record:
        raise InputError(
            f"{bundle.record}: bundle version {record.get('version')!r} records no content hashes to audit "
            f"(version {BUNDLE_VERSION} does): recalibrate it with `ctd monitor calibrate --force`"
        )
    record = BundleRecord.from_json(record, bundle.record)
    layout = run or RunLayout(Path(record.run))
    if not layout.root.is_dir():
        raise InputError(f"{layout.root}: the bundle's run folder is not there (name it with --run)")
    sources = record.sources
    checks = [_same_content("scores table", layout.root / sources.scores.path, sources.scores.sha256)]
    for part in ("safety", "dv"):
        for suffix in PROBE_SUFFIXES:
            recorded = sources.probe(part).sha256(suffix)
            stem = layout.root / sources.probe(part).path
            checks.append(_same_content(f"run's {part} probe", stem.with_suffix(suffix), recorded))
            own = bundle.safety_probe if part == "safety" else bundle.dv_probe
            checks.append(_same_content(f"bundle's {part} probe", own.with_suffix(suffix), recorded))
    if checks[0].ok:
        checks.append(_recompute(record, layout))
    else:
        checks.append(
            AuditCheck("LTT record", False, "not recomputed: the scores table is not the one certified")
        )
    return Audit(bundle.root, layout.root, tuple(checks))
