"""Small data sets for `ctd eval` runs against the fault server: balanced files cut from the
built-in set, each text tagged "item-N" so that the server knows which item a request is for
(and answers with that item's fixed score), and the environment that keeps a run's caches in
its test folder."""

from __future__ import annotations

import json
from pathlib import Path

from harness.data.builtin import builtin_dir

SIZES = {"train": 48, "dev": 40, "test": 64}
# `ctd eval` options that keep a run on the tagged data to seconds: one seed, few epochs,
# budgets and trials.
FAST = [
    "--seeds", "0",
    "--epochs", "8",
    "--budgets", "0.3,0.5,0.7",
    "--batch-sizes", "16",
    "--trials", "40",
    "--performance-alpha", "0.4",
    "--max-tokens", "96",
]  # fmt: skip


def write_tagged_data(folder: Path) -> list[str]:
    """Writes SPLIT.jsonl for each split of SIZES under `folder`; returns the data spec tokens
    (`train=PATH`, `dev=PATH`, `test=PATH`)."""
    folder.mkdir(parents=True, exist_ok=True)
    number = 0
    for split, size in SIZES.items():
        rows = [json.loads(line) for line in (builtin_dir() / f"{split}.jsonl").read_text().splitlines()]
        chosen = [r for r in rows if r["labels"] == "high-stakes"][: size // 2]
        chosen += [r for r in rows if r["labels"] == "low-stakes"][: size // 2]
        with (folder / f"{split}.jsonl").open("w") as handle:
            for row in chosen:
                inputs = row["inputs"]
                tag = f" (ref item-{number})"
                if inputs.startswith("["):
                    messages = json.loads(inputs)
                    messages[-1]["content"] += tag
                    inputs = json.dumps(messages)
                else:
                    inputs += tag
                handle.write(json.dumps({**row, "inputs": inputs}) + "\n")
                number += 1
    return [f"{split}={folder / f'{split}.jsonl'}" for split in SIZES]


def eval_env(tmp_path: Path) -> dict[str, str]:
    """Runs root, expert cache and activation store under `tmp_path`; no hub."""
    return {
        "CTD_RUNS_DIR": str(tmp_path / "runs"),
        "CTD_CACHE": str(tmp_path / "cache.sqlite"),
        "CTD_STORE": str(tmp_path / "store"),
        "HF_HUB_OFFLINE": "1",
    }
