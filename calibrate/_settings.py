"""The engine's defaults, written once, and the settings every Learn-then-Test controller takes.

The split fractions, the default grids and the default testing settings are named here; the
sweep, validation, the deployed monitor and every command read them from here (through the
package face), so that changing one changes it everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from ._fwer import FWER_METHODS, FWERMethod, FWERProcedure
from ._pvalues import PVALUE_METHODS, PValueMethod

__all__ = [
    "CAL_FRACTION",
    "CASCADE_RUN_POLICIES",
    "CERTIFIED_MODES",
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_BUDGETS",
    "DEFAULT_CASCADE_POLICIES",
    "DEFAULT_DELTA",
    "DEFAULT_FWER",
    "DEFAULT_JOINT_OBJECTIVE",
    "DEFAULT_PARETO",
    "DEFAULT_PVALUE",
    "DEFAULT_SPLIT_SEED",
    "DEFAULT_TRIALS",
    "EST_FRACTION",
    "N_GRID",
    "CertifiedMode",
    "ControlConfig",
    "ControlMode",
]

# A calibration sample is this share of a seed's test split (the rest is evaluated on) ...
CAL_FRACTION = 0.5
# ... of which this share is D_est (thresholds and their order are fitted on it) and the rest
# D_cal (the tests run on it): SPEC section 4.
EST_FRACTION = 0.3
# The failure probability of every guarantee unless one is asked for: the paper's.
DEFAULT_DELTA = 0.1
# How the tests of a level are run unless asked otherwise: fixed-sequence testing of exact
# binomial p-values (the paper's text).
DEFAULT_FWER: FWERMethod = "fixed-sequence"
DEFAULT_PVALUE: PValueMethod = "binomial"
# ... testing only the thresholds Pareto-optimal on D_est (Pareto testing, the paper's).
DEFAULT_PARETO = True
# Joint control picks among its certified thresholds by the cascade's D_est AUROC, as budget control.
DEFAULT_JOINT_OBJECTIVE: Literal["auroc"] = "auroc"
# The seed of the random cuts into D_est, D_cal and the evaluation rest unless one is given: the
# sweep's, a validation's calibration samples and the deployed monitor's D_est/D_cal cut.
DEFAULT_SPLIT_SEED = 0
# Thresholds per policy and split: quantiles of the signal (`threshold_grid`).
N_GRID = 100
# Random calibration samples of a guarantee validation.
DEFAULT_TRIALS = 500
# The top-k policies' batch sizes (the paper's).
DEFAULT_BATCH_SIZES: tuple[int, ...] = (32, 64, 128)
# The one default budget grid of every command: 0.05, 0.10, ..., 0.95, the paper's range on a
# grid that holds 0.1, 0.2 and 0.3 exactly (the budgets the report's summary reads).
DEFAULT_BUDGETS: tuple[float, ...] = tuple(round(0.05 * k, 2) for k in range(1, 20))
# A cascade sweep's policies unless asked: CTD alone (its table then has no policy column). A
# run's validate stage validates its cascade with each of CASCADE_RUN_POLICIES, for the report:
# the uncertainty cascade costs a second pass of the same cheap counts.
DEFAULT_CASCADE_POLICIES: tuple[str, ...] = ("ctd",)
CASCADE_RUN_POLICIES: tuple[str, ...] = ("ctd", "uncertainty")

# What a controller certifies: R_B (the delegation rate) or R_P (the cascade's 0-1 error) <= alpha.
CertifiedMode = Literal["budget", "performance"]
CERTIFIED_MODES: tuple[str, ...] = get_args(CertifiedMode)
# A controller's record also names the untested plug-in selector, which certifies nothing.
ControlMode = Literal["budget", "performance", "empirical"]


@dataclass(frozen=True, kw_only=True)
class ControlConfig:
    """How a level alpha is tested: the settings shared by `budget_control`,
    `performance_control` and `empirical_control` (and their batch forms).

    For a family of thresholds lambda_1, ..., lambda_T the controllers test H_j: R(lambda_j) > alpha
    with p_j from the integer loss count k_j on D_cal (`pvalue`: "binomial",
    P(Binomial(n_cal, alpha) <= k_j), or "hb", Hoeffding-Bentkus), run the FWER procedure `fwer`
    at level `delta` over them, so that P(R(lambda) <= alpha for every certified lambda) >= 1 - delta,
    and with `pareto` test only the thresholds Pareto-optimal on D_est. The empirical selector
    tests nothing: of these it reads `pareto` only.

    References
    ----------
    Angelopoulos et al. (2021). Learn then Test. Laufer-Goldshtein et al. (2023). Pareto testing.
    """

    delta: float = DEFAULT_DELTA
    fwer: FWERMethod | FWERProcedure = DEFAULT_FWER
    pareto: bool = DEFAULT_PARETO
    pvalue: PValueMethod = DEFAULT_PVALUE

    def __post_init__(self) -> None:
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta}")
        if isinstance(self.fwer, str) and self.fwer not in FWER_METHODS:
            raise ValueError(f"fwer must be one of {FWER_METHODS}, got {self.fwer!r}")
        if self.pvalue not in PVALUE_METHODS:
            raise ValueError(f"pvalue must be one of {PVALUE_METHODS}, got {self.pvalue!r}")
