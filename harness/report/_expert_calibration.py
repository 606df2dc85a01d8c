"""The report's "Expert calibration" section: the expert's raw scores beside the calibrated ones the
run used (`--expert-calibration`), per split: accuracy at 0.5, AUROC and the share called
high-stakes. Read from query/expert_scores.parquet (both columns) and query/expert_calibration.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import calibrate

from .._errors import InputError
from ..data import read_json, read_table
from ..run import RunLayout
from ._context import ReportContext, markdown_table, pct

__all__ = ["expert_calibration_rows", "expert_calibration_section"]

_CALIBRATED = RunLayout(Path()).query.calibrated_column


def expert_calibration_rows(table: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Per split and score (raw, calibrated): n, accuracy at 0.5, AUROC, share >= 0.5; rows where
    the expert failed (NaN) are left out, as the DV stage leaves them out."""
    rows = []
    split = np.asarray(table["split"]).astype(str)
    label = np.asarray(table["label"]).astype(np.int64)
    for name in ("dev", "test"):
        for score, column in (("raw", "expert"), ("calibrated", _CALIBRATED)):
            values = np.asarray(table[column], dtype=np.float64)
            keep = (split == name) & np.isfinite(values)
            if not keep.any():
                continue
            y, p = label[keep], values[keep]
            rows.append(
                {
                    "split": name,
                    "score": score,
                    "n": int(keep.sum()),
                    "accuracy": float(calibrate.accuracy(p, y)),
                    "auroc": float(calibrate.auroc(p, y)) if 0 < y.sum() < y.size else None,
                    "share_high": float(calibrate.predict(p).mean()),
                }
            )
    return rows


def expert_calibration_section(ctx: ReportContext) -> None:
    """How the run recalibrated the expert, and what that did to its accuracy and its one-class share."""
    query = RunLayout(ctx.run_dir).query
    if not query.expert_calibration.is_file() or not query.expert_scores.is_file():
        ctx.missing.append(str(query.expert_calibration.relative_to(ctx.run_dir)))
        return  # a run from before the option, or a scores table made without a query stage
    try:
        calibration = calibrate.ExpertCalibration.from_json(read_json(query.expert_calibration))
    except (KeyError, TypeError, ValueError) as error:
        raise InputError(
            f"{query.expert_calibration}: not an expert calibration ({error}); rerun the query stage"
        ) from None
    table = read_table(query.expert_scores).columns
    if _CALIBRATED not in table:
        ctx.missing.append(f"{query.expert_scores.name}: {_CALIBRATED}")
        return
    rows = expert_calibration_rows(table)
    ctx.numbers["expert_calibration"] = calibration.to_json() | {"rows": rows}
    ctx.lines += ["## Expert calibration", ""]
    if calibration.kind == "none":
        ctx.lines += ["The expert's scores are used as it answered (`--expert-calibration none`).", ""]
    else:
        how = {
            "contextual": f"its mean P(high) on {calibration.n} content-free inputs, "
            f"{calibration.prior or 0:.3f}, divided out",
            "dev": f"a logit shift fitted by maximum likelihood on {calibration.n} dev examples",
        }[calibration.kind]
        ctx.lines += [
            f"`--expert-calibration {calibration.kind}`: {how} (logit shift {calibration.shift:+.3f}). "
            "Every stage after the query stage read the calibrated score; the raw one stays in "
            f"`query/{query.expert_scores.name}`.",
            "",
        ]
    ctx.lines += markdown_table(
        ["split", "score", "n", "accuracy at 0.5", "AUROC", "score >= 0.5"],
        [
            [
                r["split"],
                r["score"],
                str(r["n"]),
                f"{r['accuracy']:.3f}",
                _num(r["auroc"]),
                pct(r["share_high"]),
            ]
            for r in rows
        ],
    )


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"
