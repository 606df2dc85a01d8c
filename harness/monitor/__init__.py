"""The calibrated cascade as a deployable monitor: a bundle (`ctd monitor calibrate`), the Python
API (`await Monitor.load(bundle)`, `await monitor.check(conversation)` -> `Decision`), the drift
watch and the HTTP server (`ctd monitor serve`). Importing this package does not load the model:
`Monitor.load` does (and imports the probe side then).

Imported on first use (PEP 562): `ctd --help` reads the serve command's defaults from this package
(`_limits`) and must not pay for the expert engine or the bundle code."""

from __future__ import annotations

from .._lazy import lazy_exports

# Every public name and the module that defines it.
_EXPORTS: dict[str, str] = {
    "BUNDLE_VERSION": "._bundle",
    "CONTROL_MODES": "._bundle",
    "Alarm": "._drift",
    "Bundle": "._bundle",
    "LogUnavailable": "._errors",
    "Overloaded": "._errors",
    "PassCost": "._scorer",
    "ProbeScorer": "._scorer",
    "Tokens": "._scorer",
    "ProcessScorer": "._engine",
    "RestartingScorer": "._restart",
    "Scored": "._engine",
    "ScorerGone": "._engine",
    "ThreadScorer": "._engine",
    "BundleRecord": "._bundle_record",
    "BundleWritten": "._certify",
    "ControlMode": "._bundle",
    "JOINT_BUNDLE_VERSION": "._bundle_record",
    "DEFAULT_MTFA": "._drift",
    "Decision": "._decision",
    "DelegationCap": "._drift",
    "Latency": "._decision",
    "MAX_HEAD_BYTES": "._http",
    "MAX_PENDING": "._admission",
    "MAX_QUEUE_SECONDS": "._admission",
    "Monitor": "._monitor",
    "RateWatch": "._drift",
    "ServeLimits": "._limits",
    "audit_bundle": "._audit",
    "bind_listener": "._http",
    "calibrate_bundle": "._certify",
    "check_bundle_name": "._bundle",
    "check_delegation_rate": "._drift",
    "check_mtfa": "._drift",
    "create_app": "._server",
    "expert_answer": "._expert",
    "raise_open_file_limit": "._http",
    "read_bundle": "._bundle",
    "serve": "._http",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
