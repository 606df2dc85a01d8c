"""The run configuration of `ctd eval`: one frozen value, from a TOML file with flags on top.

Every key of the TOML file is a field of `RunConfig` (under a `[run]` table or at the top level);
an unknown key or a value of the wrong type is one error line naming the file and key.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args

import calibrate
from probes import ARCHS, Arch

from .._bounds import LIMITS, check_count, check_counts, check_levels, check_list_length
from .._errors import MAX_FAILED, InputError, check_cost_limit, check_max_failed
from ..expert import check_expert_url, is_url
from ._sections import ExpertSettings, ProbeSettings, Serve

__all__ = ["DV_TARGET_CHOICES", "MIN_SELECTION", "DVTargetChoice", "RunConfig", "load_run_config"]

DVTargetChoice = calibrate.DVTarget | Literal["both"]  # "both" trains one DV probe of each
DV_TARGET_CHOICES: tuple[str, ...] = (*calibrate.DV_TARGETS, "both")
# A level counts as certifiable for the headline when the tested selector returned a policy in at
# least this share of its trials: enough policies (50 of 500 trials) for the histogram to show a
# distribution, and low enough to sit where certifying is hard, which is where the tested and the
# untested selector differ. A majority rule lands where the probe alone meets the target and
# neither selector can violate (the default run: 0.35, against 0.3 by this rule).
MIN_SELECTION = 0.1
# The sections' defaults, which RunConfig's fields take (each is written once, in its section).
_PROBE = ProbeSettings()
_EXPERT = ExpertSettings()


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything `ctd eval` does, with the defaults of the embedded run.

    Flat, as config.toml and the flags spell it (and as the stage fingerprints read it); the
    sections the stages take are built from it (`probe_settings`, `expert_settings`,
    `sweep_config(merge)`, `validation_config`), and these fields read their defaults from the
    sections and from calibrate's named constants."""

    name: str | None = None  # run folder under the runs root; None: derived from model, expert and data
    # data and monitored model (the probe stage)
    data: tuple[str, ...] = ()  # data spec tokens; empty means the built-in data set
    limit: int | None = None  # at most this many examples per split (stratified); None: all of them
    model: str = _PROBE.model
    revision: str | None = _PROBE.revision
    layer: int | None = _PROBE.layer  # None: 11 for Llama-3.2-1B, else two thirds of the depth
    max_tokens: int = _PROBE.max_tokens
    batch_tokens: int = _PROBE.batch_tokens
    device_map: str | None = _PROBE.device_map
    archs: tuple[Arch, ...] = _PROBE.archs
    seeds: tuple[int, ...] = _PROBE.seeds
    epochs: int = _PROBE.training.epochs
    # the expert (the query stage)
    expert: str = _EXPERT.expert  # a registered name, or a base URL (then expert_model names the model)
    expert_model: str | None = _EXPERT.expert_model
    serve: Serve = _EXPERT.serve  # start a local llama.cpp expert when it is not already answering
    expert_calibration: calibrate.ExpertCalibrationKind = _EXPERT.expert_calibration  # none, contextual, dev
    # Later experts of a cascade (`--expert small,large`): registered names, asked in this order
    # about what the stage before escalated; empty: the paper's one expert.
    cascade: tuple[str, ...] = ()
    # the DV stage
    dv_target: DVTargetChoice = calibrate.DV_TARGETS[0]  # "both" also trains the binary variant
    # calibration and validation
    budgets: tuple[float, ...] = calibrate.DEFAULT_BUDGETS
    batch_sizes: tuple[int, ...] = calibrate.DEFAULT_BATCH_SIZES
    delta: float = calibrate.DEFAULT_DELTA
    objectives: tuple[calibrate.Objective, ...] = calibrate.OBJECTIVES
    merge_controls: bool = True  # also sweep with every policy overwriting, and every policy averaging
    pvalue: calibrate.PValueMethod = calibrate.DEFAULT_PVALUE  # or "hb" (Hoeffding-Bentkus)
    trials: int = calibrate.DEFAULT_TRIALS
    # Validation runs budget control at every budget above and performance control at every
    # error level below; the two alphas here are the levels whose per-trial histograms the
    # report draws (the paper's figures) and whose performance control the summary shows.
    performance_alphas: tuple[float, ...] = tuple(round(0.05 * k, 2) for k in range(1, 11))
    budget_alpha: float = 0.3
    # Error level (minimum accuracy 1 - alpha). None: the smallest level of performance_alphas at
    # which CTD returned a policy in at least MIN_SELECTION of the validation trials, chosen by the
    # validate stage (harness.stages._validate.headline_level); a fixed level the cascade cannot
    # reach certifies nothing and shows nothing.
    performance_alpha: float | None = None
    # The expert stage: stop before calibration when more than this fraction of a split failed.
    max_failed: float = MAX_FAILED
    # US dollars the run may spend at the expert in all, its earlier invocations included; None:
    # no limit. Not in any fingerprint: a rerun with another limit reuses what was done.
    cost_limit: float | None = None

    def __post_init__(self) -> None:
        for name in ("budgets", "performance_alphas"):
            check_levels("--" + name.replace("_", "-"), getattr(self, name))
        check_max_failed(self.max_failed)
        check_cost_limit(self.cost_limit)
        if self.pvalue not in calibrate.PVALUE_METHODS:
            raise InputError(f"--pvalue {self.pvalue}: choose from {', '.join(calibrate.PVALUE_METHODS)}")
        for name in ("delta", "budget_alpha", "performance_alpha"):
            if getattr(self, name) is not None and not 0 < getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')}: {getattr(self, name)} is outside (0, 1)")
        unknown = [a for a in self.archs if a not in ARCHS]
        if unknown or not self.archs:
            raise InputError(
                f"--arch: unknown {unknown[0] if unknown else '(none)'}; choose from {', '.join(ARCHS)}"
            )
        if not self.seeds or min(self.seeds) < 0 or len(set(self.seeds)) != len(self.seeds):
            raise InputError(f"--seeds: expected distinct non-negative integers, got {self.seeds}")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise InputError(f"--batch-sizes: expected positive integers, got {self.batch_sizes}")
        bad_objectives = [o for o in self.objectives if o not in calibrate.OBJECTIVES]
        if bad_objectives or not self.objectives:
            raise InputError(f"--objectives: choose from {', '.join(calibrate.OBJECTIVES)}")
        for name in ("limit", "max_tokens", "batch_tokens", "epochs", "trials", "layer"):
            check_count("--" + name.replace("_", "-"), getattr(self, name))
        check_counts("--seeds", self.seeds, at_least=0)
        check_counts("--batch-sizes", self.batch_sizes)
        for name in ("budgets", "performance_alphas"):
            check_list_length("--" + name.replace("_", "-"), len(getattr(self, name)))
        if self.serve not in get_args(Serve):
            raise InputError(f"--serve {self.serve}: choose from auto, never")
        ExpertSettings(expert_calibration=self.expert_calibration)  # its one check of the choice
        if self.dv_target not in DV_TARGET_CHOICES:
            raise InputError(f"--dv-target {self.dv_target}: choose from {', '.join(DV_TARGET_CHOICES)}")
        if is_url(self.expert):  # written to config.toml, run.json and the report: no secrets in it
            check_expert_url(self.expert, option="--expert", model=self.expert_model)
        stages = (self.expert, *self.cascade)
        if len(stages) > LIMITS["stages"]:
            raise InputError(f"--expert: {len(stages)} experts in the cascade, at most {LIMITS['stages']}")
        for before, later in zip(stages, self.cascade, strict=False):
            if is_url(later):
                raise InputError(
                    f"--expert: {later!r}: a later expert of a cascade must be a registered name"
                )
            if later == before:
                raise InputError(f"--expert: {later!r} follows itself: it would answer as it did")
        if self.name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.name):
            raise InputError(f"--name {self.name!r}: use letters, digits, '.', '_' and '-'")

    @property
    def run_name(self) -> str:
        """The folder name: given, or model-expert-data, so that changing a later option (budgets,
        seeds) reuses the run folder and reruns only the stages that option affects. A --limit
        changes the data, so it is part of the name as the data is."""
        if self.name:
            return self.name
        data = "builtin" if not self.data else "data-" + _digest(list(self.data))[:8]
        if self.limit is not None:
            data += f"-limit{self.limit}"
        return "-".join(_slug(part) for part in (self.model, self.expert, data))

    def to_toml(self) -> str:
        """The resolved configuration, as a TOML file `load_run_config` reads back."""
        lines = ["# ctd eval: the resolved configuration of this run", "[run]"]
        for key, value in asdict(self).items():
            if key == "cascade" and not value:  # one expert: the file as it always was
                continue
            if value is None:
                lines.append(f"# {key} = (default)")
            else:
                lines.append(f"{key} = {_toml(value)}")
        return "\n".join(lines) + "\n"

    def section(self, *names: str) -> dict[str, Any]:
        """The named fields, for a stage fingerprint."""
        return {n: getattr(self, n) for n in names}

    @property
    def probe_settings(self) -> ProbeSettings:
        """The probe stage's section."""
        return ProbeSettings(
            model=self.model,
            revision=self.revision,
            layer=self.layer,
            max_tokens=self.max_tokens,
            batch_tokens=self.batch_tokens,
            device_map=self.device_map,
            archs=self.archs,
            seeds=self.seeds,
            training=replace(_PROBE.training, epochs=self.epochs),
        )

    @property
    def expert_settings(self) -> ExpertSettings:
        """The query stage's section: the expert as asked for."""
        return ExpertSettings(
            expert=self.expert,
            expert_model=self.expert_model,
            serve=self.serve,
            expert_calibration=self.expert_calibration,
        )

    @property
    def validation_config(self) -> calibrate.ValidationConfig:
        """The validate stage's section: how every job tests (each job sets its Pareto filter and
        its split seed; the others at their defaults)."""
        return calibrate.ValidationConfig(delta=self.delta, trials=self.trials, pvalue=self.pvalue)

    def sweep_config(self, merge: calibrate.MergeChoice) -> calibrate.SweepConfig:
        """The calibrate stage's section: one sweep per merge choice (the others at their defaults)."""
        return calibrate.SweepConfig(
            budgets=self.budgets,
            batch_sizes=self.batch_sizes,
            delta=self.delta,
            objectives=self.objectives,
            merge=merge,
            pvalue=self.pvalue,
        )


def _slug(text: str) -> str:
    tail = re.split(r"[/\\]", text.rstrip("/"))[-1] or text
    tail = re.sub(r"^https?:", "", tail)
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", tail).strip("-").removesuffix(".gguf")[:40] or "x"


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(type(value))


_TUPLES = {f.name for f in fields(RunConfig) if str(f.type).startswith("tuple")}


def _coerce(key: str, value: Any, where: str) -> Any:
    """A TOML value as the field's type (lists become tuples); wrong types name the key."""
    kind = next(str(f.type) for f in fields(RunConfig) if f.name == key)
    if key in _TUPLES:
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list):
            raise InputError(f"{where}: '{key}' must be a list")
        item = "float" if "float" in kind else "int" if "int" in kind else "str"
        out = []
        for v in value:
            if item == "float" and isinstance(v, int | float) and not isinstance(v, bool):
                out.append(float(v))
            elif (item == "int" and isinstance(v, int) and not isinstance(v, bool)) or (
                item == "str" and isinstance(v, str)
            ):
                out.append(v)
            else:
                raise InputError(f"{where}: '{key}' must be a list of {item}s, got {v!r}")
        return tuple(out)
    expected = (
        bool
        if kind == "bool"
        else float
        if kind.startswith("float")
        else int
        if kind.startswith("int")
        else str
    )
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise InputError(f"{where}: '{key}' must be {expected.__name__}, got {value!r}")
    return value


# Option names that are not keys of the file: the key of --arch is archs (it lists several), and
# where runs go, retrying failures and the output format belong to one invocation, not a run.
_SEE_KEYS = " (the keys: docs/reference/configuration.md)"
_KEY_HINTS = {
    "arch": ": the key of --arch is 'archs'",
    **{
        flag: f": --{flag.replace('_', '-')} is a flag of ctd eval only"
        for flag in ("runs_dir", "retry_failed", "json")
    },
}


def load_run_config(path: Path | None, overrides: dict[str, Any]) -> RunConfig:
    """The TOML file (if any) with `overrides` (flags given on the command line) on top."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as error:
            raise InputError(f"--config {path}: {error.strerror or error}") from None
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise InputError(f"--config {path}: {error}") from None
        table = document.get("run", document)
        known = {f.name for f in fields(RunConfig)}
        for key, value in table.items():
            if key not in known:
                line = next((i for i, ln in enumerate(text.splitlines(), 1) if ln.strip().startswith(key)), 0)
                raise InputError(f"{path}:{line}: unknown key '{key}'{_KEY_HINTS.get(key, _SEE_KEYS)}")
            values[key] = _coerce(key, value, f"{path}")
    values.update({k: v for k, v in overrides.items() if v is not None})
    return RunConfig(**values)
