"""The import contract, read from the source (no imports run): `calibrate`, `experts` and `probes`
import nothing of each other or of `harness`; inside `harness` each room imports only the rooms
below it. A lazy import inside a function counts like any other: it is a dependency all the same.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIBRARIES = ("calibrate", "experts", "probes")
# harness's rooms from the bottom up: each may import the libraries and the rooms before it.
ROOMS = (
    "harness._errors",
    "harness._bounds",
    "harness._lazy",
    "harness._signals",
    "harness.data",
    "harness.expert",
    "harness.run",
    "harness.report",
    "harness.stages",
    "harness.monitor",
    "harness._eval",
    "harness.cli",
)
# Known breaches, each with its way out; the test fails when one is gone, so the list shrinks.
KNOWN: set[tuple[str, str]] = set()


def _room(module: list[str]) -> str:
    """The unit a module belongs to: a library, or one of harness's rooms."""
    if module[0] != "harness" or len(module) == 1:
        return module[0]
    return ".".join(module[:2])


def imports(root: Path, repo: Path = REPO) -> Iterator[tuple[Path, str, str]]:
    """(file, its room, the room it imports) for every import of this project's packages under
    `root`, a package folder of `repo`."""
    ours = {*LIBRARIES, "harness"}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(repo).with_suffix("").parts)
        if parts[-1] == "__init__":  # a package's face: its package is its own folder
            parts = parts[:-1]
            package = parts
        else:
            package = parts[:-1]
        source = _room(parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name.split(".") for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                targets = [base + (node.module.split(".") if node.module else [])]
            else:
                continue
            for target in targets:
                if target and target[0] in ours and _room(target) != source:
                    yield path, source, _room(target)


def breaches(root: Path, repo: Path = REPO) -> set[tuple[str, str, str]]:
    """Every import against the contract under `root`: (file, from room, to room)."""
    found = set()
    for path, source, target in imports(root, repo):
        if source in LIBRARIES:
            allowed = False  # a library imports no other package of this project
        elif source == "harness":
            allowed = True  # the face lists the names of every room
        else:
            allowed = target in LIBRARIES or ROOMS.index(target) < ROOMS.index(source)
        if not allowed:
            found.add((str(path.relative_to(repo)), source, target))
    return found


@pytest.mark.parametrize("package", [*LIBRARIES, "harness"])
def test_each_package_imports_only_what_the_contract_allows(package: str) -> None:
    unknown = {b for b in breaches(REPO / package) if (b[1], b[2]) not in KNOWN}
    assert not unknown, "imports against the contract (file, from, to):\n" + "\n".join(
        map(str, sorted(unknown))
    )


def test_every_room_is_listed_and_every_known_breach_still_exists() -> None:
    rooms = {source for _, source, _ in imports(REPO / "harness")}
    assert rooms - {"harness"} <= set(ROOMS), "a new room of harness must take its place in ROOMS"
    seen = {(source, target) for _, source, target in imports(REPO / "harness")}
    assert seen >= KNOWN, f"fixed, so take it off KNOWN: {sorted(KNOWN - seen)}"


def test_the_check_sees_planted_breaches(tmp_path: Path) -> None:
    """Planted in a stand-in `calibrate` (a lazy import inside a function, a relative import of a
    sibling) and a stand-in harness room importing one above it: each is found."""
    copy = tmp_path / "calibrate"
    copy.mkdir()
    (copy / "_planted.py").write_text(
        "def f():\n    from harness.run import RunConfig\n    return RunConfig\n"
    )
    (copy / "_relative.py").write_text("from ..probes import ARCHS\n")
    assert {(b[1], b[2]) for b in breaches(copy, tmp_path)} == {
        ("calibrate", "harness.run"),
        ("calibrate", "probes"),
    }
    room = tmp_path / "harness" / "data"
    room.mkdir(parents=True)
    (room / "_up.py").write_text("from ..stages import ProbeStage\nfrom ...experts import ExpertSpec\n")
    assert {(b[1], b[2]) for b in breaches(tmp_path / "harness", tmp_path)} == {
        ("harness.data", "harness.stages")
    }
