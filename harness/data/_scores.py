"""The scores table (SPEC section 2): the contract between stages, read and checked row by row."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

import calibrate

from .._bounds import LIMITS
from .._errors import InputError
from ._tables import RawTable, read_table, write_table

__all__ = [
    "BINARY_SUFFIX",
    "SCORES_COLUMNS",
    "SPLITS",
    "ScoresTable",
    "binary_twin",
    "read_scores",
    "scores_from_columns",
    "stage_columns",
    "write_scores",
]

SCORES_COLUMNS: tuple[str, ...] = ("id", "group", "split", "label", "probe", "expert", "dv", "seed", "arch")
SPLITS: tuple[str, ...] = ("dev", "test")
# A K-stage cascade's table adds, for each expert after the first (stage k = 2..K), its scores and
# its stage's DV scores under these names; a table without them is one expert's, as always.
_STAGE_COLUMNS = ("expert_{k}", "dv_{k}")
BINARY_SUFFIX = "-binary"
"""An arch "<arch>-binary" in a scores table holds a DV probe trained on v_bin; it pairs with "<arch>"."""


def binary_twin(arch: str) -> str:
    """The arch name of `arch`'s binary-target DV probe in a scores table."""
    return arch + BINARY_SUFFIX


def stage_columns(k: int) -> tuple[str, str]:
    """The names of stage k's expert and DV columns (k >= 2; stage 1's are 'expert' and 'dv')."""
    if k < 2:
        raise ValueError(f"stage {k}: the first stage's columns are 'expert' and 'dv'")
    return tuple(name.format(k=k) for name in _STAGE_COLUMNS)  # type: ignore[return-value]


@dataclass(frozen=True)
class ScoresTable:
    """A checked scores table: one row per (example, probe seed), columns as numpy arrays."""

    source: str
    id: NDArray[np.str_]
    group: NDArray[np.str_]
    split: NDArray[np.str_]
    label: NDArray[np.int64]
    probe: NDArray[np.float64]
    expert: NDArray[np.float64]
    dv: NDArray[np.float64]
    seed: NDArray[np.int64]
    arch: NDArray[np.str_]
    # Stages 2..K of a cascade (K - 1, rows): the later experts' scores and their DV scores.
    later_experts: NDArray[np.float64] | None = None
    later_dv: NDArray[np.float64] | None = None

    @property
    def stages(self) -> int:
        """How many experts the table's cascade has (1: the paper's)."""
        return 1 + (0 if self.later_experts is None else self.later_experts.shape[0])

    @property
    def seeds(self) -> list[int]:
        return sorted(int(s) for s in np.unique(self.seed))

    @property
    def archs(self) -> list[str]:
        return sorted(str(a) for a in np.unique(self.arch))

    def arch_name(self, arch: str | None) -> str:
        """The probe configuration `arch` names (--arch), or the table's only one when it is None;
        an InputError when it is not in the table, or left out of a table of several."""
        if arch is None:
            if len(self.archs) > 1:
                raise InputError(
                    f"{self.source}: column 'arch': the table holds several probe configurations "
                    f"({', '.join(self.archs)}); choose one with --arch"
                )
            return self.archs[0]
        if arch not in self.archs:
            raise InputError(f"--arch {arch}: not in {self.source} (it has {', '.join(self.archs)})")
        return arch

    def _test_rows(self, arch: str | None) -> dict[int, NDArray[np.bool_]]:
        """The test rows of every seed of one probe configuration (`arch` may be left out when
        the table holds a single one)."""
        arch = self.arch_name(arch)
        out = {}
        for seed in self.seeds:
            rows = (self.seed == seed) & (self.split == "test") & (self.arch == arch)
            if rows.any():
                out[seed] = rows
        return out

    def test_scores(self, arch: str | None = None) -> dict[int, calibrate.Scores]:
        """The test split of every seed for one probe configuration, ready for calibration.
        `arch` may be left out when the table holds a single one."""
        return {
            seed: calibrate.Scores(
                label=self.label[rows],
                probe=self.probe[rows],
                expert=self.expert[rows],
                dv=self.dv[rows],
                group=self.group[rows],
            )
            for seed, rows in self._test_rows(arch).items()
        }

    def cascade_scores(self, arch: str | None = None) -> dict[int, calibrate.CascadeScores]:
        """The test split of every seed as a K-stage cascade (stage 1: 'expert' and 'dv')."""
        out = {}
        rows_by_seed = self._test_rows(arch)
        for seed, rows in rows_by_seed.items():
            later = (np.zeros((0, self.label.size)), np.zeros((0, self.label.size)))
            if self.later_experts is not None and self.later_dv is not None:
                later = (self.later_experts, self.later_dv)
            out[seed] = calibrate.CascadeScores(
                label=self.label[rows],
                probe=self.probe[rows],
                experts=np.concatenate([self.expert[None, rows], later[0][:, rows]]),
                dv=np.concatenate([self.dv[None, rows], later[1][:, rows]]),
            )
        return out

    def columns(self) -> dict[str, NDArray]:
        out = {name: getattr(self, name) for name in SCORES_COLUMNS}
        for k in range(2, self.stages + 1):
            expert, dv = stage_columns(k)
            out[expert] = self.later_experts[k - 2]  # type: ignore[index]
            out[dv] = self.later_dv[k - 2]  # type: ignore[index]
        return out


def _strings(raw: RawTable, name: str) -> NDArray[np.str_]:
    values = raw.columns[name]
    for i, v in enumerate(values):
        if v is None or (isinstance(v, float) and np.isnan(v)) or str(v) == "":
            raise InputError(f"{raw.path}: column '{name}', {raw.where(i)}: empty value")
    return values.astype(str)


def _numbers(
    raw: RawTable, name: str, *, allow_empty: NDArray[np.bool_] | None = None
) -> NDArray[np.float64]:
    """Float column; CSV text is parsed, empty cells are NaN only where `allow_empty` says so."""
    values = raw.columns[name]
    if values.dtype.kind in "fiub":
        out = values.astype(np.float64)
    else:
        out = np.empty(len(values))
        for i, v in enumerate(values):
            if v is None or str(v).strip() == "":
                out[i] = np.nan
                continue
            try:
                out[i] = float(v)
            except (TypeError, ValueError):
                raise InputError(
                    f"{raw.path}: column '{name}', {raw.where(i)}: {v!r} is not a number"
                ) from None
    missing = np.isnan(out)
    if allow_empty is not None:
        missing &= ~allow_empty
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise InputError(f"{raw.path}: column '{name}', {raw.where(i)}: missing value (NaN or empty)")
    return out


def _integers(raw: RawTable, name: str) -> NDArray[np.int64]:
    values = _numbers(raw, name)
    fractional = values != np.round(values)
    if fractional.any():
        i = int(np.flatnonzero(fractional)[0])
        raise InputError(f"{raw.path}: column '{name}', {raw.where(i)}: {values[i]:g} is not an integer")
    # Beyond 2^53 a float no longer holds every integer: the value read may not be the one written.
    huge = np.abs(values) > 2.0**53
    if huge.any():
        i = int(np.flatnonzero(huge)[0])
        raise InputError(f"{raw.path}: column '{name}', {raw.where(i)}: {values[i]:g} is out of range")
    return values.astype(np.int64)


def read_scores(path: Path | str, *, purpose: str = "calibrate on") -> ScoresTable:
    """Read and check a scores table; the first problem found is raised as one InputError line
    naming the file, the column and the row."""
    return _checked(read_table(Path(path)), purpose)


def scores_from_columns(columns: dict[str, NDArray], source: str = "<memory>") -> ScoresTable:
    """Check an in-memory scores table (as `simulate_scores` returns) like a file."""
    arrays = {name: np.asarray(values) for name, values in columns.items()}
    return _checked(RawTable(Path(source), arrays, lambda i: f"row {i + 1}"))


def _checked(raw: RawTable, purpose: str = "calibrate on") -> ScoresTable:
    missing = [c for c in SCORES_COLUMNS if c not in raw.columns]
    if missing:
        names = ", ".join(repr(m) for m in missing)
        raise InputError(
            f"{raw.path}: missing column{'s' if len(missing) > 1 else ''} {names} "
            f"(a scores table has {', '.join(SCORES_COLUMNS)})"
        )
    if len(raw) == 0:
        raise InputError(f"{raw.path}: the table has no rows")

    split = _strings(raw, "split")
    bad_split = ~np.isin(split, SPLITS)
    if bad_split.any():
        i = int(np.flatnonzero(bad_split)[0])
        raise InputError(f"{raw.path}: column 'split', {raw.where(i)}: {split[i]!r} is not one of {SPLITS}")
    label = _numbers(raw, "label")
    bad_label = ~np.isin(label, (0.0, 1.0))
    if bad_label.any():
        i = int(np.flatnonzero(bad_label)[0])
        raise InputError(f"{raw.path}: column 'label', {raw.where(i)}: {label[i]:g} is not 0 or 1")
    scores = {}
    for name in ("probe", "expert"):
        values = _numbers(raw, name)
        outside = (values < 0) | (values > 1)
        if outside.any():
            i = int(np.flatnonzero(outside)[0])
            raise InputError(f"{raw.path}: column '{name}', {raw.where(i)}: {values[i]:g} is outside [0, 1]")
        scores[name] = values
    dv = _numbers(raw, "dv", allow_empty=split == "dev")
    if np.isinf(dv).any():
        i = int(np.flatnonzero(np.isinf(dv))[0])
        raise InputError(f"{raw.path}: column 'dv', {raw.where(i)}: infinite value")
    later = _later_stages(raw, split)
    seed = _integers(raw, "seed")
    ids = _strings(raw, "id")
    table = ScoresTable(
        source=str(raw.path),
        id=ids,
        group=_strings(raw, "group"),
        split=split,
        label=label.astype(np.int64),
        probe=scores["probe"],
        expert=scores["expert"],
        dv=dv,
        seed=seed,
        arch=_strings(raw, "arch"),
        later_experts=later[0],
        later_dv=later[1],
    )
    _check_unique_ids(raw, table)
    if not (split == "test").any():
        raise InputError(f"{raw.path}: column 'split': no 'test' rows, so there is nothing to {purpose}")
    return table


def _score_column(raw: RawTable, name: str) -> NDArray[np.float64]:
    values = _numbers(raw, name)
    outside = (values < 0) | (values > 1)
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise InputError(f"{raw.path}: column '{name}', {raw.where(i)}: {values[i]:g} is outside [0, 1]")
    return values


def _dv_column(raw: RawTable, name: str, split: NDArray[np.str_]) -> NDArray[np.float64]:
    dv = _numbers(raw, name, allow_empty=split == "dev")
    if np.isinf(dv).any():
        i = int(np.flatnonzero(np.isinf(dv))[0])
        raise InputError(f"{raw.path}: column '{name}', {raw.where(i)}: infinite value")
    return dv


def _later_stages(
    raw: RawTable, split: NDArray[np.str_]
) -> tuple[NDArray[np.float64] | None, NDArray[np.float64] | None]:
    """The columns of stages 2..K, which come in pairs and in order (expert_2, dv_2, expert_3, ...)."""
    names = [c for c in raw.columns if re.fullmatch(r"(expert|dv)_\d+", c)]
    stages = sorted({int(c.rsplit("_", 1)[1]) for c in names})
    if not stages:
        return None, None
    if stages[0] < 2:
        first = next(c for c in names if int(c.rsplit("_", 1)[1]) < 2)
        raise InputError(
            f"{raw.path}: column '{first}': the first expert's columns are 'expert' and 'dv'; a "
            "cascade's later experts are numbered from 2 (expert_2, dv_2, ...)"
        )
    if max(stages) > LIMITS["stages"]:
        raise InputError(
            f"{raw.path}: columns up to expert_{max(stages)}: a cascade of at most {LIMITS['stages']} experts"
        )
    for k in range(2, max(stages) + 1):
        for name in stage_columns(k):
            if name not in raw.columns:
                raise InputError(
                    f"{raw.path}: missing column '{name}' (a cascade of {max(stages)} experts has "
                    f"{', '.join(c for j in range(2, max(stages) + 1) for c in stage_columns(j))})"
                )
    experts = [_score_column(raw, stage_columns(k)[0]) for k in range(2, max(stages) + 1)]
    dvs = [_dv_column(raw, stage_columns(k)[1], split) for k in range(2, max(stages) + 1)]
    return np.stack(experts), np.stack(dvs)


def _check_unique_ids(raw: RawTable, table: ScoresTable) -> None:
    """An id names one example within (split, seed, arch)."""
    keys = [
        "\x00".join(parts)
        for parts in zip(table.split, table.seed.astype(str), table.arch, table.id, strict=True)
    ]
    if len(set(keys)) == len(keys):
        return
    seen: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key in seen:
            raise InputError(
                f"{raw.path}: column 'id', {raw.where(i)}: id '{table.id[i]}' repeats in split "
                f"'{table.split[i]}', seed {table.seed[i]}, arch '{table.arch[i]}' "
                f"(first at {raw.where(seen[key])})"
            )
        seen[key] = i


def write_scores(path: Path | str, columns: dict[str, NDArray]) -> Path:
    """Write a scores table (Parquet, or CSV when the name ends .csv), with the later stages'
    columns of a cascade when `columns` has them."""
    later = [name for k in range(2, 2 + len(columns)) for name in stage_columns(k) if name in columns]
    return write_table(Path(path), {name: columns[name] for name in (*SCORES_COLUMNS, *later)})
