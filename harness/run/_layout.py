"""Every path inside one run folder (the roots it lives under, and the activation store and expert
cache that runs share, are `_roots.py`). Each file name is spelled here once, in one layout object
per folder kind (`RunLayout` hands out the others: `ProbeLayout`, `QueryLayout`, `DVLayout`,
`SweepLayout`, `ValidationLayout`, `ReportLayout`, `BundleLayout`); stages, the report, the CLI and
the monitor ask them for every path, and tests/harness/test_layout_names.py checks that no other
source file spells a name.

A run folder `runs/NAME/` holds:
    config.toml            the resolved configuration
    run.json               the run log (`RunLog`): versions, and each stage's status, time and detail
    log.txt                what ran, what was skipped and why, with times
    manifests/STAGE.json   the stage's fingerprint (its settings and the hashes of its inputs) and
                           the hashes of its outputs; written only when the stage has finished
    probe/                 probe_scores.parquet, stores.json, probe_metrics.json
    probe/probes/          every trained safety probe: ARCH-seedS.safetensors and .json
    query/                 expert_scores.parquet (with each input's start and the expert's top
                           tokens; the raw and the calibrated expert score), failed.csv,
                           server.log, expert.json (the expert asked), expert_calibration.json
    dv/                    scores-TARGET.parquet, dv_metrics.json
    dv/probes/             every trained DV probe: TARGET-ARCH-seedS.safetensors and .json
    scores.parquet         the scores table (SPEC section 2), the contract of every later stage
    cascade/               with later experts (`--expert small,large`): query-K/ and dv-K/ of each
                           stage K >= 2 (as query/ and dv/), and scores.parquet, the scores table
                           with every stage's columns (expert_K, dv_K); calibrate/, its sweep
    calibrate/ARCH/        sweep.csv, groups.csv, decisions.parquet, ltt.jsonl, baselines.csv,
                           summary.json (merge-RULE/ for merge controls)
    validate/ARCH/         one record per validation job, with its per-trial table (cascade/:
                           the cascade of experts', per ARCH)
    report/                report.md, numbers.json, examples.parquet, tables/, figures/
    monitor/NAME/          a monitor bundle written by `ctd monitor calibrate` (see `BundleLayout`)
    inspect/ARCH.eval      an inspect_ai log per probe configuration (`ctd export inspect`;
                           ARCH.partK-of-N.eval for one of more than 5,000 samples)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

__all__ = [
    "BundleLayout",
    "CascadeLayout",
    "DVLayout",
    "ProbeLayout",
    "QueryLayout",
    "ReportLayout",
    "ReportTable",
    "RunLayout",
    "SweepLayout",
    "ValidationLayout",
    "slug",
]

_SCORES = "scores.parquet"  # the scores table's name: the run's, and its cascade's in cascade/


@dataclass(frozen=True)
class RunLayout:
    """Every path of one run folder (see the module docstring for what each holds); each stage's
    folder is a layout object of its own, handed out here."""

    root: Path

    @property
    def name(self) -> str:
        return self.root.name

    # the run's own records
    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def run_log(self) -> Path:
        return self.root / "run.json"

    @property
    def lock(self) -> Path:
        """The file an invocation holds locked while it runs (`harness.run.one_invocation`)."""
        return self.root / ".ctd-eval.lock"

    @property
    def text_log(self) -> Path:
        return self.root / "log.txt"

    def manifest(self, stage: str) -> Path:
        return self.root / "manifests" / f"{stage}.json"

    # stage outputs, in stage order
    @property
    def probe(self) -> ProbeLayout:
        return ProbeLayout(self.root / "probe")

    @property
    def query(self) -> QueryLayout:
        return QueryLayout(self.root / "query")

    @property
    def dv(self) -> DVLayout:
        return DVLayout(self.root / "dv")

    @property
    def scores(self) -> Path:
        return self.root / _SCORES

    @property
    def cascade(self) -> CascadeLayout:
        return CascadeLayout(self.root / "cascade")

    @property
    def calibrate(self) -> Path:
        """The folder of every sweep of the run."""
        return self.root / "calibrate"

    def sweep(self, arch: str, merge: str = "default") -> SweepLayout:
        """One sweep: calibrate/ARCH/, or calibrate/ARCH/merge-RULE/ for a merge control."""
        folder = self.calibrate / arch
        return SweepLayout(folder if merge == "default" else folder / f"merge-{merge}")

    @property
    def validate(self) -> Path:
        """The folder of every validation of the run."""
        return self.root / "validate"

    def validation(self, arch: str) -> ValidationLayout:
        return ValidationLayout(self.validate / arch)

    @property
    def cascade_validation(self) -> ValidationLayout:
        """validate/cascade/: the cascade of experts' validation, a record per probe configuration."""
        return ValidationLayout(self.validate / "cascade")

    def cascade_policy_validation(self, policy: str) -> ValidationLayout:
        """A cascade policy's validation: CTD's validate/cascade/, another's validate/cascade/POLICY/."""
        root = self.cascade_validation.root
        return ValidationLayout(root if policy == "ctd" else root / policy)

    @property
    def report(self) -> ReportLayout:
        return ReportLayout(self.root / "report")

    @property
    def monitor(self) -> Path:
        """The folder of every monitor bundle of the run."""
        return self.root / "monitor"

    def bundle(self, name: str) -> BundleLayout:
        return BundleLayout(self.monitor / name)

    @property
    def inspect(self) -> Path:
        """The folder `ctd export inspect` writes the run's inspect_ai logs to by default."""
        return self.root / "inspect"

    def inspect_log(self, arch: str, folder: Path | None = None) -> Path:
        """One probe configuration's inspect_ai log, in inspect/ or in `folder` (an --out folder)."""
        return (self.inspect if folder is None else Path(folder)) / f"{slug(arch)}.eval"


@dataclass(frozen=True)
class ProbeLayout:
    """probe/: the safety probes' scores, where their activations are, their metrics and the
    probes themselves (`ctd probe --out` writes the same folder)."""

    root: Path

    @property
    def scores(self) -> Path:
        return self.root / "probe_scores.parquet"

    @property
    def stores(self) -> Path:
        """The activation store of each split (folder and key), shared by runs."""
        return self.root / "stores.json"

    @property
    def metrics(self) -> Path:
        return self.root / "probe_metrics.json"

    def artifact(self, arch: str, seed: int) -> Path:
        """The saved safety probe of (arch, seed): a stem, see `probes.save_probe`."""
        return self.root / "probes" / f"{arch}-seed{seed}"


@dataclass(frozen=True)
class QueryLayout:
    """query/: the expert's scores, the examples it failed on, and the local server's log."""

    root: Path
    # expert_scores' column of the calibrated score, beside the raw `expert` (--expert-calibration)
    calibrated_column: ClassVar[str] = "expert_calibrated"

    @property
    def expert_scores(self) -> Path:
        return self.root / "expert_scores.parquet"

    @property
    def failed(self) -> Path:
        return self.root / "failed.csv"

    @property
    def server_log(self) -> Path:
        return self.root / "server.log"

    @property
    def expert(self) -> Path:
        """The expert the query stage asked (`harness.expert.ResolvedExpert.write`), as
        `ctd monitor calibrate` puts it in a bundle (JSON; a key only ever as its variable's name)."""
        return self.root / "expert.json"

    @property
    def expert_calibration(self) -> Path:
        """How the expert's raw scores were recalibrated (`calibrate.ExpertCalibration`, JSON): the
        DV stage and `ctd monitor calibrate` read the calibrated scores, a bundle carries this."""
        return self.root / "expert_calibration.json"


@dataclass(frozen=True)
class StageLayout(RunLayout):
    """A run's layout seen from stage `stage` (>= 2) of its cascade: `query` is that stage's
    folder, what the query stage writes for a later expert."""

    stage: int = 2

    @property
    def query(self) -> QueryLayout:
        return self.cascade.query(self.stage)


@dataclass(frozen=True)
class CascadeLayout:
    """cascade/: the later stages of a cascade of experts (stage K >= 2): each one's query and DV
    folders, and the scores table with every stage's columns."""

    root: Path

    def query(self, k: int) -> QueryLayout:
        return QueryLayout(self.root / f"query-{k}")

    def dv(self, k: int) -> DVLayout:
        return DVLayout(self.root / f"dv-{k}")

    @property
    def scores(self) -> Path:
        """The run's scores table with every stage's columns (expert_K, dv_K)."""
        return self.root / _SCORES

    @property
    def calibrate(self) -> SweepLayout:
        """The cascade's sweep (`ctd calibrate --run NAME --budget B1,B2`)."""
        return SweepLayout(self.root / "calibrate")


@dataclass(frozen=True)
class DVLayout:
    """dv/: the delegation-value probes' scores per target, their metrics, and the probes."""

    root: Path

    def scores(self, target: str) -> Path:
        return self.root / f"scores-{target}.parquet"

    @property
    def metrics(self) -> Path:
        return self.root / "dv_metrics.json"

    def artifact(self, target: str, arch: str, seed: int) -> Path:
        """The saved DV probe of (target, arch, seed): a stem, see `probes.save_probe`."""
        return self.root / "probes" / f"{target}-{arch}-seed{seed}"


@dataclass(frozen=True)
class SweepLayout:
    """One `calibrate_scores` output folder (calibrate/ARCH[/merge-RULE]/, or `ctd calibrate --out`)."""

    root: Path

    @property
    def table(self) -> Path:
        """The tidy sweep: one row per (seed, policy, objective, budget, batch size)."""
        return self.root / "sweep.csv"

    @property
    def groups(self) -> Path:
        """The group-conditional table of the same masks (calibrate.GROUP_COLUMNS)."""
        return self.root / "groups.csv"

    @property
    def decisions(self) -> Path:
        """The sweep's per-example masks (calibrate.DECISION_COLUMNS plus the example's id)."""
        return self.root / "decisions.parquet"

    @property
    def ltt(self) -> Path:
        """One LTT audit record per calibrated row (JSON lines)."""
        return self.root / "ltt.jsonl"

    @property
    def baselines(self) -> Path:
        return self.root / "baselines.csv"

    @property
    def summary(self) -> Path:
        """Every SweepConfig field, the DV quality and the means over budgets (JSON)."""
        return self.root / "summary.json"

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file of a sweep, summary.json last."""
        return self.table, self.groups, self.decisions, self.baselines, self.ltt, self.summary

    @property
    def required(self) -> tuple[Path, ...]:
        """What a reader of the sweep cannot do without (the rest may be absent in older runs)."""
        return self.table, self.baselines, self.summary


@dataclass(frozen=True)
class ValidationLayout:
    """validate/ARCH/: per validation job a record (JSON) and its per-trial table (Parquet)."""

    root: Path

    def record(self, job: str) -> Path:
        return self.root / f"{job}.json"

    def trials(self, job: str) -> Path:
        return self.root / f"{job}.parquet"


ReportTable = Literal[
    "curves",
    "groups",
    "validation",
    "validation-joint",
    "dv-quality",
    "mean-v-at-k",
    "binary-vs-continuous",
    "case-studies",
]
"""The report's tables of one probe configuration (tables/ARCH/NAME.csv)."""


def slug(name: str) -> str:
    """A name as one path part of the report (a probe configuration may hold any character)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


@dataclass(frozen=True)
class ReportLayout:
    """report/ (or the staging folder it is built in): report.md, numbers.json, examples.parquet,
    tables/summary.csv, and per probe configuration tables/ARCH/*.csv and figures/ARCH/*.png."""

    root: Path

    @property
    def markdown(self) -> Path:
        return self.root / "report.md"

    @property
    def numbers(self) -> Path:
        """Every number of the report, its warnings and what it found missing (JSON)."""
        return self.root / "numbers.json"

    @property
    def examples(self) -> Path:
        """One row per (example, arch, seed): scores, v and each policy's decision (Parquet)."""
        return self.root / "examples.parquet"

    @property
    def summary_table(self) -> Path:
        return self.root / "tables" / "summary.csv"

    def table(self, arch: str, name: ReportTable) -> Path:
        return self.root / "tables" / slug(arch) / f"{name}.csv"

    def figure(self, arch: str, name: str) -> Path:
        return self.root / "figures" / slug(arch) / f"{name}.png"

    def relative(self, path: Path) -> str:
        """A path of the report as the report's Markdown links it."""
        return str(path.relative_to(self.root))


@dataclass(frozen=True)
class BundleLayout:
    """Every path of a monitor bundle, a self-contained folder (it may be copied off the run):
    bundle.json (threshold, merge rule, expert entry, the LTT audit record), the two probes
    (safety.*, dv.*), and what `ctd monitor serve` appends by default (decisions.jsonl)."""

    root: Path

    @property
    def record(self) -> Path:
        return self.root / "bundle.json"

    @property
    def safety_probe(self) -> Path:
        return self.root / "safety"

    @property
    def dv_probe(self) -> Path:
        return self.root / "dv"

    @property
    def decisions(self) -> Path:
        return self.root / "decisions.jsonl"
