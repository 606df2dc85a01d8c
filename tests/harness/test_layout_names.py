"""Every file name of a run folder is spelled in one place, `harness/run/_layout.py`: the names are
collected from the layout objects themselves (so the list cannot drift), and the source outside
tests is searched for them as string literals (docstrings and comments say what a file holds and
are left out)."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

from harness.run import ReportLayout, RunLayout

# Private: the report's table names, which only the layout spells.
from harness.run._layout import ReportTable

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("harness", "calibrate", "experts", "probes")
LAYOUT = Path("harness/run/_layout.py")
_PLACEHOLDER = "PLACEHOLDER"  # an argument of a path method: a name holding it is a pattern


def _paths(layout: object) -> Iterator[Path]:
    """Every path a layout object hands out, and those of the layout objects it hands out; a
    method is called with placeholders (a report table with each name it takes)."""
    for name, member in inspect.getmembers(type(layout)):
        if name.startswith("_") or name in ("root", "name"):
            continue
        if isinstance(member, property):
            values = [getattr(layout, name)]
        elif inspect.isfunction(member):
            parameters = list(inspect.signature(member).parameters)[1:]
            if isinstance(layout, ReportLayout) and name == "table":
                values = [layout.table(_PLACEHOLDER, table) for table in get_args(ReportTable)]
            elif name == "relative":
                continue
            else:
                values = [member(layout, *([_PLACEHOLDER] * len(parameters)))]
        else:
            continue
        for value in values:
            found = value if isinstance(value, tuple) else (value,)
            for item in found:
                if isinstance(item, Path):
                    yield item
                else:
                    yield from _paths(item)


def run_folder_names() -> set[str]:
    """The file names (with a suffix, no placeholder) of a run folder, its report and a bundle."""
    layout = RunLayout(Path("runs", "NAME"))
    return {
        path.name
        for path in [*_paths(layout), *_paths(layout.bundle("BUNDLE"))]
        if path.suffix and _PLACEHOLDER not in path.name
    }


def spellings(names: set[str], root: Path) -> dict[str, list[str]]:
    """name -> the files under `root` (relative, one entry per literal) whose string literals spell
    it as a whole name; bare string statements (docstrings) are not counted."""
    patterns = {name: re.compile(rf"(?<![\w.-]){re.escape(name)}(?![\w-])") for name in names}
    found: dict[str, list[str]] = {name: [] for name in names}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docs = {
                id(node.value)
                for node in ast.walk(tree)
                if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            }
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                    for name, pattern in patterns.items():
                        if pattern.search(node.value):
                            found[name].append(str(path.relative_to(root)))
    return found


def test_the_names_are_collected_from_every_layout() -> None:
    names = run_folder_names()
    expected = {"config.toml", "sweep.csv", "ltt.jsonl", "probe_metrics.json", "failed.csv"}
    expected |= {"report.md", "summary.csv", "curves.csv", "case-studies.csv", "bundle.json"}
    assert expected <= names, sorted(expected - names)


def test_every_run_folder_name_is_spelled_once_in_the_layout_module() -> None:
    found = spellings(run_folder_names(), REPO)
    elsewhere = {name: files for name, files in found.items() if files not in ([], [str(LAYOUT)])}
    assert not elsewhere, "file names spelled outside harness/run/_layout.py, or twice in it:\n" + "\n".join(
        f"{name}: {files}" for name, files in sorted(elsewhere.items())
    )
    # Most names are spelled there literally; the report's tables are composed from `ReportTable`.
    assert sum(files == [str(LAYOUT)] for files in found.values()) >= 20


def test_the_check_sees_a_stray_name(tmp_path: Path) -> None:
    """A name spelled in a message or a path is found; one in a docstring, or inside another
    name, is not."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "harness" / "_stray.py").write_text(
        '"""Reads sweep.csv."""\n'
        'TABLE = "sweep.csv"\n'
        'def f(folder):\n    """sweep.csv, again."""\n    return f"{folder}/groups.csv is missing"\n'
    )
    (tmp_path / "probes" / "_other.py").write_text('NAME = "my_sweep.csv"\nOTHER = "old-groups.csv"\n')
    found = spellings({"sweep.csv", "groups.csv"}, tmp_path)
    assert found == {"sweep.csv": ["harness/_stray.py"], "groups.csv": ["harness/_stray.py"]}
