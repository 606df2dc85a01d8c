"""The built-in labelled data set: short, synthetic, written by this project.

Why it exists: a fresh clone must be able to run every stage (probe, expert, DV probe,
calibration) end to end with no download, on a CPU, in minutes. The four groups mirror the four
evaluation domains of the paper (general chat, clinical notes, doctor-patient dialogue, tool use),
in the format of McKenzie et al. (2025) that `harness.data._datasets.read_dataset` reads.

How it was written: every sentence below was written by hand for this project; nothing is copied
from an existing data set or web page. Each group has high-stakes templates (self-harm intent,
overdoses, cardiac and stroke emergencies, scams that empty savings, destructive production
commands, dangerous chemicals) and low-stakes templates (recipes, scheduling, mild colds,
spreadsheets). Slots such as `{drug}` or `{city}` are filled by a seeded `random.Random`, so
`write_builtin` regenerates the shipped files byte for byte. To keep the task learnable but not
trivial, several low-stakes templates reuse words of the high-stakes ones ("kill the process",
"overdue bill", "drop the table" in a sandbox, "took my vitamin twice", "my back is killing me"),
and several high-stakes ones are phrased calmly (giving possessions away, a doubled insulin dose).

Sizes: per group and label 20 dev and 30 test examples; 40 train examples per label for the
group in `TRAIN_GROUPS` only (480 in all: train 80, dev 160, test 240). The safety probe thus
learns from one domain and is evaluated on four, as in the paper, where it is trained on one data
set and tested on others; and a quarter of the training group's templates per label appear only in
dev and test (see `builtin_rows`). Measured with the embedded default (`ctd eval`): probe test
AUROC 0.80 with this seed of the generator and 0.84 with another, where training on all four gave
0.97 and left an expert nothing to correct (the README's summary table has the run's numbers).
Run `python -m harness.data.builtin._generate OUT_DIR` to rewrite the files.
"""

from __future__ import annotations

import json
import random
import string
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import builtin_dir
from ._templates import GROUP_TEMPLATES, Template

__all__ = [
    "BUILTIN_GROUPS",
    "BUILTIN_SPLITS",
    "PER_LABEL",
    "TRAIN_GROUPS",
    "builtin_rows",
    "write_builtin",
]

BUILTIN_GROUPS = ("chat", "clinical", "dialogue", "tooluse")
BUILTIN_SPLITS = ("train", "dev", "test")
TRAIN_GROUPS = ("chat",)
"""The groups that have train examples; every group has dev and test examples."""
PER_LABEL = {"train": 40, "dev": 20, "test": 30}
"""Examples per (group, split, label), train only for the groups of `TRAIN_GROUPS`."""

_SEED = "ctd-builtin-v1"
_LABEL_TEXT = {1: "high-stakes", 0: "low-stakes"}


def _slot_names(text: str) -> list[str]:
    """Slot names of a template text, in order of first appearance (never a set: set order of
    strings changes with PYTHONHASHSEED and would break byte-identical regeneration)."""
    names: list[str] = []
    for _, name, _, _ in string.Formatter().parse(text):
        if name and name not in names:
            names.append(name)
    return names


def _fill(template: Template, slots: Mapping[str, Sequence[str]], rng: random.Random) -> str | list:
    """One example from one template: a plain string, or a list of {"role", "content"} dicts."""
    texts = [template] if isinstance(template, str) else [content for _, content in template]
    names: list[str] = []
    for text in texts:
        names += [name for name in _slot_names(text) if name not in names]
    values = {name: rng.choice(slots[name]) for name in names}
    if isinstance(template, str):
        return template.format_map(values)
    return [{"role": role, "content": content.format_map(values)} for role, content in template]


def _draw(
    templates: Sequence[Template],
    slots: Mapping[str, Sequence[str]],
    rng: random.Random,
    n: int,
    seen: set[str],
) -> list:
    """`n` examples not in `seen` (which grows), cycling through the templates in a fresh random
    order each round, so that every template is used about equally often."""
    out: list = []
    order = list(range(len(templates)))
    i = 0
    while len(out) < n:
        if i % len(order) == 0:
            rng.shuffle(order)
        template = templates[order[i % len(order)]]
        i += 1
        for _ in range(500):
            example = _fill(template, slots, rng)
            key = json.dumps(example, sort_keys=True)
            if key not in seen:
                break
        else:  # pragma: no cover - a template with too few fillers is a bug in this file
            raise RuntimeError(f"too few distinct fillings for template {template!r}")
        seen.add(key)
        out.append(example)
    return out


def builtin_rows() -> dict[str, list[dict[str, str]]]:
    """The rows of each split file, as written: `inputs` (a plain string or JSON text of
    messages), `ids`, `labels` and `group`. Deterministic: same rows on every call.

    Only the groups of `TRAIN_GROUPS` have train rows, and per such group and label a quarter of
    the templates (`_held_out`) never appear in train: dev and test draw from all templates. A
    probe must generalise past the domains and phrasings it was trained on (as in the paper, where
    it trains on one data set and is tested on others), so it makes errors that an expert can
    correct; with every template of every group in train, a bag of words alone classifies test
    almost perfectly.
    """
    rows: dict[str, list[dict[str, str]]] = {split: [] for split in BUILTIN_SPLITS}
    for group in BUILTIN_GROUPS:
        high, low, slots = GROUP_TEMPLATES[group]
        rng = random.Random(f"{_SEED}:{group}")
        pairs: dict[str, list[tuple[int, str | list]]] = {split: [] for split in BUILTIN_SPLITS}
        for label, templates in ((1, high), (0, low)):
            order = list(templates)
            rng.shuffle(order)
            seen: set[str] = set()
            n_train = PER_LABEL["train"] if group in TRAIN_GROUPS else 0
            train = _draw(order[_held_out(len(order)) :], slots, rng, n_train, seen)
            rest = _draw(order, slots, rng, PER_LABEL["dev"] + PER_LABEL["test"], seen)
            rng.shuffle(rest)
            pairs["train"] += [(label, example) for example in train]
            pairs["dev"] += [(label, example) for example in rest[: PER_LABEL["dev"]]]
            pairs["test"] += [(label, example) for example in rest[PER_LABEL["dev"] :]]
        number = 0
        for split in BUILTIN_SPLITS:
            rng.shuffle(pairs[split])
            for label, example in pairs[split]:
                number += 1
                inputs = example if isinstance(example, str) else json.dumps(example, ensure_ascii=False)
                rows[split].append(
                    {
                        "inputs": inputs,
                        "ids": f"{group}-{number:04d}",
                        "labels": _LABEL_TEXT[label],
                        "group": group,
                    }
                )
    order_rng = random.Random(f"{_SEED}:order")
    for split in BUILTIN_SPLITS:
        order_rng.shuffle(rows[split])
    return rows


def _held_out(n_templates: int) -> int:
    """How many of a (group, label)'s templates stay out of train: a quarter, at least one."""
    return max(1, n_templates // 4)


def write_builtin(out_dir: Path | str) -> dict[str, Path]:
    """(Re)write `train.jsonl`, `dev.jsonl` and `test.jsonl` under `out_dir`; returns their paths.
    The bytes depend only on this file, so the shipped files can be checked against a rewrite."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for split, rows in builtin_rows().items():
        path = out / f"{split}.jsonl"
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        path.write_bytes(text.encode("utf-8"))
        paths[split] = path
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m harness.data.builtin._generate [OUT_DIR]`: rewrite the files (default: the
    installed folder)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) > 1 or (args and args[0] in {"-h", "--help"}):
        print("usage: python -m harness.data.builtin._generate [OUT_DIR]", file=sys.stderr)
        return 2
    for split, path in write_builtin(args[0] if args else builtin_dir()).items():
        print(f"{split}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
