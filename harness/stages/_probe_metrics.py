"""The probe stage's metrics (probe/probe_metrics.json) as a typed, frozen record: what was
extracted from each split, each safety probe's training and scores, and their means per arch.

`ProbeMetrics.to_json()` is the file's object, key for key as the stage has always written it, so
an unchanged run writes the same bytes. The file carries no version field; its version is
`ProbeMetrics.VERSION`, and a file that names a version is read only when it names this one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .._errors import InputError
from ..data import read_json

if TYPE_CHECKING:
    from probes import ExtractStats

__all__ = [
    "ProbeMeans",
    "ProbeMetrics",
    "ProbeRun",
    "SplitExtraction",
    "check_metrics_record",
    "read_probe_metrics",
]


@dataclass(frozen=True)
class SplitExtraction:
    """The activations of one split: `probes.ExtractStats` and its padding fraction."""

    examples: int
    tokens: int  # real tokens stored
    truncated: int  # examples cut to max_tokens
    batches: int
    padded_tokens: int  # tokens processed including padding
    extracted_batches: int  # batches run by this call (0 when the store was complete)
    seconds: float
    store: str  # the activation store's folder
    padding_fraction: float

    @classmethod
    def from_stats(cls, stats: ExtractStats) -> SplitExtraction:
        return cls(**asdict(stats), padding_fraction=stats.padding_fraction)


@dataclass(frozen=True)
class ProbeRun:
    """One safety probe (arch, seed): its training and its scores on dev and test. An AUROC is
    None on a split with one class."""

    arch: str
    seed: int
    best_epoch: int
    epochs_run: int
    n_train: int
    n_val: int
    best_val_loss: float
    dev_auroc: float | None
    dev_accuracy: float
    test_auroc: float | None
    test_accuracy: float


@dataclass(frozen=True)
class ProbeMeans:
    """One arch's means over seeds; None where no seed had the number."""

    dev_auroc: float | None
    dev_accuracy: float | None
    test_auroc: float | None
    test_accuracy: float | None

    @classmethod
    def of(cls, runs: Sequence[ProbeRun]) -> ProbeMeans:
        def mean(name: str) -> float | None:
            values = [getattr(r, name) for r in runs if getattr(r, name) is not None]
            return float(np.mean(values)) if values else None

        return cls(*(mean(f.name) for f in fields(cls)))


@dataclass(frozen=True)
class ProbeMetrics:
    """probe/probe_metrics.json."""

    VERSION: ClassVar[int] = 1

    model: str  # as named (--model)
    model_identity: str  # the weights' identity (file hash, hub commit)
    layer: int
    n_layers: int
    hidden_size: int
    dtype: str
    extraction: Mapping[str, SplitExtraction]  # by split, in order
    runs: tuple[ProbeRun, ...]
    mean: Mapping[str, ProbeMeans]  # by arch, in the order of the runs

    @staticmethod
    def means(runs: Sequence[ProbeRun]) -> dict[str, ProbeMeans]:
        """Per arch: the mean over seeds of each metric."""
        archs = dict.fromkeys(r.arch for r in runs)
        return {arch: ProbeMeans.of([r for r in runs if r.arch == arch]) for arch in archs}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # ClassVar VERSION is no field: not written

    @classmethod
    def from_json(cls, record: Mapping[str, Any], source: Path) -> ProbeMetrics:
        """The record of a probe_metrics.json; a missing key, a wrong version or a bad entry is
        one InputError line naming `source`."""
        check_metrics_record(record, cls, source, "probe metrics")
        try:
            return cls(
                **{f.name: record[f.name] for f in fields(cls)[:6]},
                extraction={k: SplitExtraction(**v) for k, v in record["extraction"].items()},
                runs=tuple(ProbeRun(**r) for r in record["runs"]),
                mean={k: ProbeMeans(**v) for k, v in record["mean"].items()},
            )
        except (TypeError, AttributeError) as error:  # a key too many or too few, not an object
            raise InputError(f"{source}: not probe metrics ({error})") from None


def check_metrics_record(record: Mapping[str, Any], kind: Any, source: Path, what: str) -> None:
    """A metrics file's record names no version other than `kind.VERSION` (none: the version
    this code writes, which leaves it out) and has every field of the dataclass `kind`; one
    InputError line naming `source` otherwise."""
    version = record.get("version", kind.VERSION)
    if version != kind.VERSION:
        raise InputError(f"{source}: {what} version {version!r}, expected {kind.VERSION}")
    missing = [f.name for f in fields(kind) if f.name not in record]
    if missing:
        raise InputError(f"{source}: missing key {missing[0]!r}")


def read_probe_metrics(path: Path) -> ProbeMetrics:
    """A probe stage's probe_metrics.json."""
    return ProbeMetrics.from_json(read_json(path), Path(path))
