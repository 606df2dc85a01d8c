"""The DV stage's metrics (dv/dv_metrics.json) as a typed, frozen record: per DV target, each DV
probe's training and its quality on test (MSE and Spearman of d against v), and their means per arch.

`DVMetrics.to_json()` is one target's object, key for key as the stage has always written it, so an
unchanged run writes the same bytes. A `ctd eval` run's dv/dv_metrics.json holds one such object
per target (`dv_metrics_json`); the file `ctd dv` writes beside its scores table holds one object.
A number that is undefined (Spearman on fewer than two test examples) is NaN in the record and null
in the file, as `harness.data.write_json` has always written it.

The file carries no version field; its version is `DVMetrics.VERSION`, and a record that names a
version is read only when it names this one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from calibrate import DV_TARGETS, DVTarget

from .._errors import InputError
from ..data import read_json
from ._probe_metrics import check_metrics_record

__all__ = ["DVMeans", "DVMetrics", "DVRun", "dv_metrics_json", "read_dv_metrics"]


@dataclass(frozen=True)
class DVRun:
    """One DV probe (arch, seed): its training on dev and its quality on test."""

    arch: str
    seed: int
    target: DVTarget
    best_epoch: int
    n_train: int
    n_val: int
    test_mse: float
    test_spearman: float  # NaN with fewer than two test examples
    dev_mean_v: float
    test_mean_v: float


@dataclass(frozen=True)
class DVMeans:
    """One arch's means over seeds; NaN when a seed's number is NaN."""

    test_mse: float
    test_spearman: float

    @classmethod
    def of(cls, runs: Sequence[DVRun]) -> DVMeans:
        return cls(*(float(np.mean([getattr(r, f.name) for r in runs])) for f in fields(cls)))


@dataclass(frozen=True)
class DVMetrics:
    """One DV target's part of dv/dv_metrics.json."""

    VERSION: ClassVar[int] = 1

    target: DVTarget
    missing_expert: int  # dev/test examples left out because the expert failed on them
    runs: tuple[DVRun, ...]
    mean: Mapping[str, DVMeans]  # by arch, in the order of the runs

    @staticmethod
    def means(runs: Sequence[DVRun]) -> dict[str, DVMeans]:
        """Per arch: the mean over seeds of the test MSE and Spearman."""
        archs = dict.fromkeys(r.arch for r in runs)
        return {arch: DVMeans.of([r for r in runs if r.arch == arch]) for arch in archs}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # ClassVar VERSION is no field: not written

    @classmethod
    def from_json(cls, record: object, source: Path) -> DVMetrics:
        """The record of one target; a missing key, a wrong version or a bad entry is one
        InputError line naming `source`."""
        if not isinstance(record, Mapping):
            raise InputError(f"{source}: not DV metrics (an object per target expected)")
        check_metrics_record(record, cls, source, "DV metrics")
        if record["target"] not in DV_TARGETS:
            raise InputError(f"{source}: DV target {record['target']!r}: choose from {', '.join(DV_TARGETS)}")
        try:
            return cls(
                target=record["target"],
                missing_expert=record["missing_expert"],
                runs=tuple(DVRun(**_nan_for_null(r)) for r in record["runs"]),
                mean={k: DVMeans(**_nan_for_null(v)) for k, v in record["mean"].items()},
            )
        except (TypeError, AttributeError) as error:  # a key too many or too few, not an object
            raise InputError(f"{source}: not DV metrics ({error})") from None


def _nan_for_null(entry: Mapping[str, Any]) -> dict[str, Any]:
    """write_json writes NaN as null; the record holds NaN again."""
    return {key: math.nan if value is None else value for key, value in entry.items()}


def dv_metrics_json(by_target: Mapping[DVTarget, DVMetrics]) -> dict[str, Any]:
    """A `ctd eval` run's dv/dv_metrics.json: one object per DV target, in the order trained."""
    return {target: metrics.to_json() for target, metrics in by_target.items()}


def read_dv_metrics(path: Path) -> dict[DVTarget, DVMetrics]:
    """A dv_metrics.json by target: a `ctd eval` run's (an object per target) or the one `ctd dv`
    writes (one target's object, recognised by its `target` key)."""
    source = Path(path)
    record = read_json(source)
    if not record:
        raise InputError(f"{source}: no DV metrics (an object per DV target expected)")
    if "target" in record:
        metrics = DVMetrics.from_json(record, source)
        return {metrics.target: metrics}
    by_target: dict[DVTarget, DVMetrics] = {}
    for key, value in record.items():
        metrics = DVMetrics.from_json(value, source)
        if key != metrics.target:
            raise InputError(f"{source}: the metrics under {key!r} are of DV target {metrics.target!r}")
        by_target[metrics.target] = metrics
    return by_target
