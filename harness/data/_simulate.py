"""Synthetic scores tables with a strong or a weak expert.

The generative story, per example: a group, a balanced label, and a latent difficulty that
makes hard inputs hard for both models. The probe is an overconfident logistic read-out of a
noisy label signal; its noise has a per-example part (the input) and a per-seed part (probe
training). The expert is a sharper, LLM-like read-out whose quality per group sets the
scenario; it does not depend on the probe seed. The DV score is a shrunk, noisy view of the
true delegation value: informative but noisy, as a trained DV probe is.

A cascade of K experts (`stages`) adds, per stage k = 2..K, a larger expert: more separation and
less hurt by the difficulty, so it is worth asking about what the one before found hard; its DV
score is a noisy view of its value over the stage before, v_k = (2y - 1)(e_k - e_{k-1}). The
later stages draw from generators of their own: the first stage's columns are the same whatever
the number of stages.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from numpy.typing import NDArray

from ._scores import stage_columns

__all__ = ["DEFAULT_RANDOM_STATE", "SCENARIOS", "Scenario", "simulate_scores"]

Scenario = Literal["strong", "weak"]
SCENARIOS: tuple[str, ...] = get_args(Scenario)
# The generator's seed unless one is given (`ctd simulate --random-state`, `harness.simulate`):
# the same table every time.
DEFAULT_RANDOM_STATE = 0


@dataclass(frozen=True)
class _Group:
    name: str
    weight: float
    probe_signal: float  # separation of the probe's evidence
    expert_signal: dict[str, float]  # separation of the expert's evidence, per scenario


_GROUPS = (
    _Group("anthropic", 0.32, 1.1, {"strong": 2.2, "weak": 0.9}),
    _Group("mt", 0.26, 1.3, {"strong": 1.8, "weak": 0.6}),
    _Group("mts", 0.12, 1.0, {"strong": 2.0, "weak": 0.5}),
    _Group("toolace", 0.30, 1.2, {"strong": 1.7, "weak": 0.8}),
)
_PROBE_SHARPNESS = 1.7  # > 1: the probe is overconfident
_EXPERT_SHARPNESS = 2.5  # LLM judges answer near 0 or 1
_DIFFICULTY = 0.6  # weight of the shared difficulty in both models' evidence
_SEED_NOISE = 0.35  # share of the probe's noise that changes with the training seed
_DV_NOISE = {"strong": 0.8, "weak": 0.5}  # noise of the DV probe's view of v, per scenario
_STAGE_GAIN = 0.5  # each later expert's extra separation over the one before


_REFERENCE_SIZE = 200_000
_WEIGHTS = np.array([g.weight for g in _GROUPS])


@functools.cache
def _value_moments(scenario: Scenario) -> tuple[float, float]:
    """Mean and variance of v under the scenario, from a fixed reference draw of 200,000
    examples. The DV map uses them instead of a table's own moments, so every table of a
    scenario, whatever its size or random_state, is scored by one DV probe: a table drawn with
    another random_state is fresh data from the same distribution."""
    rng = np.random.default_rng([2**32 - 1, SCENARIOS.index(scenario)])
    g = rng.choice(len(_GROUPS), size=_REFERENCE_SIZE, p=_WEIGHTS / _WEIGHTS.sum())
    sign = rng.choice([-1.0, 1.0], size=_REFERENCE_SIZE)
    difficulty = np.abs(rng.normal(size=_REFERENCE_SIZE))
    expert = _expert(scenario, g, sign, difficulty, rng.normal(size=_REFERENCE_SIZE))
    noise = rng.normal(size=_REFERENCE_SIZE)  # input and seed noise together: unit variance
    value = sign * (expert - _probe(g, sign, difficulty, noise))
    return float(value.mean()), float(value.var())


def _expert(
    scenario: Scenario, group_index: NDArray, sign: NDArray, difficulty: NDArray, noise: NDArray
) -> NDArray:
    from scipy.special import expit  # scipy loads on first use, not with the command line

    separation = np.array([g.expert_signal[scenario] for g in _GROUPS])[group_index]
    return expit(_EXPERT_SHARPNESS * (sign * (separation - _DIFFICULTY * difficulty) + noise))


def _later_expert(
    scenario: Scenario, k: int, group_index: NDArray, sign: NDArray, difficulty: NDArray, noise: NDArray
) -> NDArray:
    """Stage k's expert (k >= 2): separation grows by _STAGE_GAIN a stage, the difficulty's weight
    shrinks as 1/k."""
    from scipy.special import expit  # scipy loads on first use, not with the command line

    separation = np.array([g.expert_signal[scenario] for g in _GROUPS])[group_index] + _STAGE_GAIN * (k - 1)
    return expit(_EXPERT_SHARPNESS * (sign * (separation - _DIFFICULTY * difficulty / k) + noise))


@functools.cache
def _stage_value_moments(scenario: Scenario, stages: int) -> tuple[tuple[float, float], ...]:
    """Mean and variance of v_k = (2y - 1)(e_k - e_{k-1}) for k = 2..`stages`, from a fixed
    reference draw (as `_value_moments`): one DV map per stage for every table of a scenario."""
    rng = np.random.default_rng([2**32 - 2, SCENARIOS.index(scenario)])
    g = rng.choice(len(_GROUPS), size=_REFERENCE_SIZE, p=_WEIGHTS / _WEIGHTS.sum())
    sign = rng.choice([-1.0, 1.0], size=_REFERENCE_SIZE)
    difficulty = np.abs(rng.normal(size=_REFERENCE_SIZE))
    before = _expert(scenario, g, sign, difficulty, rng.normal(size=_REFERENCE_SIZE))
    out = []
    for k in range(2, stages + 1):
        expert = _later_expert(scenario, k, g, sign, difficulty, rng.normal(size=_REFERENCE_SIZE))
        value = sign * (expert - before)
        out.append((float(value.mean()), float(value.var())))
        before = expert
    return tuple(out)


def _probe(group_index: NDArray, sign: NDArray, difficulty: NDArray, noise: NDArray) -> NDArray:
    from scipy.special import expit  # scipy loads on first use, not with the command line

    separation = np.array([g.probe_signal for g in _GROUPS])[group_index]
    return expit(_PROBE_SHARPNESS * (sign * (separation - _DIFFICULTY * difficulty) + noise))


def simulate_scores(
    scenario: Scenario,
    n: int,
    seeds: int,
    *,
    n_dev: int | None = None,
    random_state: int = DEFAULT_RANDOM_STATE,
    stages: int = 1,
) -> dict[str, NDArray]:
    """A scores table (SPEC section 2) as columns: `n` test and `n_dev` (default `n`) dev
    examples, each scored under `seeds` probe seeds. DV scores are given on test rows only.
    `stages` > 1 adds a cascade's later experts and their DV scores (expert_k, dv_k)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose one of {SCENARIOS}")
    if n < 1 or seeds < 1 or stages < 1:
        raise ValueError("n, seeds and stages must be at least 1")
    n_dev = n if n_dev is None else n_dev
    rng = np.random.default_rng([random_state, SCENARIOS.index(scenario)])
    total = n + n_dev
    split = np.array(["test"] * n + ["dev"] * n_dev)
    group_index = rng.choice(len(_GROUPS), size=total, p=_WEIGHTS / _WEIGHTS.sum())
    label = np.zeros(total, dtype=np.int64)
    for part in (split == "test", split == "dev"):
        for gi in range(len(_GROUPS)):
            members = np.flatnonzero(part & (group_index == gi))
            label[rng.permutation(members)[: (members.size + 1) // 2]] = 1
    sign = 2.0 * label - 1.0
    difficulty = np.abs(rng.normal(size=total))
    expert = _expert(scenario, group_index, sign, difficulty, rng.normal(size=total))
    input_noise = rng.normal(size=total)
    value_mean, value_var = _value_moments(scenario)
    # A regressor predicts E[v | noisy view]: shrink the view toward the mean by
    # Var(v) / (Var(v) + noise^2), which keeps the ranking and gives a realistic MSE.
    noise_sd = _DV_NOISE[scenario]
    shrink = value_var / (value_var + noise_sd**2)

    ids = np.array(
        [f"{s}-{_GROUPS[g].name}-{i:05d}" for i, (s, g) in enumerate(zip(split, group_index, strict=True))]
    )
    columns: dict[str, list[NDArray]] = {
        k: [] for k in ("id", "group", "split", "label", "probe", "expert", "dv", "seed", "arch")
    }
    for seed in range(seeds):
        seed_rng = np.random.default_rng([random_state, SCENARIOS.index(scenario), seed + 1])
        noise = np.sqrt(1 - _SEED_NOISE) * input_noise + np.sqrt(_SEED_NOISE) * seed_rng.normal(size=total)
        probe = _probe(group_index, sign, difficulty, noise)
        value = sign * (expert - probe)
        dv = value_mean + shrink * (value - value_mean + noise_sd * seed_rng.normal(size=total))
        dv = np.where(split == "test", dv, np.nan)
        columns["id"].append(ids)
        columns["group"].append(np.array([_GROUPS[g].name for g in group_index]))
        columns["split"].append(split)
        columns["label"].append(label)
        columns["probe"].append(probe)
        columns["expert"].append(expert)
        columns["dv"].append(dv)
        columns["seed"].append(np.full(total, seed, dtype=np.int64))
        columns["arch"].append(np.full(total, "simulated"))
        before = expert
        for k, (mean_k, var_k) in enumerate(_stage_value_moments(scenario, stages), start=2):
            expert_k, dv_k = stage_columns(k)
            stage_rng = np.random.default_rng([random_state, SCENARIOS.index(scenario), 1000 + k])
            later = _later_expert(scenario, k, group_index, sign, difficulty, stage_rng.normal(size=total))
            value_k = sign * (later - before)
            shrink_k = var_k / (var_k + noise_sd**2)
            view = np.random.default_rng([random_state, SCENARIOS.index(scenario), seed + 1, k]).normal(
                size=total
            )
            dv_later = mean_k + shrink_k * (value_k - mean_k + noise_sd * view)
            columns.setdefault(expert_k, []).append(later)
            columns.setdefault(dv_k, []).append(np.where(split == "test", dv_later, np.nan))
            before = later
    return {k: np.concatenate(v) for k, v in columns.items()}
