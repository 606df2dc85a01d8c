"""A monitor bundle: the calibrated cascade out of its run folder (written by
`harness.monitor._certify.calibrate_bundle`). `read_bundle` reads one back, checked against the
content hashes it records, for `Monitor.load`; the rest keeps bundle folders safe: one plain name
each, written beside and swapped in, never deleted to make room."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import calibrate
import experts
from experts import ExpertSpec

from .._errors import InputError
from ..data import cleaning_lock, exchange_folders, read_json
from ..expert import spec_from_record
from ..run import BundleLayout, file_sha256
from ._bundle_record import BUNDLE_VERSION, CONTROL_MODES, BundleRecord, ControlMode
from ._drift import check_delegation_rate

__all__ = [
    "BUNDLE_VERSION",
    "CONTROL_MODES",
    "Bundle",
    "ControlMode",
    "check_bundle_name",
    "check_replaceable",
    "install_bundle",
    "read_bundle",
    "staging_prefix",
]

# The key of the expert entry that carries the run's expert calibration (absent: none, as in a
# bundle from before it): `calibrate.ExpertCalibration.to_json()`, applied to every live answer.
EXPERT_CALIBRATION_KEY = "calibration"
POLICY = calibrate.POLICIES["ctd"]  # the DV signal, calibrated, its own merge rule (overwrite)
# What each certified risk is, in words (calibrate.JOINT_RISKS).
RISK_TEXT = {"budget": "a delegation rate", "error": "an error", "fnr": "a false-negative rate"}
# One plain folder name: no separator, no '.'/'..', nothing hidden (staging folders start with '.').
BUNDLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# What each mode tests in order and selects by (calibrate's budget_control / performance_control,
# and joint_control: the D_est max over the risks of their p-values, Pareto testing's order).
PROCEDURE: dict[str, dict[str, str]] = {
    "budget": {"test_order": "est_budget", "selection": "est_objective"},
    "performance": {"test_order": "est_error", "selection": "est_budget"},
    "joint": {"test_order": "est_max_pvalue", "selection": "est_objective"},
}


@dataclass(frozen=True)
class Bundle:
    """A bundle as read back: its folder, its record (bundle.json) and the parts a monitor uses."""

    layout: BundleLayout
    record: BundleRecord

    @property
    def threshold(self) -> float:
        """Delegate when DV > threshold (+inf: never)."""
        return self.record.threshold

    @property
    def merge(self) -> calibrate.MergeRule:
        return self.record.merge

    @property
    def mode(self) -> ControlMode:
        return self.record.mode

    @property
    def alpha(self) -> float | None:
        """A single-risk bundle's level (None in a joint bundle: see `levels`)."""
        return self.record.alpha

    @property
    def levels(self) -> dict[str, float]:
        """Every certified risk ("budget", "error", "fnr") and its level."""
        return self.record.certified_levels

    def delegates(self, dv: float) -> bool:
        """The cascade's delegation rule: DV strictly above the threshold."""
        return bool(dv > self.threshold)

    @property
    def expert_calibration(self) -> calibrate.ExpertCalibration:
        """The run's expert calibration, carried in the expert entry (none when it holds none)."""
        record = self.record.expert.get(EXPERT_CALIBRATION_KEY)
        if record is None:
            return calibrate.ExpertCalibration()
        if not isinstance(record, dict):
            raise InputError(
                f"{self.layout.record}: expert calibration: expected an object, not {type(record).__name__}"
            )
        try:
            return calibrate.ExpertCalibration.from_json(record)
        except KeyError as error:
            raise InputError(f"{self.layout.record}: expert calibration: missing field {error}") from None
        except (TypeError, ValueError) as error:
            raise InputError(f"{self.layout.record}: expert calibration: {error}") from None

    def expert_score(self, answer: float | None) -> float | None:
        """The expert's score as the cascade uses it: its raw answer through the run's expert
        calibration, the one place a monitor or `ctd score` turns a live answer into the score
        the run calibrated on (and reports, as the run's scores.parquet does)."""
        return None if answer is None else float(self.expert_calibration.apply(answer))

    def merged(self, probe: float, expert: float | None) -> float:
        """The cascade's score: the merge rule's when there is an expert score (`expert_score`
        of its answer), else the probe's."""
        if expert is None:
            return probe
        return float(calibrate.merge_scores(probe, expert, self.merge))

    def check_cap(self, max_delegation_rate: float | None) -> None:
        """A cap on expert calls keeps a budget bundle's guarantee (it only lowers the delegation
        rate) but voids an accuracy bundle's: the certified error is the uncapped cascade's.
        A joint bundle's budget part would survive a cap as a budget bundle's does, but its
        error and false-negative parts are the uncapped cascade's, and a cap voids them: a cap is
        refused for every bundle that certifies anything beside the delegation rate."""
        if max_delegation_rate is None:
            return
        if self.mode == "performance":
            raise InputError(
                f"--max-delegation-rate: {self.layout.root.name} certifies accuracy (error at most "
                f"{self.alpha:g}) for the uncapped cascade, and a cap on expert calls would void that; "
                "the cap is for budget bundles (or calibrate one with --budget)"
            )
        others = {risk: level for risk, level in self.levels.items() if risk != "budget"}
        if others:
            held = " and ".join(f"{RISK_TEXT[risk]} at most {level:g}" for risk, level in others.items())
            raise InputError(
                f"--max-delegation-rate: {self.layout.root.name} certifies {held} for the uncapped "
                "cascade, and a cap on expert calls would void that; the cap is for budget bundles "
                "(or calibrate one with --budget alone)"
            )
        check_delegation_rate(max_delegation_rate)

    def expert_spec(self, url: str | None = None) -> ExpertSpec:
        """The expert entry as a spec, its base URL replaced by `url` when given."""
        if url:  # the option's own fault is named as the option's, not as the bundle's
            try:
                experts.check_base_url(url, "--expert-url")
            except experts.InvalidSetting as error:
                raise InputError(str(error)) from None
        entry = dict(self.record.expert)
        entry.pop(EXPERT_CALIBRATION_KEY, None)  # how answers are read, not how the expert is asked
        if not entry:
            raise InputError(f"{self.layout.record}: names no expert; serve it with --no-expert")
        try:
            entry["base_urls"] = (url,) if url else tuple(entry["base_urls"])
            return spec_from_record(entry, source=str(self.layout.record))
        except Exception as error:  # InvalidSetting (a URL that cannot work), a missing or bad field
            problem = f"no {error}" if isinstance(error, KeyError) else str(error)
            raise InputError(f"{self.layout.record}: expert entry: {problem}") from None


def read_bundle(folder: Path) -> Bundle:
    """The bundle in `folder`, checked: version, threshold, merge rule and both probes present."""
    layout = BundleLayout(Path(folder))
    if not layout.record.is_file():
        raise InputError(
            f"{folder}: not a monitor bundle (no {layout.record.name}; see `ctd monitor calibrate`)"
        )
    record = BundleRecord.from_json(read_json(layout.record), layout.record)
    for part, stem in (("safety", layout.safety_probe), ("dv", layout.dv_probe)):
        for suffix in (".safetensors", ".json"):
            path = stem.with_suffix(suffix)
            if not path.is_file():
                raise InputError(f"{path}: missing from the bundle")
            if file_sha256(path) != record.sources.probe(part).sha256(suffix):
                raise InputError(
                    f"{path}: its content is not what was certified (its sha256 differs from "
                    f"{layout.record.name}'s): the file was changed or damaged; copy the bundle again"
                )
    bundle = Bundle(layout, record)
    # Read now: a damaged expert calibration found only once the expert was paid is found too late.
    _ = bundle.expert_calibration
    return bundle


def check_bundle_name(name: str) -> str:
    """`name` if it is one plain folder name (letters, digits, '.', '_', '-'; not starting with
    '.' or '-'; at most 100 characters), else InputError naming --name: a bundle name is joined to
    the run's monitor/ folder, so '..', '.', 'a/b' or an absolute path would reach outside it."""
    if not BUNDLE_NAME.fullmatch(name):
        raise InputError(
            f"--name {name!r}: must be one plain folder name (letters, digits, '.', '_', '-', not "
            "starting with '.' or '-', at most 100 characters)"
        )
    return name


def check_replaceable(target: BundleLayout, *, force: bool) -> None:
    """Nothing is replaced by accident: an existing bundle only with --force, and a path that
    holds something other than a bundle never."""
    if not target.root.exists() and not target.root.is_symlink():
        return
    if target.root.is_symlink() or not target.record.is_file():
        raise InputError(
            f"--name {target.root.name}: {target.root} exists and is not a monitor bundle: "
            "choose another name"
        )
    if not force:
        raise InputError(
            f"--name {target.root.name}: the bundle {target.root} exists; give --force to replace it "
            "(the old one is kept beside it, with its decision log)"
        )


def staging_prefix(name: str) -> str:
    """The prefix of the hidden folders a new bundle `name` is written into, beside it (on the same
    file system) before it takes the name: `harness.data.staging_folder`'s, so that the next
    bundle of that name removes what a killed writer left. `~` is in no bundle name, so no other
    name's prefix starts with this one."""
    return f".{name}~partial-"


# In a staged bundle while it is written: a dead writer's folder is cleared only while it holds
# this (`staging_folder(marker=...)`), and `install_bundle` removes it before the exchange, after
# which the staged path may hold the old bundle.
STAGING_MARK = ".staging"


def install_bundle(staged: BundleLayout, target: BundleLayout, *, force: bool) -> Path | None:
    """Give the staged bundle its name. A bundle already there is swapped out in one atomic step
    where the system can (Linux renameat2 RENAME_EXCHANGE), else by two renames, and kept as
    NAME.replaced-TIME (a server may still be writing its decision log). Returns where the old
    bundle was kept, or None when there was none.

    Under the staging folders' cleaning lock, `check_replaceable` again (a writer of the same name
    may have installed its bundle since the first check), then the staged folder's mark removed:
    between the exchange and the rename the old bundle lies at the staged path, which no cleaner
    may then take for a dead writer's. If the old bundle cannot be renamed, or the rename is
    interrupted, the two are swapped back and nothing is replaced."""
    # Ctrl-C and SIGTERM wait until the names are settled: between the mark's removal and the
    # rename, a stop would leave the new or the old bundle at a hidden path nobody clears.
    with experts.signals_held(), cleaning_lock(target.root.parent):
        check_replaceable(target, force=force)
        (staged.root / STAGING_MARK).unlink(missing_ok=True)
        if not target.root.exists():
            staged.root.rename(target.root)
            return None
        kept = target.root.with_name(
            f"{target.root.name}.replaced-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        )
        while kept.exists():
            kept = kept.with_name(kept.name + "_")
        if exchange_folders(staged.root, target.root):
            try:
                staged.root.rename(kept)  # the staged path now holds the old bundle
            except BaseException as error:
                back = _swap_back(staged, target)
                if not isinstance(error, OSError):
                    raise  # Ctrl-C, say: stopped, with the old bundle back if it could be
                _say_not_replaced(staged, target, kept, error, back)
            return kept
        target.root.rename(kept)
        try:
            staged.root.rename(target.root)
        except BaseException:
            kept.rename(target.root)  # put the old bundle back rather than leave no bundle
            raise
        return kept


def _swap_back(staged: BundleLayout, target: BundleLayout) -> bool:
    """Exchange the old bundle, at the staged path, and the new one, under the name, back: the same
    two names, so what failed the rename rarely fails this. Whether it was done."""
    try:
        return exchange_folders(staged.root, target.root)
    except OSError:
        return False


def _say_not_replaced(
    staged: BundleLayout, target: BundleLayout, kept: Path, error: OSError, back: bool
) -> NoReturn:
    why = error.strerror or str(error)
    if back:
        raise InputError(
            f"{target.root}: the bundle there could not be kept as {kept.name} ({why}); nothing was replaced"
        ) from None
    raise InputError(
        f"{target.root} is the new bundle; the old one could not be kept as {kept.name} ({why}) and "
        f"is at {staged.root}: move it elsewhere"
    ) from None
