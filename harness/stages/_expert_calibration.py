"""The run's expert calibration (`--expert-calibration`): fitted once by the query stage, written to
query/expert_calibration.json and as the query table's `expert_calibrated` column beside the raw
`expert`, and read back by everything after it through `cascade_expert_scores` (the DV stage, and
so the scores table, the sweeps, the report and `ctd monitor calibrate`; a bundle carries the same
`calibrate.ExpertCalibration` for live answers).

The content-free inputs are ordinary items through the run's client, template and cache: their
answers are stored raw under the same keys as any other answer, whatever the template's kind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

import calibrate
import experts
from calibrate import ExpertCalibration, ExpertCalibrationKind
from experts import ExpertSpec, Item, ScoreCache

from .._errors import InputError
from ..data import read_json, read_table, write_json, write_table
from ..run import QueryLayout

__all__ = [
    "cascade_expert_scores",
    "content_free_items",
    "fit_expert_calibration",
    "read_expert_calibration",
    "score_content_free",
    "write_expert_calibration",
]

CALIBRATED_COLUMN = QueryLayout.calibrated_column  # the calibrated score, beside the raw `expert`


def content_free_items() -> list[Item]:
    """The content-free inputs of contextual calibration, as items of the normal path."""
    return [Item(f"content-free-{i}", text) for i, text in enumerate(calibrate.CONTENT_FREE_INPUTS)]


def score_content_free(spec: ExpertSpec, cache_path: Path, spend: experts.Spend | None = None) -> np.ndarray:
    """The expert's raw P(high) on each content-free input (NaN where it failed), through the cache:
    asked once per expert and template, then read back; paid from `spend` (the query stage's)."""
    from ._query import score_stoppable  # the query stage's one signal-aware scoring call

    cache = ScoreCache.for_run(cache_path)
    try:
        results, _stats = asyncio.run(
            score_stoppable(experts.ExpertClient(spec, cache=cache, spend=spend), content_free_items())
        )
    except experts.Stopped:
        raise KeyboardInterrupt from None
    finally:
        cache.close()
    return np.array([np.nan if r.score is None else r.score for r in results], dtype=np.float64)


def fit_expert_calibration(
    kind: ExpertCalibrationKind,
    table: dict[str, np.ndarray],
    content_free: np.ndarray | None = None,
) -> ExpertCalibration:
    """The calibration `kind` from the query table's columns (split, label, expert): "dev" reads
    the dev rows' labels only; "contextual" reads only `content_free` (the raw scores of
    `content_free_items`). A fit that cannot be made is one InputError line."""
    if kind == "none":
        return ExpertCalibration()
    try:
        if kind == "contextual":
            if content_free is None:
                raise ValueError("contextual calibration: the content-free inputs were not scored")
            return calibrate.contextual_calibration(content_free)
        dev = np.asarray(table["split"]).astype(str) == "dev"
        return calibrate.fit_logit_shift(
            np.asarray(table["expert"], dtype=np.float64)[dev], np.asarray(table["label"])[dev]
        )
    except ValueError as error:
        others = " or ".join(k for k in calibrate.EXPERT_CALIBRATIONS if k != kind)
        raise InputError(f"--expert-calibration {kind}: {error}; choose {others}") from None


def write_expert_calibration(layout: QueryLayout, calibration: ExpertCalibration) -> None:
    """query/expert_calibration.json, and the query table's `expert_calibrated` column (the raw
    `expert` column stays as the expert answered)."""
    table = read_table(layout.expert_scores).columns
    table[CALIBRATED_COLUMN] = calibration.apply(np.asarray(table["expert"], dtype=np.float64))
    write_table(layout.expert_scores, table)
    write_json(layout.expert_calibration, calibration.to_json())


def read_expert_calibration(layout: QueryLayout) -> ExpertCalibration:
    """The run's calibration; a run from before calibration had none (the identity)."""
    path = layout.expert_calibration
    if not path.is_file():
        return ExpertCalibration()
    try:
        return ExpertCalibration.from_json(read_json(path))
    except (KeyError, TypeError, ValueError) as error:
        raise InputError(f"{path}: not an expert calibration ({error}); rerun the query stage") from None


def cascade_expert_scores(layout: QueryLayout) -> dict[tuple[str, str], float]:
    """(split, id) -> the expert's calibrated P(high) (NaN where it failed): what every stage after
    the query stage reads. A table from before calibration has only the raw column, its own."""
    table = read_table(layout.expert_scores).columns
    column = CALIBRATED_COLUMN if CALIBRATED_COLUMN in table else "expert"
    keys = zip(table["split"], table["id"], strict=True)
    return {(str(s), str(i)): float(e) for (s, i), e in zip(keys, table[column], strict=True)}
