"""Options that `ctd calibrate` and `ctd validate` share, and the check of a level in (0, 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from calibrate import FWERMethod, PValueMethod

from .._bounds import check_levels
from ..run import RunLayout

__all__ = [
    "ArchOption",
    "DeltaOption",
    "FwerOption",
    "JsonOption",
    "PValueOption",
    "ParetoOption",
    "RunOption",
    "ScoresOption",
    "unit_level",
]

ScoresOption = Annotated[
    Path | None,
    typer.Option("--scores", help="A scores table (.parquet, or .csv) with the SPEC section 2 columns."),
]
RunOption = Annotated[
    str | None,
    typer.Option(
        "--run", help=f"A run name: uses {RunLayout(Path('runs', 'NAME')).scores} instead of --scores."
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as one JSON object on stdout.")]
ArchOption = Annotated[
    str | None,
    typer.Option("--arch", help="Probe configuration to use when the table holds several (column 'arch')."),
]
FwerOption = Annotated[FWERMethod, typer.Option("--fwer", help="Multiple-testing procedure.")]
ParetoOption = Annotated[
    bool,
    typer.Option(
        "--pareto/--no-pareto",
        help=(
            "Pareto-filter the thresholds on D_est. --no-pareto: in budget mode, budget-only LTT (test "
            "every threshold, keep the most aggressive certified one); in performance mode, test every "
            "threshold unfiltered."
        ),
    ),
]
PValueOption = Annotated[
    PValueMethod,
    typer.Option(
        "--pvalue",
        help=(
            "p-value of each LTT test: binomial (exact, as the paper's text says) or hb (Hoeffding-Bentkus, "
            "as the authors' code did for performance control; more conservative)."
        ),
    ),
]
DeltaOption = Annotated[
    float, typer.Option("--delta", help="Failure probability of the guarantee, in (0, 1).")
]


def unit_level(value: float, option: str) -> float:
    """`value` after checking it lies in (0, 1), an InputError naming `option` otherwise."""
    check_levels(option, (value,))
    return value
