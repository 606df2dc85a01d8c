"""A run: its configuration (`RunConfig`), where its files live (`Roots`, `RunLayout`), its
records (`RunLog`, the manifests), the `Stage` interface and the runner that skips what is up to
date. Which stages `ctd eval` runs is listed in `harness._eval`.

Imported on first use (PEP 562): a command takes only the parts it names (the progress bars
bring rich, the validation jobs calibrate).
"""

from __future__ import annotations

from .._lazy import lazy_exports

# Every public name and the module that defines it.
_EXPORTS: dict[str, str] = {
    "DV_TARGET_CHOICES": "._config",
    "JOBS": "._validation",
    "JOINT_JOB": "._validation",
    "JointJobRecord": "._validation",
    "MIN_SELECTION": "._config",
    "BundleLayout": "._layout",
    "DVLayout": "._layout",
    "ExpertSettings": "._sections",
    "HeadlineRule": "._validation",
    "Invocation": "._log",
    "JobRecord": "._validation",
    "Manifests": "._log",
    "ProbeLayout": "._layout",
    "ProbeSettings": "._sections",
    "QueryLayout": "._layout",
    "ProgressFn": "._stage",
    "ReportLayout": "._layout",
    "Roots": "._roots",
    "RunConfig": "._config",
    "RunContext": "._context",
    "RunCosts": "._costs",
    "RunLayout": "._layout",
    "RunLog": "._log",
    "RunLogError": "._log",
    "Stage": "._stage",
    "StageOutcome": "._stage",
    "StageProgress": "._progress",
    "StageRecord": "._log",
    "StageResult": "._stage",
    "StageStatus": "._log",
    "StageLayout": "._layout",
    "Together": "._runner",
    "SweepLayout": "._layout",
    "ValidationJob": "._validation",
    "ValidationLayout": "._layout",
    "check_roots": "._roots",
    "file_sha256": "._log",
    "fingerprint": "._log",
    "git_revision": "._log",
    "listed_paths": "._runner",
    "load_run_config": "._config",
    "make_console": "._progress",
    "one_invocation": "._runner",
    "read_job": "._validation",
    "read_joint_job": "._validation",
    "run_stages": "._runner",
    "slug": "._layout",
    "took": "._progress",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
