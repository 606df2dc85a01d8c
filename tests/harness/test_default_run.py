"""The embedded default (`ctd eval` with no options: built-in data, SmolLM2-135M as monitored model
and as its own weak expert) shows what CTD does, in the run's own report tables: a probe that is
good but not perfect, an expert worse than it on average that still gains where the DV probe
sends it, CTD above the probe alone and above Unc. top-k at a budget between 0.1 and 0.3 (B = 128),
in every seed at some budget of the summary, and CTD's delegation plateauing below the target at
high budgets. Its summary shows the uncertainty baselines and performance control at a level CTD
certifies, where its tested selector violates less often than the empirical one.

`default_run_shows_ctd` is the check; the test runs the real pipeline and applies it. Applied to a
run of the previous default (all four groups in train, the stakes-v1 prompt for the embedded
expert), it fails: CTD equalled the probe at every budget.

The run takes about 8 minutes on two shared cores (8 min 22 s for the same `ctd eval` on
2026-11-26, the expert stage 5 of them; up to 11 under more load): the slowest single test, so it
is marked `default_run` and left out of `python -m pytest`. Run it with
`python -m pytest -m default_run` after a change to the defaults, the embedded model or the
expert's prompt."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from ctd_cli import run_ctd
from eval_data import eval_env

from harness.data import read_table

# Private: the budgets the summary shows.
from harness.report._summary import SUMMARY_BUDGETS
from harness.run import MIN_SELECTION, RunConfig, RunLayout, slug

GAIN_BUDGETS = (0.1, 0.15, 0.2, 0.25, 0.3)
MIN_GAIN = 0.01
PROBE_AUROC_RANGE = (0.75, 0.92)
PLATEAU_BELOW = 0.8
BATCH = str(max(RunConfig().batch_sizes))  # the paper's B = 128, the largest default


def _curve(rows: list[dict[str, str]], metric: str, policy: str, budget: float) -> float:
    """One point of report/tables/ARCH/curves.csv: default merge rule, AUROC objective, B = BATCH."""
    (value,) = [
        float(r["mean"])
        for r in rows
        if r["merge"] == "default"
        and r["metric"] == metric
        and r["objective"] == "auroc"
        and r["batch_size"] == BATCH
        and r["policy"] == policy
        and abs(float(r["budget"]) - budget) < 1e-9
    ]
    return value


def _summary(rows: list[dict[str, str]], part: str, metric: str) -> dict[str, dict[str, str]]:
    """One metric's cells of report/tables/summary.csv, by column (budget or selector)."""
    return {r["column"]: r for r in rows if r["part"] == part and r["metric"] == metric}


def default_run_shows_ctd(run: Path, arch: str = "attention") -> list[str]:
    """What the run's report tables fail to show of CTD's weak-expert behaviour (empty: all of
    it)."""
    layout = RunLayout(run)
    with layout.report.summary_table.open(newline="") as file:
        summary = [r for r in csv.DictReader(file) if r["arch"] == arch]
    curves_table = layout.report.summary_table.parent / slug(arch) / "curves.csv"  # as the report names it
    with curves_table.open(newline="") as file:
        curves = list(csv.DictReader(file))
    probe = float(next(iter(_summary(summary, "budget", "probe alone AUROC").values()))["value"])
    expert = float(next(iter(_summary(summary, "budget", "expert alone AUROC").values()))["value"])
    failures = []
    for metric in ("CTD AUROC", "Unc. top-k AUROC", "Unc. calibrated AUROC", "CTD - Unc. top-k AUROC"):
        cells = _summary(summary, "budget", metric)
        if sorted(cells) != ["0.1", "0.2", "0.3"] or not all(
            float(c["value"]) == float(c["value"]) for c in cells.values()
        ):
            failures.append(f"summary row {metric!r}: not a number at each of 0.1/0.2/0.3 ({cells})")
    gains = _summary(summary, "budget", "CTD - probe AUROC")
    if not any(float(c["low"]) > 0 for c in gains.values()):
        failures.append(f"CTD - probe AUROC is not positive in every seed at any summary budget ({gains})")
    performance = {r["column"]: r for r in summary if r["part"] == "performance"}
    violations = _summary(summary, "performance", "violations")
    selected = _summary(summary, "performance", "returned a policy")
    title = next(iter(performance.values()), {}).get("title", "")
    if "smallest certifiable level" not in title:
        failures.append(f"performance control not at the smallest certifiable level: {title!r}")
    elif not float(selected["CTD (LTT)"]["value"]) >= MIN_SELECTION:
        failures.append(f"CTD returned a policy in only {selected['CTD (LTT)']['value']} of the trials")
    elif not float(violations["CTD (LTT)"]["value"]) < float(violations["empirical selector"]["value"]):
        failures.append(f"CTD violates no less often than the empirical selector ({violations})")
    if not PROBE_AUROC_RANGE[0] <= probe <= PROBE_AUROC_RANGE[1]:
        failures.append(f"probe AUROC {probe:.3f} outside {PROBE_AUROC_RANGE}")
    if not expert < probe:
        failures.append(f"expert AUROC {expert:.3f} not below the probe's {probe:.3f} (not a weak expert)")

    gains = {
        b: (_curve(curves, "auroc", "ctd", b), _curve(curves, "auroc", "unc-topk", b)) for b in GAIN_BUDGETS
    }
    shown = [b for b, (ctd, unc) in gains.items() if ctd >= probe + MIN_GAIN and ctd >= unc]
    if not shown:
        seen = ", ".join(f"{b}: CTD {c:.3f} Unc. top-k {u:.3f}" for b, (c, u) in gains.items())
        failures.append(
            f"no budget in {GAIN_BUDGETS} with CTD >= probe {probe:.3f} + {MIN_GAIN} "
            f"and >= Unc. top-k ({seen})"
        )

    top = max(float(r["budget"]) for r in curves if r["metric"] == "realised")
    realised = _curve(curves, "realised", "ctd", top)
    if not realised < PLATEAU_BELOW:
        failures.append(
            f"CTD's realised delegation {realised:.3f} at target {top} is not below {PLATEAU_BELOW}"
        )

    examples = read_table(layout.report.examples).columns
    mine = (examples["arch"].astype(str) == arch) & (examples["split"].astype(str) == "test")
    v = examples["v"][mine].astype(float)
    for b in SUMMARY_BUDGETS:  # the budgets report/examples.parquet holds decisions for
        decided = np.array([d is not None for d in examples[f"ctd@{b}"][mine]])
        delegated = np.array([bool(d) for d in examples[f"ctd@{b}"][mine]]) & decided
        if delegated.any() and not v[delegated].mean() > v[decided].mean():
            failures.append(
                f"at budget {b}: mean v {v[delegated].mean():.3f} among CTD's delegated examples is not "
                f"above the mean v {v[decided].mean():.3f} of all"
            )
    top_example = max(SUMMARY_BUDGETS)
    if not any(bool(d) for d in examples[f"ctd@{top_example}"][mine] if d is not None):
        failures.append(f"CTD delegates nothing at budget {top_example}")
    return failures


@pytest.mark.default_run
def test_the_default_run_shows_ctd_gain_over_the_probe_with_a_weak_expert(tmp_path: Path) -> None:
    result = run_ctd("eval", cwd=tmp_path, env=eval_env(tmp_path), timeout=900)
    assert result.returncode == 0, result.stderr
    assert default_run_shows_ctd(tmp_path / "runs" / RunConfig().run_name) == []
