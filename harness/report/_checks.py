"""Degenerate scorers: an expert or a probe that puts nearly every example of a split on one side
of 0.5, or whose scores barely vary. Its accuracy, its AUROC where its scores barely vary, and any
gain a cascade shows over it, then mean something other than a reader assumes, so the report and
the terminal warn about it.

Read from the scores table only (the expert's and the probe's scores as the stages wrote them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..data import ScoresTable
from ._context import ReportContext, markdown_table, pct

__all__ = [
    "NARROW_SPREAD",
    "ONE_CLASS_SHARE",
    "SPREAD_QUANTILES",
    "ScoreCheck",
    "check_scores",
    "checks_section",
]

ONE_CLASS_SHARE = 0.95
"""A scorer that predicts one class (score >= 0.5, or < 0.5) for more than this share of a split."""
SPREAD_QUANTILES: tuple[float, float] = (0.05, 0.95)
NARROW_SPREAD = 0.1
"""Scores whose 5%-95% range (SPREAD_QUANTILES) is below this span a narrow range."""
_SPREAD_NAME = f"{100 * SPREAD_QUANTILES[0]:g}-{100 * SPREAD_QUANTILES[1]:g}% range"


@dataclass(frozen=True)
class ScoreCheck:
    """One scorer on one split: the share of examples it calls high-stakes (score >= 0.5) and
    the range its middle 90% of scores spans. `scorer` is "expert" or "probe ARCH, seed S"."""

    scorer: str
    split: str
    n: int
    share_high: float
    spread: float

    @property
    def one_class(self) -> bool:
        return max(self.share_high, 1 - self.share_high) > ONE_CLASS_SHARE

    @property
    def narrow(self) -> bool:
        return self.spread < NARROW_SPREAD

    def warnings(self) -> list[str]:
        """One line per problem, saying the rule it broke."""
        out = []
        where = f"{self.scorer} on the {self.split} split ({self.n} examples)"
        if self.one_class:
            high = self.share_high >= 0.5
            side, share = ("high-stakes", self.share_high) if high else ("low-stakes", 1 - self.share_high)
            said = (
                f"{where} predicts {side} for {pct(share)} of the examples (more than "
                f"{pct(ONE_CLASS_SHARE)} in one class, at threshold 0.5): "
            )
            if self.narrow:
                said += (
                    "its AUROC and accuracy, and any cascade gain over it, do not measure a working "
                    "classifier"
                )
            else:  # miscalibrated but spread: the order of its scores still carries information
                said += "its accuracy is close to that of a constant answer"
                if self.scorer == "expert":
                    said += ", and so is any accuracy a cascade gains from it"
                said += (
                    f"; its scores still spread ({_SPREAD_NAME} {self.spread:.3f}), so its AUROC "
                    "measures a ranking, not a classifier"
                )
            out.append(said)
        if self.narrow:
            out.append(
                f"{where}: its scores span a narrow range ({_SPREAD_NAME} {self.spread:.3f}, below "
                f"{NARROW_SPREAD:g}): they barely separate the examples"
            )
        return out


def _check(scorer: str, split: str, scores: np.ndarray) -> ScoreCheck:
    low, high = np.quantile(scores, SPREAD_QUANTILES)
    return ScoreCheck(scorer, split, int(scores.size), float(np.mean(scores >= 0.5)), float(high - low))


def check_scores(table: ScoresTable) -> list[ScoreCheck]:
    """The expert per split (its score depends on the example only, so one seed's rows of one
    arch), then every probe (arch, seed) per split."""
    found = []
    first = (table.arch == table.archs[0]) & (table.seed == table.seeds[0])
    splits = [s for s in ("dev", "test") if (table.split == s).any()]
    for split in splits:
        rows = first & (table.split == split)
        if rows.any():
            found.append(_check("expert", split, table.expert[rows]))
    for arch in table.archs:
        for seed in table.seeds:
            for split in splits:
                rows = (table.arch == arch) & (table.seed == seed) & (table.split == split)
                if rows.any():
                    found.append(_check(f"probe {arch}, seed {seed}", split, table.probe[rows]))
    return found


def checks_section(ctx: ReportContext) -> None:
    """Warnings first, then the table every warning was read from."""
    checks = check_scores(ctx.scores_table)
    warnings = [w for c in checks for w in c.warnings()]
    ctx.warnings += warnings
    ctx.numbers["score_checks"] = {
        "one_class_share": ONE_CLASS_SHARE,
        "narrow_spread": NARROW_SPREAD,
        "spread_quantiles": list(SPREAD_QUANTILES),
        "checks": [asdict(c) | {"one_class": c.one_class, "narrow": c.narrow} for c in checks],
    }
    ctx.lines += ["## Degenerate scores", ""]
    if warnings:
        for warning in warnings:  # a blank line between them: one quote each, not one paragraph
            ctx.lines += [f"> **Warning**: {warning}.", ""]
    else:
        ctx.lines += [
            f"No scorer predicts one class for more than {pct(ONE_CLASS_SHARE)} of a split, and none has a "
            f"{_SPREAD_NAME} below {NARROW_SPREAD:g}.",
            "",
        ]
    rows: list[list[str]] = [
        [c.scorer, c.split, str(c.n), pct(c.share_high), f"{c.spread:.3f}", _flags(c)] for c in checks
    ]
    ctx.lines += markdown_table(["scorer", "split", "n", "score >= 0.5", _SPREAD_NAME, "flag"], rows)


def _flags(check: ScoreCheck) -> str:
    flags: list[str] = []
    if check.one_class:
        flags.append("one class")
    if check.narrow:
        flags.append("narrow")
    return ", ".join(flags) or "—"
