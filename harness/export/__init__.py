"""Exports of a finished run for other tools: `export_inspect` writes it as inspect_ai `.eval`
logs (one per probe configuration) for inspect's log viewer and dataframe API.

inspect_ai is an optional extra (`pip install -e '.[inspect]'`): it is imported only when a log is
written, and the names here load on first use (PEP 562), so `ctd --help` pays for none of it.
"""

from __future__ import annotations

from .._lazy import lazy_exports

SAMPLES_PER_LOG = 5_000
"""The most samples (test examples x seeds) in one log: above it, a probe configuration's log is
written in parts (harness/export/_parts.py says why). Here, so that the CLI's default costs no import."""

# Every public name and the module that defines it.
_EXPORTS: dict[str, str] = {
    "INSPECT_MISSING": "._inspect",
    "TARGETS": "._inspect",
    "export_inspect": "._inspect",
    "log_paths": "._inspect",
    "sample_id": "._inspect",
}

__all__ = ["SAMPLES_PER_LOG", *_EXPORTS]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
