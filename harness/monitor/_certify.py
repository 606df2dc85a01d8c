"""`calibrate_bundle`: calibrate one threshold for deployment on a run's whole test split and write
the bundle; `certify`: the LTT step itself, shared with `ctd monitor audit`, which redoes it.

Calibration follows the paper and SPEC section 4 with no evaluation half: the test split of one
probe seed is cut at random into D_est (30%: the threshold grid, the Pareto filter and the
selection) and D_cal (70%: fixed-sequence testing from integer counts), by calibrate's own
`threshold_candidates` and `budget_control` / `performance_control`, or `joint_control` when
several risks are certified at once (`certify_joint`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import calibrate
from experts import ExpertSpec

from .._errors import InputError
from ..data import BINARY_SUFFIX, read_scores, staging_folder, write_json
from ..expert import expert_record, read_expert
from ..run import BundleLayout, RunConfig, RunLayout, file_sha256, load_run_config
from ..stages import read_expert_calibration
from ._bundle import (
    EXPERT_CALIBRATION_KEY,
    POLICY,
    PROCEDURE,
    STAGING_MARK,
    check_bundle_name,
    check_replaceable,
    install_bundle,
    staging_prefix,
)
from ._bundle_record import (
    BUNDLE_VERSION,
    CONTROL_MODES,
    JOINT_BUNDLE_VERSION,
    SINGLE_RISK,
    BundleCandidates,
    BundleRecord,
    BundleSources,
    ControlMode,
    ProbeSource,
    ScoresSource,
)

__all__ = [
    "BundleWritten",
    "TestRows",
    "calibrate_bundle",
    "certify",
    "certify_joint",
    "deploy_splits",
    "queried_expert",
    "test_rows",
]

PROBE_SUFFIXES = (".safetensors", ".json")
# The `ctd monitor calibrate` option that sets each risk's level (the error's as 1 - accuracy).
RISK_OPTION = {"budget": "budget", "error": "accuracy", "fnr": "fnr"}


@dataclass(frozen=True)
class TestRows:
    """The test split of one probe seed and configuration of a run's scores table."""

    seed: int
    ids: np.ndarray
    scores: calibrate.Scores


@dataclass(frozen=True)
class BundleWritten:
    """What `calibrate_bundle` did: the LTT result (joint control's for a joint bundle), the
    bundle folder (None when nothing was certified, and then nothing is written) and where a
    replaced bundle was kept."""

    result: calibrate.ControlResult | calibrate.JointResult
    folder: Path | None
    replaced: Path | None = None


def test_rows(layout: RunLayout, arch: str, seed: int | None) -> TestRows:
    """The test rows of `arch` and `seed` (default: the table's first seed) of the run's table."""
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
    return TestRows(seed, table.id[rows], scores)


def deploy_splits(n: int, split_seed: int) -> calibrate.Splits:
    """One random cut of range(n) into D_est (calibrate.EST_FRACTION) and D_cal, with no evaluation
    half (SPEC section 4)."""
    n_est = int(calibrate.split_sizes(n, 1.0, calibrate.EST_FRACTION)[0])
    order = np.random.default_rng(split_seed).permutation(n).astype(np.int64)
    return calibrate.Splits(order[None, :n_est], order[None, n_est:], np.zeros((1, 0), np.int64))


def certify(
    scores: calibrate.Scores,
    splits: calibrate.Splits,
    *,
    mode: ControlMode,
    alpha: float,
    delta: float,
    objective: calibrate.Objective,
) -> tuple[calibrate.Candidates, calibrate.ControlResult]:
    """The candidates on D_est and the LTT result on D_cal of the CTD policy. Performance control
    tests in order of D_est error and selects by D_est budget; its candidates carry the error as
    their objective, so the record says what the order used (`objective` is budget control's)."""
    signal = calibrate.policy_signal(scores, POLICY, splits)
    (candidates,) = calibrate.threshold_candidates(
        scores, signal, splits, merge=POLICY.merge, objective=objective if mode == "budget" else "accuracy"
    )
    control = calibrate.budget_control if mode == "budget" else calibrate.performance_control
    return candidates, control(candidates, alpha=alpha, control=calibrate.ControlConfig(delta=delta))


def certify_joint(
    scores: calibrate.Scores,
    splits: calibrate.Splits,
    *,
    levels: Mapping[str, float],
    delta: float,
    objective: calibrate.Objective,
) -> tuple[calibrate.Candidates, calibrate.JointResult]:
    """The candidates on D_est and joint control's result on D_cal: every risk of `levels`
    ("budget", "error", "fnr") certified at the chosen threshold at once, the family-wise error
    at `delta`, selected by the D_est `objective` (the candidates carry it, as budget control's)."""
    signal = calibrate.policy_signal(scores, POLICY, splits)
    (candidates,) = calibrate.threshold_candidates(
        scores, signal, splits, merge=POLICY.merge, objective=objective
    )
    extra = []
    if "fnr" in levels:
        extra.append(
            calibrate.missed_positives(
                scores,
                signal,
                splits,
                candidates.thresholds[None, :],
                merge=POLICY.merge,
                alpha=levels["fnr"],
            )
        )
    result = calibrate.joint_control(
        candidates,
        budget=levels.get("budget"),
        error=levels.get("error"),
        extra=extra,
        objective=objective,
        control=calibrate.ControlConfig(delta=delta),
    )
    return candidates, result


def cal_rows(scores: calibrate.Scores, splits: calibrate.Splits, risk: str) -> int:
    """The D_cal rows a risk is counted on: every row, or the positives for the false-negative
    rate (label 1)."""
    return int(scores.label[splits.cal[0]].sum()) if risk == "fnr" else splits.cal.shape[1]


def queried_expert(layout: RunLayout, config: RunConfig) -> ExpertSpec:
    """The expert the run's query stage asked, as it wrote it (query/expert.json), whatever the
    registry says now. A run made before the query stage wrote that file has none: its expert
    is resolved from its config.toml (`expert`, `expert_model`) against the registry in force,
    as it always was."""
    return read_expert(layout.query.expert) or config.expert_settings.resolve().spec


def calibrate_bundle(
    layout: RunLayout,
    *,
    name: str,
    mode: ControlMode,
    alpha: float | None = None,
    levels: Mapping[str, float] | None = None,
    delta: float = calibrate.DEFAULT_DELTA,
    arch: str | None = None,
    seed: int | None = None,
    split_seed: int = calibrate.DEFAULT_SPLIT_SEED,
    objective: calibrate.Objective = calibrate.ValidationConfig.objective,  # what `ctd validate` checks
    force: bool = False,
) -> BundleWritten:
    """Calibrate the CTD policy of the run for deployment and write the bundle `monitor/NAME/`,
    replacing one already there only with `force` (the old one is kept beside it). Mode "budget"
    or "performance" certifies the one level `alpha`; mode "joint" every risk of `levels`
    ("budget", "error", "fnr": each risk's level, the error's 1 - accuracy) at once."""
    target = layout.bundle(check_bundle_name(name))
    if not layout.root.is_dir():
        raise InputError(f"--run {layout.name}: no run folder {layout.root}")
    if mode not in CONTROL_MODES:
        raise InputError(f"mode {mode!r}: choose from {', '.join(CONTROL_MODES)}")
    if (mode == "joint") != (levels is not None) or (mode == "joint") == (alpha is not None):
        raise InputError(f"mode {mode!r}: give `levels` for joint control, `alpha` otherwise")
    if levels is not None:
        unknown = set(levels) - set(calibrate.JOINT_RISKS)
        if unknown or not levels:
            raise InputError(f"levels {dict(levels)}: name one or more of {', '.join(calibrate.JOINT_RISKS)}")
        # calibrate's order (budget, error, fnr): the order joint control records them in.
        levels = {risk: float(levels[risk]) for risk in calibrate.JOINT_RISKS if risk in levels}
        # Each level as its option gives it: the error's as the accuracy 1 - level.
        checked = [
            (f"--{RISK_OPTION[risk]}", round(1.0 - level, 12) if risk == "error" else level)
            for risk, level in levels.items()
        ]
    else:
        checked = [("--budget" if mode == "budget" else "--accuracy", alpha)]
    for option, value in (*checked, ("--delta", delta)):
        if not 0 < value < 1:  # type: ignore[operator]
            raise InputError(f"{option} {value:g}: must lie in (0, 1)")
    check_replaceable(target, force=force)
    if not layout.config.is_file():
        raise InputError(f"--run {layout.name}: {layout.config} is missing")
    config = load_run_config(layout.config, {})
    arch = arch or config.archs[0]
    base, target_kind = (
        (arch[: -len(BINARY_SUFFIX)], "binary") if arch.endswith(BINARY_SUFFIX) else (arch, None)
    )
    if target_kind is None:
        target_kind = "continuous" if config.dv_target == "both" else config.dv_target
    scores_sha256 = file_sha256(layout.scores)
    rows = test_rows(layout, arch, seed)
    if file_sha256(layout.scores) != scores_sha256:  # the hash must be of the table that was read
        raise InputError(
            f"--run {layout.name}: {layout.scores} changed while it was read; run the command again"
        )
    splits = deploy_splits(rows.scores.n, split_seed)
    for risk, level in (levels or {SINGLE_RISK[mode]: alpha}).items():
        size = calibrate.calibration_size(cal_rows(rows.scores, splits, risk), level, delta)
        if not size.enough:
            counted = "positives (label 1)" if risk == "fnr" else "rows"
            raise InputError(
                f"--run {layout.name}: the test split of seed {rows.seed} has {rows.scores.n} rows, so D_cal "
                f"holds {size.n} {counted}; {risk} level {level:g} at --delta {delta:g} needs at least "
                f"{size.need}"
            )
    sources = {
        "safety": layout.probe.artifact(base, rows.seed),
        "dv": layout.dv.artifact(target_kind, base, rows.seed),
    }
    for source in sources.values():
        for suffix in PROBE_SUFFIXES:
            if not source.with_suffix(suffix).is_file():
                raise InputError(
                    f"--run {layout.name}: {source.with_suffix(suffix)} is missing (run `ctd eval` again: "
                    "runs from before probes were saved retrain them)"
                )
    if levels is not None:
        candidates, result = certify_joint(
            rows.scores, splits, levels=levels, delta=delta, objective=objective
        )
    else:
        candidates, result = certify(
            rows.scores, splits, mode=mode, alpha=alpha, delta=delta, objective=objective
        )
    if not result.has_policy:
        return BundleWritten(result, None)

    expert = expert_record(queried_expert(layout, config))
    calibration = read_expert_calibration(layout.query)  # what the scores table's expert column is
    if calibration.kind != "none":
        expert[EXPERT_CALIBRATION_KEY] = calibration.to_json()
    selected = int(result.selected) if result.selected is not None else None
    scores_source = ScoresSource(str(layout.scores.relative_to(layout.root)), scores_sha256)
    probe_sources = {
        part: ProbeSource(
            str(stem.relative_to(layout.root)),
            **{suffix[1:]: file_sha256(stem.with_suffix(suffix)) for suffix in PROBE_SUFFIXES},
        )
        for part, stem in sources.items()
    }
    record = BundleRecord(
        version=BUNDLE_VERSION if levels is None else JOINT_BUNDLE_VERSION,
        run=str(layout.root.resolve()),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        policy=POLICY.name,
        signal=POLICY.signal,
        merge=POLICY.merge,
        mode=mode,
        alpha=alpha,
        levels=levels,
        delta=delta,
        # Budget control: Pareto over (budget, objective), test by D_est budget, select by the
        # objective. Performance control: Pareto over (budget, error), test by D_est error,
        # select by D_est budget; its objective is the error. Joint control: Pareto over the
        # risks and the objective, test by the D_est max-p-value, select by the objective.
        objective=objective if mode != "performance" else "accuracy",
        test_order=PROCEDURE[mode]["test_order"],
        selection=PROCEDURE[mode]["selection"],
        threshold=float(result.threshold),
        arch=arch,
        dv_target=target_kind,
        seed=rows.seed,
        split_seed=split_seed,
        n_test=rows.scores.n,
        # What D_est saw at the chosen threshold: the expected delegation rate and error.
        est_budget=None if selected is None else float(candidates.est_budget[selected]),
        est_error=None if selected is None else float(candidates.est_error[selected]),
        expert=expert,
        ltt=result.to_dict(),
        # The candidates the LTT record's indices point into, with their D_est statistics.
        candidates=BundleCandidates(
            thresholds=tuple(float(t) for t in candidates.thresholds),
            est_budget=tuple(candidates.est_budget.tolist()),
            est_objective=tuple(candidates.est_objective.tolist()),
        ),
        # What was certified, by content: the run's scores table and each probe's files (paths
        # relative to the run folder), so that `ctd monitor audit` can tell a changed run.
        sources=BundleSources(scores_source, probe_sources["safety"], probe_sources["dv"]),
        # Which test examples tested the thresholds and which chose them: the audit can be redone.
        cal_ids=tuple(str(i) for i in rows.ids[splits.cal[0]]),
        est_ids=tuple(str(i) for i in rows.ids[splits.est[0]]),
    )
    # Written beside the target and swapped in; a failure or a kill leaves no half-written bundle
    # under the name, and what a killed writer staged is removed by the next writer of the name.
    prefix = staging_prefix(target.root.name)
    with staging_folder(layout.monitor, prefix, marker=STAGING_MARK) as folder:
        staged = BundleLayout(folder)
        for part, stem in (("safety", staged.safety_probe), ("dv", staged.dv_probe)):
            for suffix in PROBE_SUFFIXES:
                shutil.copyfile(sources[part].with_suffix(suffix), stem.with_suffix(suffix))
                if file_sha256(stem.with_suffix(suffix)) != record.sources.probe(part).sha256(suffix):
                    raise InputError(
                        f"--run {layout.name}: {sources[part].with_suffix(suffix)} changed while it was "
                        "copied (is another run writing it?); run the command again"
                    )
        write_json(staged.record, record.to_json())
        kept = install_bundle(staged, target, force=force)
    return BundleWritten(result, target.root, kept)
