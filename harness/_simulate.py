"""Synthetic scores tables with a strong or a weak expert.

The generative story, per example: a group, a balanced label, and a latent difficulty that
makes hard inputs hard for both models. The probe is an overconfident logistic read-out of a
noisy label signal; its noise has a per-example part (the input) and a per-seed part (probe
training). The expert is a sharper, LLM-like read-out whose quality per group sets the
scenario; it does not depend on the probe seed. The DV score is a shrunk, noisy view of the
true delegation value: informative but noisy, as a trained DV probe is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from numpy.typing import NDArray
from scipy.special import expit

__all__ = ["SCENARIOS", "Scenario", "simulate_scores"]

Scenario = Literal["strong", "weak"]
SCENARIOS: tuple[str, ...] = get_args(Scenario)


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


def simulate_scores(
    scenario: Scenario,
    n: int,
    seeds: int,
    *,
    n_dev: int | None = None,
    random_state: int = 0,
) -> dict[str, NDArray]:
    """A scores table (SPEC section 2) as columns: `n` test and `n_dev` (default `n`) dev
    examples, each scored under `seeds` probe seeds. DV scores are given on test rows only."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose one of {SCENARIOS}")
    if n < 1 or seeds < 1:
        raise ValueError("n and seeds must be at least 1")
    n_dev = n if n_dev is None else n_dev
    rng = np.random.default_rng([random_state, SCENARIOS.index(scenario)])
    total = n + n_dev
    split = np.array(["test"] * n + ["dev"] * n_dev)
    weights = np.array([g.weight for g in _GROUPS])
    group_index = rng.choice(len(_GROUPS), size=total, p=weights / weights.sum())
    label = np.zeros(total, dtype=np.int64)
    for part in (split == "test", split == "dev"):
        for gi in range(len(_GROUPS)):
            members = np.flatnonzero(part & (group_index == gi))
            label[rng.permutation(members)[: (members.size + 1) // 2]] = 1
    sign = 2.0 * label - 1.0
    difficulty = np.abs(rng.normal(size=total))
    probe_sep = np.array([g.probe_signal for g in _GROUPS])[group_index]
    expert_sep = np.array([g.expert_signal[scenario] for g in _GROUPS])[group_index]

    expert_evidence = sign * (expert_sep - _DIFFICULTY * difficulty) + rng.normal(size=total)
    expert = expit(_EXPERT_SHARPNESS * expert_evidence)
    input_noise = rng.normal(size=total)

    ids = np.array(
        [f"{s}-{_GROUPS[g].name}-{i:05d}" for i, (s, g) in enumerate(zip(split, group_index, strict=True))]
    )
    columns: dict[str, list[NDArray]] = {
        k: [] for k in ("id", "group", "split", "label", "probe", "expert", "dv", "seed", "arch")
    }
    for seed in range(seeds):
        seed_rng = np.random.default_rng([random_state, SCENARIOS.index(scenario), seed + 1])
        noise = np.sqrt(1 - _SEED_NOISE) * input_noise + np.sqrt(_SEED_NOISE) * seed_rng.normal(size=total)
        probe_evidence = sign * (probe_sep - _DIFFICULTY * difficulty) + noise
        probe = expit(_PROBE_SHARPNESS * probe_evidence)
        value = sign * (expert - probe)
        # A regressor predicts E[v | noisy view]: shrink the view toward the mean by
        # Var(v) / (Var(v) + noise^2), which keeps the ranking and gives a realistic MSE.
        noise_sd = _DV_NOISE[scenario]
        shrink = value.var() / (value.var() + noise_sd**2)
        view = value - value.mean() + noise_sd * seed_rng.normal(size=total)
        dv = value.mean() + shrink * view
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
    return {k: np.concatenate(v) for k, v in columns.items()}
