"""The stages, each a function from files to files that a notebook or a `ctd` command calls on its
own, and a `Stage` object that runs it inside a `ctd eval` run folder.

Imported on first use (PEP 562): the probe and DV stages bring torch, the query stage the expert
engine, and a command that needs neither should not pay for them.
"""

from __future__ import annotations

import importlib

# Every public name and the module that defines it.
_EXPORTS: dict[str, str] = {
    "CalibrateStage": "._calibrate",
    "DVStage": "._dv",
    "ProbeSettings": "._probe",
    "ProbeStage": "._probe",
    "QueryStage": "._query",
    "QuerySummary": "._query",
    "ReportStage": "._report",
    "ValidateStage": "._validate",
    "calibrate_scores": "._calibrate",
    "check_expert": "._query",
    "dv_stage": "._dv",
    "pick_expert": "._query",
    "probe_stage": "._probe",
    "query_dataset": "._query",
    "query_items": "._query",
    "simulate": "._calibrate",
    "validate_scores": "._calibrate",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
