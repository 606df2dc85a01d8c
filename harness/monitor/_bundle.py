"""A monitor bundle: the calibrated cascade out of its run folder. `calibrate_bundle` calibrates one
threshold for deployment on a run's whole test split and writes the bundle; `read_bundle` reads it
back, checked, for `Monitor.load`.

Calibration follows the paper and SPEC section 4 with no evaluation half: the test split of one
probe seed is cut at random into D_est (30%: the threshold grid, the Pareto filter and the
selection) and D_cal (70%: fixed-sequence testing from integer counts), by calibrate's own
`threshold_candidates` and `budget_control` / `performance_control`.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

import calibrate
from experts import ExpertSpec

from .._errors import InputError
from ..data._scores import BINARY_SUFFIX, read_scores
from ..data._tables import read_json, write_json
from ..run._config import load_run_config
from ..run._layout import BundleLayout, RunLayout
from ..stages._query import pick_expert

__all__ = ["BUNDLE_VERSION", "CONTROL_MODES", "Bundle", "ControlMode", "calibrate_bundle", "read_bundle"]

BUNDLE_VERSION = 1
ControlMode = Literal["budget", "performance"]
CONTROL_MODES: tuple[str, ...] = get_args(ControlMode)
POLICY = calibrate.POLICIES["ctd"]  # the DV signal, calibrated, its own merge rule (overwrite)
EST_FRACTION = 0.3  # of the test split for D_est; the rest is D_cal (SPEC section 4)
# What the expert entry keeps: where and how to ask, never a key (api_key_env names a variable).
EXPERT_FIELDS = ("name", "base_urls", "model", "method", "template", "top_logprobs", "api_key_env")


@dataclass(frozen=True)
class Bundle:
    """A bundle as read back: its folder, its record (bundle.json) and the parts a monitor uses."""

    layout: BundleLayout
    record: dict[str, Any]

    @property
    def threshold(self) -> float:
        """Delegate when DV > threshold (+inf: never)."""
        value = self.record["threshold"]
        return float("inf") if value == "inf" else float(value)

    @property
    def merge(self) -> calibrate.MergeRule:
        return self.record["merge"]

    @property
    def mode(self) -> ControlMode:
        return self.record["mode"]

    @property
    def alpha(self) -> float:
        return float(self.record["alpha"])

    def expert_spec(self, url: str | None = None) -> ExpertSpec:
        """The expert entry as a spec, its base URL replaced by `url` when given."""
        entry = dict(self.record["expert"])
        entry["base_urls"] = (url,) if url else tuple(entry["base_urls"])
        try:
            return ExpertSpec(**entry, source=str(self.layout.record))
        except Exception as error:  # InvalidSetting: a URL that cannot work, a bad field
            raise InputError(f"{self.layout.record}: expert entry: {error}") from None


def read_bundle(folder: Path) -> Bundle:
    """The bundle in `folder`, checked: version, threshold, merge rule and both probes present."""
    layout = BundleLayout(Path(folder))
    if not layout.record.is_file():
        raise InputError(
            f"{folder}: not a monitor bundle (no {layout.record.name}; see `ctd monitor calibrate`)"
        )
    record = read_json(layout.record)
    if record.get("version") != BUNDLE_VERSION:
        raise InputError(
            f"{layout.record}: bundle version {record.get('version')!r}, expected {BUNDLE_VERSION}"
        )
    for key in ("threshold", "merge", "mode", "alpha", "expert", "ltt"):
        if key not in record:
            raise InputError(f"{layout.record}: missing key {key!r}")
    if record["merge"] not in calibrate.MERGE_RULES or record["mode"] not in CONTROL_MODES:
        raise InputError(f"{layout.record}: merge {record['merge']!r} / mode {record['mode']!r} unknown")
    for stem in (layout.safety_probe, layout.dv_probe):
        for suffix in (".safetensors", ".json"):
            if not stem.with_suffix(suffix).is_file():
                raise InputError(f"{stem.with_suffix(suffix)}: missing from the bundle")
    return Bundle(layout, record)


def _test_rows(layout: RunLayout, arch: str, seed: int | None) -> tuple[int, np.ndarray, calibrate.Scores]:
    """(seed, ids, scores) of the test split of one probe seed of the run's scores table."""
    if not layout.scores.is_file():
        raise InputError(
            f"--run {layout.name}: {layout.scores} does not exist (has the run reached the dv stage?)"
        )
    table = read_scores(layout.scores)
    if arch not in table.archs:
        raise InputError(f"--arch {arch}: not in {layout.scores} (it has {', '.join(table.archs)})")
    seed = table.seeds[0] if seed is None else seed
    if seed not in table.seeds:
        raise InputError(f"--seed {seed}: not in {layout.scores} (it has {', '.join(map(str, table.seeds))})")
    rows = (table.split == "test") & (table.arch == arch) & (table.seed == seed)
    scores = calibrate.Scores(
        label=table.label[rows], probe=table.probe[rows], expert=table.expert[rows], dv=table.dv[rows]
    )
    return seed, table.id[rows], scores


def deploy_splits(n: int, split_seed: int) -> calibrate.Splits:
    """One random cut of range(n) into D_est (EST_FRACTION) and D_cal, with no evaluation half."""
    n_est = int(calibrate.split_sizes(n, 1.0, EST_FRACTION)[0])
    order = np.random.default_rng(split_seed).permutation(n).astype(np.int64)
    return calibrate.Splits(order[None, :n_est], order[None, n_est:], np.zeros((1, 0), np.int64))


def calibrate_bundle(
    layout: RunLayout,
    *,
    name: str,
    mode: ControlMode,
    alpha: float,
    delta: float = 0.1,
    arch: str | None = None,
    seed: int | None = None,
    split_seed: int = 0,
    objective: calibrate.Objective = "auroc",
) -> tuple[Path | None, calibrate.ControlResult]:
    """Calibrate the CTD policy of the run for deployment and write the bundle `monitor/NAME/`.
    Returns (bundle folder, LTT result); the folder is None when performance control certified
    nothing (then nothing is written)."""
    if not layout.root.is_dir():
        raise InputError(f"--run {layout.name}: no run folder {layout.root}")
    if mode not in CONTROL_MODES:
        raise InputError(f"mode {mode!r}: choose from {', '.join(CONTROL_MODES)}")
    for option, value in (("--budget" if mode == "budget" else "--accuracy", alpha), ("--delta", delta)):
        if not 0 < value < 1:
            raise InputError(f"{option} {value:g}: must lie in (0, 1)")
    config = load_run_config(layout.config, {}) if layout.config.is_file() else None
    if config is None:
        raise InputError(f"--run {layout.name}: {layout.config} is missing")
    arch = arch or config.archs[0]
    base, target = (arch[: -len(BINARY_SUFFIX)], "binary") if arch.endswith(BINARY_SUFFIX) else (arch, None)
    if target is None:
        target = "continuous" if config.dv_target == "both" else config.dv_target
    seed, ids, scores = _test_rows(layout, arch, seed)
    splits = deploy_splits(scores.n, split_seed)
    need = calibrate.min_calibration_size(alpha, delta)
    if splits.cal.shape[1] < need:
        raise InputError(
            f"--run {layout.name}: the test split of seed {seed} has {scores.n} rows, so D_cal holds "
            f"{splits.cal.shape[1]}; level {alpha:g} at --delta {delta:g} needs at least {need}"
        )
    signal = calibrate.policy_signal(scores, POLICY, splits)
    (candidates,) = calibrate.threshold_candidates(
        scores, signal, splits, merge=POLICY.merge, objective=objective
    )
    control = calibrate.budget_control if mode == "budget" else calibrate.performance_control
    result = control(candidates, alpha=alpha, delta=delta)
    if not result.has_policy:
        return None, result

    spec = pick_expert(config.expert, None, config.expert_model)  # a registered name or a URL
    expert = {key: getattr(spec, key) for key in EXPERT_FIELDS}
    expert["base_urls"] = list(spec.base_urls)  # as registered: a $VAR override is not resolved into it
    bundle = layout.bundle(name)
    selected = int(result.selected) if result.selected is not None else None
    record = {
        "version": BUNDLE_VERSION,
        "run": str(layout.root.resolve()),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "policy": POLICY.name,
        "signal": POLICY.signal,
        "merge": POLICY.merge,
        "mode": mode,
        "alpha": alpha,
        "delta": delta,
        "objective": objective,
        "threshold": "inf" if np.isposinf(result.threshold) else float(result.threshold),
        "arch": arch,
        "dv_target": target,
        "seed": seed,
        "split_seed": split_seed,
        "n_test": scores.n,
        # What D_est saw at the chosen threshold: the expected delegation rate and error.
        "est_budget": None if selected is None else float(candidates.est_budget[selected]),
        "est_error": None if selected is None else float(candidates.est_error[selected]),
        "expert": expert,
        "ltt": result.to_dict(),
        # The candidates the LTT record's indices point into, with their D_est statistics.
        "candidates": {
            "thresholds": ["inf" if np.isposinf(t) else float(t) for t in candidates.thresholds],
            "est_budget": candidates.est_budget.tolist(),
            "est_objective": candidates.est_objective.tolist(),
        },
        # Which test examples tested the thresholds and which chose them: the audit can be redone.
        "cal_ids": [str(i) for i in ids[splits.cal[0]]],
        "est_ids": [str(i) for i in ids[splits.est[0]]],
    }
    staging = bundle.root.with_name(f".{name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    staged = type(bundle)(staging)
    for source, stem in (
        (layout.probe_artifact(base, seed), staged.safety_probe),
        (layout.dv_artifact(target, base, seed), staged.dv_probe),
    ):
        for suffix in (".safetensors", ".json"):
            if not source.with_suffix(suffix).is_file():
                shutil.rmtree(staging, ignore_errors=True)
                raise InputError(
                    f"--run {layout.name}: {source.with_suffix(suffix)} is missing (run `ctd eval` again: "
                    "runs from before probes were saved retrain them)"
                )
            shutil.copyfile(source.with_suffix(suffix), stem.with_suffix(suffix))
    write_json(staged.record, record)
    if bundle.root.exists():
        shutil.rmtree(bundle.root)
    staging.rename(bundle.root)
    return bundle.root, result
