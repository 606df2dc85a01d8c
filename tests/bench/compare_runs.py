"""Two run folders compared file by file, for a change meant to leave results alone (run by hand,
not in CI):

    python tests/bench/compare_runs.py BEFORE AFTER [--alias OLD=NEW ...]

or, to make both runs first, the same `ctd eval` with the code of a git revision and with this
checkout's, sharing copies of one expert cache and activation store so that neither asks an expert
nor extracts twice:

    python tests/bench/compare_runs.py --rev REV --cache CACHE_DIR [--work DIR] [-- EVAL OPTIONS]

where CACHE_DIR holds `experts.sqlite` and `activations/` (a runs root's `cache/` folder).

Every file is compared by what it holds, not its bytes where bytes legitimately differ: Parquet by
schema and values (NaN equal to NaN), JSON with its clock fields (`created`, `started`,
`finished`, `seconds`, ...) dropped, probe weights by tensors and metadata (safetensors writes
its metadata in any order), manifests by stage, status and file names (their hashes cover files
that hold paths and clocks: check fingerprints by rerunning the new code over the old run, which
must skip every stage), text and CSV exactly, everything else (figures) by bytes. `log.txt` is
left out (times), and paths are compared after each `--alias` (the other run's roots) is
replaced. Files only one side has are listed. Exit 0 when all agree, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# Fields that hold a clock reading, a duration or the code's revision: they differ between any
# two runs of a comparison by design.
CLOCK_KEYS = frozenset(
    {
        "created",
        "started",
        "finished",
        "seconds",
        "elapsed",
        "elapsed_s",
        "wall_s",
        "time",
        "at",
        "git_revision",
    }
)
SKIPPED = frozenset({"log.txt"})


def _without_clocks(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_clocks(v) for k, v in value.items() if k not in CLOCK_KEYS}
    if isinstance(value, list):
        return [_without_clocks(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


def _text(path: Path, aliases: list[tuple[str, str]]) -> str:
    text = path.read_text(encoding="utf-8")
    for old, new in aliases:
        text = text.replace(old, new)
    return text


def _same_parquet(a: Path, b: Path) -> str | None:
    import pyarrow.parquet as pq

    left, right = pq.read_table(a), pq.read_table(b)
    if left.schema != right.schema:
        return f"schema {left.schema} != {right.schema}"
    if left.num_rows != right.num_rows:
        return f"{left.num_rows} rows != {right.num_rows}"
    for name in left.column_names:
        x, y = left.column(name).to_pylist(), right.column(name).to_pylist()
        if _without_clocks(x) != _without_clocks(y):
            row = next(
                i
                for i, (p, q) in enumerate(zip(x, y, strict=True))
                if _without_clocks(p) != _without_clocks(q)
            )
            return f"column {name!r} differs first at row {row}: {x[row]!r} != {y[row]!r}"
    return None


def _same_safetensors(a: Path, b: Path) -> str | None:
    from safetensors import safe_open

    opened = [safe_open(str(path), "np") for path in (a, b)]
    if opened[0].metadata() != opened[1].metadata():
        return f"metadata {opened[0].metadata()} != {opened[1].metadata()}"
    if set(opened[0].keys()) != set(opened[1].keys()):
        return "tensor names differ"
    for name in opened[0].keys():  # noqa: SIM118 (a safetensors handle, not a dict)
        x, y = (f.get_tensor(name) for f in opened)
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return f"tensor {name!r} differs"
    return None


def _manifest_shape(path: Path) -> dict[str, Any]:
    """A manifest without its hashes: they cover files that hold paths and clocks (stores.json, a
    sweep's summary.json), so they differ between any two runs made in different places."""
    record = json.loads(path.read_text(encoding="utf-8"))
    return {
        key: sorted(value) if key in {"inputs", "outputs"} else value
        for key, value in _without_clocks(record).items()
        if key != "fingerprint"
    }


def difference(a: Path, b: Path, aliases: list[tuple[str, str]]) -> str | None:
    """Why file `a` (the run before) and `b` (after) differ, or None when they agree."""
    suffix = a.suffix.lower()
    if suffix == ".parquet":
        return _same_parquet(a, b)
    if suffix == ".safetensors":  # the header's metadata comes in any order: compare what it holds
        return _same_safetensors(a, b)
    if a.parent.name == "manifests":
        return None if _manifest_shape(a) == _manifest_shape(b) else "stage, status or file names differ"
    if suffix in {".json", ".jsonl"}:
        texts = [_text(a, []), _text(b, aliases)]
        lines = [t.splitlines() if suffix == ".jsonl" else [t] for t in texts]
        values = [[_without_clocks(json.loads(line)) for line in part if line.strip()] for part in lines]
        return None if values[0] == values[1] else "values differ (clock fields left out)"
    if suffix in {".csv", ".md", ".toml", ".txt"}:
        return None if _text(a, []) == _text(b, aliases) else "text differs"
    return None if a.read_bytes() == b.read_bytes() else "bytes differ"


def compare(before: Path, after: Path, aliases: list[tuple[str, str]]) -> list[str]:
    """One line per disagreement between the two run folders; empty when they agree."""
    files = {
        side: {
            p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name not in SKIPPED
        }
        for side, root in (("before", before), ("after", after))
    }
    problems = [f"only before: {name}" for name in sorted(files["before"] - files["after"])]
    problems += [f"only after: {name}" for name in sorted(files["after"] - files["before"])]
    for name in sorted(files["before"] & files["after"]):
        why = difference(before / name, after / name, aliases)
        if why:
            problems.append(f"{name}: {why}")
    return problems


def _eval(code: Path, cache: Path, runs: Path, options: list[str]) -> Path:
    """`ctd eval` with the code in `code`, its caches copied from `cache`; returns the run folder."""
    copy = runs.parent / f"{runs.name}-cache"
    shutil.copytree(cache, copy)
    env = {
        **os.environ,
        "PYTHONPATH": str(code),
        "CTD_CACHE": str(copy / "experts.sqlite"),
        "CTD_STORE": str(copy / "activations"),
    }
    command = [sys.executable, "-m", "harness.cli", "eval", "--runs-dir", str(runs), "--json", *options]
    done = subprocess.run(command, env=env, cwd=code, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"ctd eval with {code} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    folders = [p for p in runs.iterdir() if p.is_dir()]
    if len(folders) != 1:
        sys.exit(f"expected one run folder in {runs}, found {len(folders)}")
    return folders[0]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folders", nargs="*", type=Path, help="BEFORE AFTER run folders")
    parser.add_argument(
        "--alias", action="append", default=[], help="OLD=NEW: a path of AFTER named as BEFORE has it"
    )
    parser.add_argument(
        "--rev", help="make both runs: BEFORE with this git revision's code, AFTER with this checkout's"
    )
    parser.add_argument(
        "--cache", type=Path, help="with --rev: a folder with experts.sqlite and activations/"
    )
    parser.add_argument(
        "--work", type=Path, help="with --rev: where the runs go (default: a temporary folder)"
    )
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, options = parser.parse_args(argv[:cut]), argv[cut + 1 :]  # after --: ctd eval's own
    aliases = [tuple(a.split("=", 1)) for a in args.alias]
    if args.rev:
        if args.cache is None:
            parser.error("--rev needs --cache")
        work = args.work or Path(tempfile.mkdtemp(prefix="compare-runs-"))
        old_code = work / "code-before"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(old_code), args.rev], check=True
        )
        try:
            before = _eval(old_code, args.cache, work / "before", options)
            after = _eval(REPO, args.cache, work / "after", options)
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(old_code)], check=False
            )
        aliases = [
            (str(work / "before-cache"), str(work / "after-cache")),
            (str(work / "before"), str(work / "after")),
        ]
    elif len(args.folders) == 2:
        before, after = args.folders
    else:
        parser.error("give BEFORE AFTER, or --rev REV --cache DIR")
    problems = compare(before, after, [(new, old) for old, new in aliases])
    for line in problems:
        print(line)
    count = sum(1 for p in before.rglob("*") if p.is_file() and p.name not in SKIPPED)
    print(f"{count} files of {before} compared with {after}: {len(problems) or 'no'} difference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
