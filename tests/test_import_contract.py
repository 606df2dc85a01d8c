"""The import contract, read from the source (no imports run): `calibrate`, `experts` and `probes`
import nothing of each other or of `harness`; inside `harness` each room imports only the rooms
below it, and only through their faces (`from ..run import RunLayout`, never `..run._layout`);
a test imports the faces, and a test of an internal (a private module) says why in a
`# Private: ...` comment directly above the import. A lazy import inside a function counts like any
other: it is a dependency all the same. (Importing a face never costs more than importing one of
its private modules, which runs the face first; the lazy faces load a module with the first name
taken from it.)
"""

from __future__ import annotations

import ast
import re
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
    "harness._workers",
    "harness._worker",  # the worker process's entry point: imports the pool's messages
    "harness.data",
    "harness.expert",
    "harness.run",
    "harness.report",
    "harness.stages",
    "harness.monitor",
    "harness.score",
    "harness.export",
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


def _is_module(repo: Path, module: list[str]) -> bool:
    """Whether `module` names a module or package of `repo` (not a name defined in one)."""
    where = repo.joinpath(*module)
    return where.is_dir() or where.with_suffix(".py").is_file()


def _private(module: list[str]) -> bool:
    """Whether `module` is a private module: below its unit's face (`harness.run._layout`,
    `probes._model`), or a one-module room of harness (`harness._eval`) seen from outside harness."""
    return any(part.startswith("_") for part in module[1:])


def _below_face(module: list[str]) -> bool:
    """Whether `module` is a private module of its unit, below the face another room imports."""
    return any(part.startswith("_") for part in module[len(_room(module).split(".")) :])


def module_imports(root: Path, repo: Path = REPO) -> Iterator[tuple[Path, str, list[str], ast.stmt]]:
    """(file, its room, the module it imports, the import statement) for every import of this
    project's packages under `root`, a folder of `repo` (a test file's room is "tests"). A name
    imported from a package that is one of its modules (`from harness.stages import _query`)
    counts as that module."""
    ours = {*LIBRARIES, "harness"}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(repo).with_suffix("").parts)
        if parts[-1] == "__init__":  # a package's face: its package is its own folder
            parts = parts[:-1]
            package = parts
        else:
            package = parts[:-1]
        source = _room(parts) if parts[0] in ours else "tests"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name.split(".") for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = base + (node.module.split(".") if node.module else [])
                submodules = [[*module, a.name] for a in node.names if _is_module(repo, [*module, a.name])]
                targets = submodules if len(submodules) == len(node.names) else [module, *submodules]
            else:
                continue
            for target in targets:
                if target and target[0] in ours:
                    yield path, source, target, node


def imports(root: Path, repo: Path = REPO) -> Iterator[tuple[Path, str, str]]:
    """(file, its room, the room it imports) for every import of this project's packages under
    `root`, a package folder of `repo`, from one room to another."""
    for path, source, target, _ in module_imports(root, repo):
        if _room(target) != source:
            yield path, source, _room(target)


def private_imports(root: Path, repo: Path = REPO) -> set[tuple[str, int, str]]:
    """(file, line, module) for every import under `root` of another room's private module,
    where the room's face should be imported instead."""
    return {
        (str(path.relative_to(repo)), node.lineno, ".".join(target))
        for path, source, target, node in module_imports(root, repo)
        if source != "tests" and _room(target) != source and _below_face(target)
    }


_WHY = re.compile(r"\s*# Private: \S")


def unexplained_private_imports(root: Path, repo: Path = REPO) -> set[tuple[str, int, str]]:
    """(file, line, module) for every import in the test files under `root` of a private module
    without a `# Private: why` comment directly above it (one comment may head a run of such
    imports, one after the other)."""
    found = set()
    by_file: dict[Path, list[tuple[list[str], ast.stmt]]] = {}
    for path, _, target, node in module_imports(root, repo):
        by_file.setdefault(path, []).append((target, node))
    for path, found_imports in by_file.items():
        lines = path.read_text(encoding="utf-8").splitlines()
        private_lines = {
            line
            for target, node in found_imports
            if _private(target)
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)
        }
        for target, node in found_imports:
            if not _private(target):
                continue
            above = node.lineno - 1
            while above in private_lines:  # another private import, under the same comment
                above -= 1
            if above < 1 or not _WHY.match(lines[above - 1]):
                found.add((str(path.relative_to(repo)), node.lineno, ".".join(target)))
    return found


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


@pytest.mark.parametrize("package", [*LIBRARIES, "harness"])
def test_each_room_imports_the_others_through_their_faces(package: str) -> None:
    found = private_imports(REPO / package)
    assert not found, "imports of another room's private module, not its face (file, line, module):\n" + (
        "\n".join(map(str, sorted(found)))
    )


def test_a_test_of_an_internal_says_why() -> None:
    found = unexplained_private_imports(REPO / "tests")
    assert not found, (
        "a test imports the faces; one importing a private module needs a `# Private: why` comment "
        "directly above the import (file, line, module):\n" + "\n".join(map(str, sorted(found)))
    )


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


def test_the_check_sees_planted_private_imports(tmp_path: Path) -> None:
    """Planted: a harness room importing another's private module (at the top, lazily inside a
    function, and as a name of the package), and a library importing another's; a room's own
    private modules and another room's face are fine."""
    for folder in ("harness/run", "harness/stages", "harness/cli", "probes", "experts"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "harness" / "run" / "_layout.py").write_text("")
    (tmp_path / "harness" / "stages" / "_probe.py").write_text(
        "from ..run._layout import RunLayout\nfrom ..run import RunConfig\nfrom ._dv import DVStage\n"
    )
    (tmp_path / "harness" / "cli" / "_eval.py").write_text(
        "def f():\n    from ..run import _layout\n    return _layout\n"
    )
    (tmp_path / "probes" / "_model.py").write_text("")
    (tmp_path / "experts" / "_client.py").write_text("from probes._model import load_model\n")
    assert private_imports(tmp_path / "harness", tmp_path) == {
        ("harness/stages/_probe.py", 1, "harness.run._layout"),
        ("harness/cli/_eval.py", 2, "harness.run._layout"),
    }
    assert private_imports(tmp_path / "experts", tmp_path) == {("experts/_client.py", 1, "probes._model")}


def test_the_check_sees_a_private_import_without_its_reason(tmp_path: Path) -> None:
    (tmp_path / "probes").mkdir()
    (tmp_path / "probes" / "_model.py").write_text("")
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_explained.py").write_text(
        "from probes import load_model\n"
        "# Private: the legacy identity is read nowhere else.\n"
        "from probes._model import legacy\n"
        "from probes import _model\n"
    )
    (tests / "test_unexplained.py").write_text(
        "# a comment that says nothing of why\nfrom probes._model import legacy\n\n\n"
        "def test_x():\n    import probes._model\n"
    )
    assert unexplained_private_imports(tests, tmp_path) == {
        ("tests/test_unexplained.py", 2, "probes._model"),
        ("tests/test_unexplained.py", 6, "probes._model"),
    }
