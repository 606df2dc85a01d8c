"""The guarantee-validation section of the run report: the records written by
`validate_scores` (violation and selection rates) and histograms over their per-trial tables."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import _figures as fig
from ._errors import InputError
from ._report_context import ReportContext, fmt, markdown_table, pct, slug
from ._report_data import VALIDATIONS, Validation, read_validation

__all__ = ["validation_section"]

VALIDATION_LABELS = {
    "budget-pareto": "Pareto LTT",
    "budget-ltt": "budget-only LTT",
    "performance": "CTD (LTT)",
}


def _validation_row(label: str, record: dict[str, Any], alpha: float, delta: float) -> dict[str, Any]:
    low, high = record.get("violation_ci95") or (None, None)
    return {
        "procedure": label,
        "alpha": float(alpha),
        "delta": float(delta),
        "trials": int(record.get("trials", -1)),
        "violation_rate": float(record["violation_rate"]),
        "violation_ci_low": _number(low),
        "violation_ci_high": _number(high),
        "selection_rate": _number(record.get("selection_rate")),
        "mean_realised_budget": _number(record.get("mean_realised_budget")),
        "mean_accuracy": _number(record.get("mean_accuracy")),
    }


def _number(value: object) -> float:
    return float("nan") if value is None else float(value)  # JSON writes NaN as null


def _with_ci(row: dict[str, Any]) -> str:
    return f"{pct(row['violation_rate'])} [{pct(row['violation_ci_low'])}, {pct(row['violation_ci_high'])}]"


def _read_validations(ctx: ReportContext, arch: str) -> dict[str, Validation]:
    folder = ctx.run_dir / "validate" / arch
    if not folder.is_dir():
        ctx.note(f"{arch}: no validate/{arch}/ folder; run `ctd validate` to fill this section.")
        return {}
    found = {}
    for name in VALIDATIONS:
        try:
            found[name] = read_validation(folder, name)
        except InputError as exc:
            ctx.note(f"{arch}: {exc}")
    return found


def _validation_rows(v: Validation) -> list[dict[str, Any]]:
    r = v.record
    delta = _number(r.get("delta"))
    rows = [_validation_row(VALIDATION_LABELS[v.name], r, r["alpha"], delta)]
    if isinstance(r.get("empirical"), dict):
        rows.append(_validation_row("empirical selector", r["empirical"], r["alpha"], delta))
    return rows


def validation_section(ctx: ReportContext) -> None:
    ctx.lines += ["## Guarantee validation", ""]
    for arch in ctx.sweeps:
        ctx.progress(f"{arch}: guarantee validation")
        found = _read_validations(ctx, arch)
        numbers = ctx.arch_numbers(arch).setdefault("validation", {})
        rows = []
        for name, v in list(found.items()):
            try:
                named = _validation_rows(v)
            except (KeyError, TypeError, ValueError):
                ctx.note(f"{arch}: {v.path}: not a validate_scores record; skipped.")
                del found[name]
                continue
            rows += named
            numbers[name] = named[0] | ({"empirical": named[1]} if len(named) > 1 else {})
        if rows:
            relative = ctx.table(f"tables/{slug(arch)}/validation.csv", rows)
            header = [
                "procedure",
                "alpha",
                "trials",
                "violation (95% CI)",
                "selection",
                "mean realised",
                "mean acc.",
            ]
            body = [
                [
                    r["procedure"],
                    fmt(r["alpha"], 2),
                    str(r["trials"]),
                    _with_ci(r),
                    pct(r["selection_rate"]),
                    fmt(r["mean_realised_budget"]),
                    fmt(r["mean_accuracy"]),
                ]
                for r in rows
            ]
            ctx.lines += [f"**{arch}** (`{relative}`)", "", *markdown_table(header, body)]
        _budget_histograms(ctx, arch, found)
        _performance_histograms(ctx, arch, found)


def _selected(v: Validation, column: str, prefix: str = "") -> NDArray[np.float64]:
    """Per-trial `column` over the trials whose selector returned a policy."""
    trials = v.per_trial or {}
    if f"{prefix}{column}" not in trials or f"{prefix}selected" not in trials:
        return np.array([])
    return trials[f"{prefix}{column}"][trials[f"{prefix}selected"].astype(bool)]


def _budget_histograms(ctx: ReportContext, arch: str, found: dict[str, Validation]) -> None:
    budget = {n: v for n, v in found.items() if n.startswith("budget")}
    with_trials = {n: v for n, v in budget.items() if v.per_trial is not None}
    for name in budget.keys() - with_trials.keys():
        ctx.note(f"{arch}: no per-trial table validate/{arch}/{name}.csv; its histogram is omitted.")
    if not with_trials:
        return
    alpha = float(next(iter(with_trials.values())).record["alpha"])
    panels = {
        VALIDATION_LABELS[n]: (_selected(v, "realised"), float(v.record["violation_rate"]))
        for n, v in with_trials.items()
    }
    path, relative = ctx.figure_path(arch, "validation-budget")
    fig.budget_validation_figure(panels, alpha=alpha, title=f"{arch}: budget control", path=path)
    ctx.image(
        relative,
        f"{arch}: realised delegation rate over random calibration/evaluation splits under budget "
        f"control (alpha = {alpha:g}); red line at alpha, violation rate in each title.",
    )


def _performance_histograms(ctx: ReportContext, arch: str, found: dict[str, Validation]) -> None:
    v = found.get("performance")
    if v is None:
        return
    if v.per_trial is None:
        ctx.note(f"{arch}: no per-trial table validate/{arch}/performance.csv; its histogram is omitted.")
        return
    r, alpha = v.record, float(v.record["alpha"])
    panels = {"CTD (LTT)": (_selected(v, "accuracy"), r["violation_rate"], r.get("selection_rate", np.nan))}
    if isinstance(r.get("empirical"), dict):
        e = r["empirical"]
        panels["empirical"] = (
            _selected(v, "accuracy", "empirical_"),
            e["violation_rate"],
            e.get("selection_rate", np.nan),
        )
    path, relative = ctx.figure_path(arch, "validation-performance")
    fig.performance_validation_figure(panels, alpha=alpha, title=f"{arch}: performance control", path=path)
    ctx.image(
        relative,
        f"{arch}: held-out accuracy of the returned policies under performance control (alpha = "
        f"{alpha:g}), CTD's LTT selector vs the empirical selector; dashed line at 1 - alpha.",
    )
