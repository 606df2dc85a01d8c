"""The "Cascade of experts" section of the run report, for a run with later experts
(`--expert small,large`, cascade/scores.parquet): its stages, the validation of its K-stage
guarantee at the run's budget level per expert (validate/cascade/ARCH.json, written by
`harness.stages._cascade_validate`), and a figure of each expert's call rate realised per trial
against its level; beside them, when the validate stage wrote it (validate/cascade/uncertainty/),
the same validation of the uncertainty cascade. A run of one expert has no cascade table, and no
such section: its report is what it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._errors import InputError
from ..data import read_json, read_table
from ..run import RunLayout
from . import _figures as fig
from ._context import ReportContext, markdown_table, pct

__all__ = ["cascade_experts_section"]

_SELECTORS = {"ltt": ("LTT", "#1f77b4"), "empirical": ("empirical", "#ff7f0e")}
# The policy validated beside CTD when the validate stage ran it (calibrate.CASCADE_RUN_POLICIES).
_OTHER = "uncertainty"


def _read_policy(ctx: ReportContext, arch: str) -> tuple[dict[str, Any], dict[str, NDArray]] | None:
    """The uncertainty cascade's record and per-trial table, when the validate stage wrote them
    (a run validated before it did has none: nothing said)."""
    files = RunLayout(ctx.run_dir).cascade_policy_validation(_OTHER)
    if not files.record(arch).is_file():
        return None
    return _read(ctx, arch, policy=_OTHER)


def _read(
    ctx: ReportContext, arch: str, *, policy: str = "ctd"
) -> tuple[dict[str, Any], dict[str, NDArray]] | None:
    """One probe configuration's record and per-trial table; None (said in the report) when missing."""
    files = RunLayout(ctx.run_dir).cascade_policy_validation(policy)
    try:
        record = read_json(files.record(arch))
        if "error" in record:
            ctx.note(f"{arch}: the cascade was not validated: {record['error']}")
            return None
        trials = {k: np.asarray(v) for k, v in read_table(files.trials(arch)).columns.items()}
    except InputError as exc:
        ctx.note(f"{arch}: {exc} (`ctd eval` writes it in its validate stage)")
        return None
    return record, trials


def _rows(
    record: dict[str, Any], trials: dict[str, NDArray], stages: int, suffix: str = ""
) -> list[list[str]]:
    """Per selector and measurement: the violation rate, the selection rate, each risk's
    violations, and the mean realised rates over the trials that chose a configuration
    (`suffix` after the selector's name: the policy when not CTD)."""
    rows = []
    for selector, (name, _colour) in _SELECTORS.items():
        label = name + suffix
        chosen = trials[f"{selector}_selected"].astype(bool)
        for measurement in ("population", "fresh"):
            if measurement not in record[selector]:
                continue
            r = record[selector][measurement]
            low, high = r["violation_ci95"]
            by_risk = ", ".join(f"{k} {v}" for k, v in r["risk_violations"].items())
            means = [
                float(np.mean(trials[f"{selector}_{measurement}_{c}"][chosen])) if chosen.any() else np.nan
                for c in [*(f"calls_{k}" for k in range(1, stages + 1)), "error"]
            ]
            rows.append(
                [
                    label,
                    measurement,
                    f"{pct(r['violation_rate'])} [{pct(low)}, {pct(high)}]",
                    pct(record[selector]["selection_rate"]),
                    by_risk,
                    *(pct(m) for m in means),
                ]
            )
    return rows


def _draw_calls(
    calls: dict[tuple[str, int], NDArray], levels: list[float], experts: list[str], arch: str, path: Path
) -> None:
    """The figure of `_figure`: `calls[selector, k]` the population share sent to expert k in each
    trial where the selector chose a configuration; `levels[k - 1]` expert k's budget level."""
    figure, axes = fig._figure(len(levels))
    for k, level in enumerate(levels, start=1):
        ax = axes[0, k - 1]
        values = {s: calls[s, k] for s in _SELECTORS}
        top = max([level * 1.5, *(float(v.max()) for v in values.values() if v.size)])
        bins = np.linspace(0.0, top, 31)
        for selector, (label, colour) in _SELECTORS.items():
            if values[selector].size:
                ax.hist(values[selector], bins=bins, color=colour, alpha=0.6, label=label)
        ax.axvline(level, color="black", linestyle="--", linewidth=1, label=f"level {level:g}")
        ax.set_xlabel(f"share of inputs sent to expert {k} ({experts[k - 1]})")
        ax.set_ylabel("trials")
        ax.set_title(f"expert {k}", fontsize="medium")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize="small")
    figure.suptitle(f"{arch}: cascade of experts, realised calls per trial (population)")
    fig._save(figure, path)


def _figure(ctx: ReportContext, arch: str, record: dict[str, Any], trials: dict[str, NDArray]) -> None:
    """One panel per expert: its call rate on the population per trial, for each selector's
    trials that chose a configuration, against the expert's budget level."""
    levels = record["levels"]
    stages = sum(1 for name in levels if name.startswith("budget-"))
    calls = {
        (selector, k): trials[f"{selector}_population_calls_{k}"][trials[f"{selector}_selected"].astype(bool)]
        for selector in _SELECTORS
        for k in range(1, stages + 1)
    }
    path, relative = ctx.figure_path(arch, "cascade-experts")
    ctx.draw(
        _draw_calls,
        calls,
        [levels[f"budget-{k}"] for k in range(1, stages + 1)],
        record["experts"],
        arch,
        path,
    )
    ctx.image(
        relative,
        f"{arch}: each expert's share of the inputs, realised on the population per validation trial "
        f"({record['trials']} trials) by the configuration chosen, LTT (tested) and the empirical "
        "selector (untested); dashed: the expert's budget level. A trial that chose nothing is left out.",
    )


def cascade_experts_section(ctx: ReportContext) -> None:
    """The section, when the run has a cascade table; nothing otherwise."""
    layout = RunLayout(ctx.run_dir)
    if not layout.cascade.scores.is_file():
        return
    ctx.lines += ["## Cascade of experts", ""]
    found = {arch: read for arch in ctx.sweeps if (read := _read(ctx, arch)) is not None}
    if not found:
        return
    first, _ = next(iter(found.values()))
    experts = first["experts"]
    named = ", ".join(f"{name} {level:g}" for name, level in first["levels"].items())
    ctx.lines += [
        "Stages, in order: the probe, then "
        + ", ".join(f"expert {k}: {name}" for k, name in enumerate(experts, start=1))
        + f" (`{layout.cascade.scores.relative_to(ctx.run_dir)}`). An input reaches expert k when every "
        "stage's DV score up to k exceeds its threshold; its score is the last stage's it reached. "
        f"The guarantee, validated at the run's budget level for every expert ({named}; "
        f"delta {first['delta']:g}): with probability at least 1 - delta every expert's share of the "
        "inputs stays within its level at once (`ctd validate --budget B1,B2`; per-trial rates on the "
        "population, as in the guarantee validation above; the empirical selector tests nothing).",
        "",
    ]
    others = {arch: read for arch in found if (read := _read_policy(ctx, arch)) is not None}
    if others:
        ctx.lines += [
            f"Rows marked {_OTHER}: the same levels, trials and joint tests with each stage's threshold "
            "on the uncertainty of the score an input holds on reaching it, -|s - 0.5| (the probe's at "
            "expert 1, expert k-1's at expert k), in place of its DV score (`ctd calibrate --budget B1,B2 "
            "--policies ctd,uncertainty` sweeps both).",
            "",
        ]
    for arch, (record, trials) in found.items():
        stages = len(record["experts"])
        ctx.arch_numbers(arch)["cascade_experts"] = {k: v for k, v in record.items() if k != "arch"}
        header = ["selector", "measured", "violation rate [95% CI]", "selected", "violations by risk"]
        header += [f"calls {k}" for k in range(1, stages + 1)] + ["error"]
        rows = _rows(record, trials, stages)
        if arch in others:
            other, other_trials = others[arch]
            ctx.arch_numbers(arch)[f"cascade_experts_{_OTHER}"] = {
                k: v for k, v in other.items() if k != "arch"
            }
            rows += _rows(other, other_trials, stages, suffix=f", {_OTHER}")
        ctx.lines += [f"### {arch}", ""]
        ctx.lines += markdown_table(header, rows)
        _figure(ctx, arch, record, trials)
