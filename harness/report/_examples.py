"""Examples one by one: the per-example table (report/examples.parquet) and the paper's qualitative
case studies, both read from files the stages wrote: the scores table, the expert's table
(query/expert_scores.parquet: the input's start and the label-token mass) and each sweep's masks
(calibrate/ARCH/decisions.parquet). Nothing is recomputed but v = (2y - 1)(expert - probe).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

import calibrate

from ..data import read_table, write_table
from ..run import RunLayout
from ._context import ReportContext, fmt, markdown_table
from ._data import Decisions, Sweep, read_decisions
from ._figures import POLICY_LABELS
from ._summary import SUMMARY_BUDGETS  # the examples are shown at the summary's budgets

__all__ = ["CASE_BUDGET", "case_study_section", "examples_table"]

CASE_BUDGET = 0.2  # the paper's case studies are at budget 0.2, B = 128
CASES_SHOWN = 3  # examples per case kind and arch
TEXT_SHOWN = 300  # characters of an input shown in a case study
TOP_SHOWN = 5  # the expert's most likely next tokens shown in a case study
_UNC, _DV = "unc-topk", "ctd"
_LONG = ("text", "top_tokens")  # in examples.parquet, not in the case-study CSV
_NO_TEXT = f"(the input is not in this run's {RunLayout(Path()).query.expert_scores})"


@dataclass(frozen=True)
class ExpertExtra:
    """What the query stage kept of one example beside its score."""

    text: str = ""  # the input's start
    label_mass: float = float("nan")  # the probability mass on the label tokens
    top_tokens: str = ""  # JSON: [[token, logprob], ...], most likely first


def _expert_extras(run_dir: Path) -> dict[tuple[str, str], ExpertExtra]:
    """(split, id) -> what the expert's table holds besides the score; empty when the run has
    none (a scores table made elsewhere), blank fields for columns an older query stage lacked."""
    path = RunLayout(run_dir).query.expert_scores
    if not path.is_file():
        return {}
    c = read_table(path).columns
    n = len(c["id"])
    texts = c["text"].astype(str) if "text" in c else np.full(n, "")
    masses = c["label_mass"].astype(np.float64) if "label_mass" in c else np.full(n, np.nan)
    tops = c["top_tokens"].astype(str) if "top_tokens" in c else np.full(n, "")
    splits = c["split"].astype(str) if "split" in c else np.full(n, "")
    return {
        (str(s), str(i)): ExpertExtra(str(t), float(m), str(top))
        for s, i, t, m, top in zip(splits, c["id"].astype(str), texts, masses, tops, strict=True)
    }


def _decision_column(name: str, budget: float) -> str:
    return f"{name}@{budget:g}"


def examples_table(ctx: ReportContext) -> None:
    """report/examples.parquet: one row per (arch, seed, example) of the scores table, with v,
    the input's start and the expert's label mass (when the query stage kept them) and, on the
    seed's evaluation half, each policy's decision at SUMMARY_BUDGETS (calibrated policies
    selected for AUROC, top-k at the largest batch size) and the top-k ranks in their batches;
    empty (null) off the evaluation half and where the budget is not on the sweep's grid."""
    table = ctx.scores_table
    extras = _expert_extras(ctx.run_dir)
    n = table.id.size
    out: dict[str, Any] = {
        "id": table.id,
        "arch": table.arch,
        "seed": table.seed,
        "group": table.group,
        "split": table.split,
        "label": table.label,
        "probe": table.probe,
        "dv": table.dv,
        "expert": table.expert,
        "v": calibrate.delegation_value(table.label, table.probe, table.expert),
    }
    found = [extras.get((s, i), ExpertExtra()) for s, i in zip(table.split, table.id, strict=True)]
    out["expert_label_mass"] = np.array([e.label_mass for e in found], dtype=np.float64)
    out["expert_top_tokens"] = np.array([e.top_tokens for e in found], dtype=str)
    out["text"] = np.array([e.text for e in found], dtype=str)
    extra_columns: dict[str, NDArray] = {}
    for arch, sweep in ctx.sweeps.items():
        points = [p for p in (sweep.grid_point(b) for b in SUMMARY_BUDGETS) if p is not None]
        decisions = read_decisions(sweep, points)
        if decisions is None:
            ctx.note(
                f"{arch}: no {sweep.files.decisions.relative_to(ctx.run_dir)}; "
                f"no decisions in {ctx.files.examples.name}."
            )
            continue
        batch, objective = max(sweep.batch_sizes), sweep.objective_for("auroc")
        for seed in table.seeds:
            index = np.flatnonzero((table.seed == seed) & (table.split == "test") & (table.arch == arch))
            for policy in sweep.policies:
                for budget in SUMMARY_BUDGETS:
                    point = sweep.grid_point(budget)
                    if point is None:
                        continue
                    at = decisions.at(policy=policy, budget=point, objective=objective, batch_size=batch)
                    at &= decisions.columns["seed"] == seed
                    rows = index[decisions.columns["row"][at]]
                    name = _decision_column(policy, budget)
                    column = extra_columns.setdefault(name, np.full(n, None, object))
                    column[rows] = decisions.columns["delegated"][at].astype(bool)
                    if not calibrate.POLICIES[policy].calibrated:
                        ranks = extra_columns.setdefault(f"{policy}_rank@B{batch}", np.full(n, None, object))
                        ranks[rows] = decisions.columns["batch_rank"][at] + 1
    relative = ctx.files.relative(ctx.files.examples)
    write_table(ctx.files.examples, out | extra_columns)
    ctx.lines += [
        "## Every example",
        "",
        f"`{relative}` has one row per example, probe configuration and seed: id, group, split, label, the "
        "probe's, DV probe's and expert's scores, v, the expert's probability mass on the label tokens and "
        "its next-token alternatives with their logprobs (`expert_top_tokens`, JSON; empty for likelihood "
        "scoring), the start of the input, and, on each seed's evaluation half, every policy's decision at "
        f"budgets {', '.join(f'{b:g}' for b in SUMMARY_BUDGETS)} (columns `POLICY@BUDGET`; calibrated "
        "policies selected for AUROC, top-k at the largest batch size, with 1-based ranks in their batches).",
        "",
    ]


# ---------------------------------------------------------------- case studies


@dataclass(frozen=True)
class Case:
    """One example of a failure of uncertainty routing, with what the report shows of it."""

    id: str
    group: str
    seed: int
    label: int
    probe: float
    expert: float
    dv: float
    v: float
    rank: int  # 1-based, in its Unc. top-k batch
    batch: int  # that batch's size
    threshold: float  # CTD's threshold on the DV score
    text: str
    top_tokens: str  # JSON, as the query stage kept it


def _tick(right: bool) -> str:
    return "✓" if right else "✗"


def _stakes(score: float) -> str:
    return "high-stakes" if score >= 0.5 else "low-stakes"


def _case_lines(case: Case, *, unc_delegates: bool) -> list[str]:
    probe_right = (case.probe >= 0.5) == bool(case.label)
    expert_right = (case.expert >= 0.5) == bool(case.label)
    # Delegating is right when the expert helps (v > 0), retaining when it would not.
    unc_right = unc_delegates == (case.v > 0)
    text = case.text if len(case.text) <= TEXT_SHOWN else case.text[: TEXT_SHOWN - 1] + "…"
    rows = [
        ["Safety probe", fmt(case.probe), f"{_stakes(case.probe)} {_tick(probe_right)}"],
        ["Expert", fmt(case.expert), f"{_stakes(case.expert)} {_tick(expert_right)}"],
        [
            POLICY_LABELS[_UNC],
            f"rank {case.rank}/{case.batch}",
            f"{'delegates' if unc_delegates else 'retains'} {_tick(unc_right)}",
        ],
        [
            "DV probe (CTD)",
            f"{case.dv:+.2f} (threshold {case.threshold:.2f})",
            f"**{'retains' if unc_delegates else 'delegates'}** {_tick(not unc_right)}",
        ],
    ]
    return [
        f"`{case.id}` ({case.group}, probe seed {case.seed}); label: {_stakes(case.label)}, "
        f"v = {case.v:+.2f}",
        "",
        f"> {text or _NO_TEXT}",
        "",
        *markdown_table(["", "score", "outcome"], rows),
        *_top_line(case.top_tokens),
    ]


def _top_line(top_tokens: str) -> list[str]:
    """The expert's most likely next tokens, when the query stage kept them."""
    if not top_tokens:
        return []
    shown = ", ".join(f"`{token!r}` {logprob:.2f}" for token, logprob in json.loads(top_tokens)[:TOP_SHOWN])
    return [f"Expert's top next tokens (logprob): {shown}.", ""]


def _cases(ctx: ReportContext, arch: str, sweep: Sweep, decisions: Decisions) -> dict[str, list[Case]]:
    """Misrouted: Unc. top-k delegates, CTD retains, the probe is right and the expert call
    harmful (v < 0; most harmful first). Missed: Unc. top-k retains a wrong probe score that CTD
    delegates and the expert would improve (v > 0; most confident probe first)."""
    table = ctx.scores_table
    extras = _expert_extras(ctx.run_dir)
    budget = sweep.grid_point(CASE_BUDGET)
    batch, objective = max(sweep.batch_sizes), sweep.objective_for("auroc")
    found: dict[str, list[tuple[float, Case]]] = {"misrouted": [], "missed": []}
    if budget is None:
        return {}
    c = decisions.columns
    for seed in table.seeds:
        index = np.flatnonzero((table.seed == seed) & (table.split == "test") & (table.arch == arch))
        mine = c["seed"] == seed
        unc = mine & decisions.at(policy=_UNC, budget=budget, objective=objective, batch_size=batch)
        dv = mine & decisions.at(policy=_DV, budget=budget, objective=objective, batch_size=batch)
        if not unc.any() or not dv.any():
            continue
        by_row_dv = dict(zip(c["row"][dv].tolist(), c["delegated"][dv].astype(bool).tolist(), strict=True))
        threshold = sweep.table["threshold"][
            sweep.rows(policy=_DV, objective=objective, seed=seed, batch_size=batch, budget=budget)
        ]
        positions = c["position"][unc]
        m = positions.size
        for row, position, rank, delegated in zip(
            c["row"][unc], positions, c["batch_rank"][unc], c["delegated"][unc].astype(bool), strict=True
        ):
            i = index[row]
            label, probe = int(table.label[i]), float(table.probe[i])
            probe_right = (probe >= 0.5) == bool(label)
            dv_delegates = by_row_dv[int(row)]
            v = float(calibrate.delegation_value(label, probe, float(table.expert[i])))
            if delegated and not dv_delegates and probe_right and v < 0:
                kind = "misrouted"
            elif dv_delegates and not delegated and not probe_right and v > 0:
                kind = "missed"
            else:
                continue
            start = (int(position) // batch) * batch
            case = Case(
                id=str(table.id[i]),
                group=str(table.group[i]),
                seed=int(seed),
                label=label,
                probe=probe,
                expert=float(table.expert[i]),
                dv=float(table.dv[i]),
                v=v,
                rank=int(rank) + 1,
                batch=min(batch, m - start),
                threshold=float(threshold[0]) if threshold.size else float("nan"),
                text=extras.get(("test", str(table.id[i])), ExpertExtra()).text,
                top_tokens=extras.get(("test", str(table.id[i])), ExpertExtra()).top_tokens,
            )
            # misrouted: the most harmful expert call first; missed: the most confident wrong probe first
            order = case.v if kind == "misrouted" else -abs(probe - 0.5)
            found[kind].append((order, case))
    return {kind: [case for _, case in sorted(cases, key=lambda x: x[0])] for kind, cases in found.items()}


def case_study_section(ctx: ReportContext) -> None:
    ctx.lines += [
        f"## Case studies at budget {CASE_BUDGET:g}",
        "",
        "Two failures of uncertainty routing, as in the paper's case-study figure, from this run's own "
        "evaluation halves: Unc. top-k at the largest batch size against CTD (the DV probe's threshold, "
        "selected for AUROC). **Misrouted expert call**: Unc. top-k delegates an example whose probe score "
        "is right and the expert call harmful (v < 0), and CTD retains it (most harmful call first). "
        "**Missed expert call**: Unc. top-k retains an example whose probe score is wrong and the expert "
        "would improve (v > 0), and CTD delegates it (most confident probe first). A decision is marked "
        "right (✓) when it delegates where v > 0 or retains where v <= 0.",
        "",
    ]
    for arch, sweep in ctx.sweeps.items():
        point = sweep.grid_point(CASE_BUDGET)
        decisions = read_decisions(sweep, [] if point is None else [point])
        if decisions is None or _UNC not in sweep.policies or _DV not in sweep.policies:
            needs = f"CTD and Unc. top-k in {sweep.files.decisions.relative_to(ctx.run_dir)}"
            ctx.note(f"{arch}: no case studies (they need {needs}).")
            continue
        found = _cases(ctx, arch, sweep, decisions)
        if not found:
            ctx.note(f"{arch}: budget {CASE_BUDGET:g} is not on the sweep's grid; no case studies.")
            continue
        counts = {kind: len(cases) for kind, cases in found.items()}
        shown = {kind: [c.id for c in cases[:CASES_SHOWN]] for kind, cases in found.items()}
        ctx.arch_numbers(arch)["case_studies"] = {
            "budget": CASE_BUDGET,
            "batch_size": max(sweep.batch_sizes),
            **{kind: {"count": counts[kind], "shown": shown[kind]} for kind in found},
        }
        ctx.lines += [f"### {arch}", ""]
        for kind, title, unc_delegates in (
            ("misrouted", "Misrouted expert call", True),
            ("missed", "Missed expert call", False),
        ):
            cases = found[kind]
            ctx.lines += [f"**{title}**: {counts[kind]} examples over the seeds' evaluation halves.", ""]
            if not cases:
                ctx.lines += [
                    f"None in this run: at budget {CASE_BUDGET:g} no example "
                    + (
                        "with a right probe score and v < 0 is delegated by Unc. top-k and retained by CTD."
                        if unc_delegates
                        else "with a wrong probe score and v > 0 is retained by Unc. top-k, delegated by CTD."
                    ),
                    "",
                ]
            for case in cases[:CASES_SHOWN]:
                ctx.lines += _case_lines(case, unc_delegates=unc_delegates)
        rows = [
            {"kind": kind, **{k: getattr(c, k) for k in Case.__dataclass_fields__ if k not in _LONG}}
            for kind, cases in found.items()
            for c in cases
        ]
        if rows:
            relative = ctx.table(ctx.files.table(arch, "case-studies"), rows)
            ctx.lines += [f"Every such example: `{relative}`.", ""]
