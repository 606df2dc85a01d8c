"""The sections of a run's configuration that stages take: what the probe stage extracts and
trains, and which expert the query stage asks. `RunConfig` reads its defaults from here (the
probe section) and from calibrate's named constants (the sweep and validation sections)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from calibrate import EXPERT_CALIBRATIONS, ExpertCalibrationKind
from probes import ARCHS, BATCH_TOKENS, EMBEDDED_MODEL, Arch, ProbeConfig

from .._errors import InputError
from ..expert import ResolvedExpert, resolve_expert

__all__ = ["ExpertSettings", "ProbeSettings", "Serve"]

Serve = Literal["auto", "never"]  # start a local llama.cpp expert when it is not already answering


@dataclass(frozen=True, kw_only=True)
class ProbeSettings:
    """Everything that decides the probe stage's outputs (besides the data)."""

    model: str = EMBEDDED_MODEL  # "smollm2", a .gguf file, a local folder or a Hugging Face id
    revision: str | None = None
    layer: int | None = None  # None: 11 for Llama-3.2-1B, else two thirds of the depth
    max_tokens: int = 512  # longer conversations keep their first max_tokens tokens
    batch_tokens: int = BATCH_TOKENS  # padded tokens per extraction batch (bounds memory)
    device_map: str | None = None  # "auto" for a model larger than one GPU
    archs: tuple[Arch, ...] = (ProbeConfig.arch,)
    seeds: tuple[int, ...] = (0, 1, 2)
    training: ProbeConfig = field(default_factory=ProbeConfig)  # hyperparameters; its arch is ignored

    def __post_init__(self) -> None:
        unknown = [a for a in self.archs if a not in ARCHS]
        if unknown or not self.archs:
            raise InputError(
                f"--arch: unknown {unknown[0] if unknown else 'empty'}; choose from {', '.join(ARCHS)}"
            )
        if self.max_tokens < 1 or self.batch_tokens < self.max_tokens:
            raise InputError(
                f"--max-tokens {self.max_tokens} / --batch-tokens {self.batch_tokens}: need "
                "1 <= max-tokens <= batch-tokens"
            )
        if not self.seeds:
            raise InputError("--seeds: at least one seed")


@dataclass(frozen=True, kw_only=True)
class ExpertSettings:
    """The expert as the run was asked for it: a registered name, or a base URL with the served
    model's name, and whether the run may start a local server for it. `resolve` makes it the
    run's `ResolvedExpert` (harness.expert), checked once."""

    expert: str = "smollm2"
    expert_model: str | None = None
    serve: Serve = "auto"
    # How the expert's P(high) is recalibrated before anything reads it (calibrate.ExpertCalibration):
    # "contextual" divides out its prior on content-free inputs, "dev" fits a logit shift on dev.
    # dev by default: the embedded expert answers "no" above 0.5 for ~96% of the default run's
    # examples, its prior on content-free inputs is ~0.50 (contextual changes nothing), and the dev
    # shift brings its share called high to ~46-49% (test accuracy 0.512 -> 0.558; AUROC unchanged).
    expert_calibration: ExpertCalibrationKind = "dev"

    def __post_init__(self) -> None:
        if self.expert_calibration not in EXPERT_CALIBRATIONS:
            choices = ", ".join(EXPERT_CALIBRATIONS)
            raise InputError(f"--expert-calibration {self.expert_calibration}: choose from {choices}")

    @property
    def named(self) -> str:
        """The expert as an error line names it: `--expert X` when another expert was chosen, and
        "the default expert smollm2" when it is the default, which the user may never have typed."""
        if self.expert == ExpertSettings.expert:  # the class attribute holds the field's default
            return f"the default expert {self.expert}"
        return f"--expert {self.expert}"

    def resolve(self) -> ResolvedExpert:
        """The spec of the expert asked for (registry errors and a URL that cannot work: one
        InputError line)."""
        return resolve_expert(self.expert, model=self.expert_model, named=self.named)
