"""The README's install on a CPU-only machine: torch's CPU build first, then `pip install -e .`,
which keeps that torch and pulls in no CUDA build (no nvidia-*, cuda-*, triton or other torch).

pip resolves the project (`pip install --dry-run --report`) in a fresh venv that holds this
environment's CPU torch and the rest of the project's dependency tree, linked in rather than copied
(milliseconds, no disk). pip runs with no index and no configuration, so the resolve is offline and
the same on every machine: were the CPU torch not to satisfy a requirement somewhere in the tree,
pip would need another torch build, and with nothing to take it from it fails, naming it. The tree
is the versions this environment holds; a fresh venv may get newer ones from PyPI, where the
project's exact pin `torch==2.13.0` leaves pip no other torch to choose.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
# What a CPU-only install must never pull in: the CUDA runtime wheels and the GPU compiler that
# PyPI's default (CUDA) torch build requires.
CUDA_BUILD = re.compile(r"^(nvidia-.*|cuda-.*|triton)$")


def requirement_closure(roots: Iterable[str]) -> dict[str, md.Distribution]:
    """The installed distributions that `roots` (requirement strings) need, transitively, by
    canonical name. A requirement this environment has no distribution for is left to pip,
    whose resolve then fails naming it."""
    found: dict[str, md.Distribution] = {}
    seen: set[tuple[str, str]] = set()  # (name, extra): a distribution is reached with its extras
    pending = [(Requirement(text), "") for text in roots]
    while pending:
        requirement, parent_extra = pending.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": parent_extra}):
            continue
        name = canonicalize_name(requirement.name)
        try:
            dist = found.get(name) or md.distribution(name)
        except md.PackageNotFoundError:
            continue
        found[name] = dist
        for extra in {"", *requirement.extras} - {e for n, e in seen if n == name}:
            seen.add((name, extra))
            pending.extend((Requirement(text), extra) for text in dist.requires or ())
    return found


def extra_requirements(pyproject: dict, extra: str) -> list[str]:
    """The requirements of the project's extra `extra`, with the extras it takes from the project
    itself (`ctd-harness[docs]` in `test`) expanded from pyproject.toml: the ctd-harness installed
    in this environment may be another checkout, whose metadata lacks them."""
    project = canonicalize_name(pyproject["project"]["name"])
    requirements: list[str] = []
    for text in pyproject["project"]["optional-dependencies"][extra]:
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) == project:
            for own_extra in sorted(requirement.extras):
                requirements.extend(extra_requirements(pyproject, own_extra))
        else:
            requirements.append(text)
    return requirements


def link_into(dist: md.Distribution, site_packages: Path) -> None:
    """Link each top-level entry the distribution's RECORD names (its packages, modules and
    .dist-info folder) into `site_packages`, so that the venv holds it without a copy."""
    assert dist.files is not None, f"{dist.metadata['Name']} has no RECORD"
    for top in {file.parts[0] for file in dist.files}:
        # Console scripts (../../../bin/...) are not needed; __pycache__ is shared by modules.
        if top in ("..", "__pycache__"):
            continue
        target = site_packages / top
        if not target.exists():
            target.symlink_to(Path(dist.locate_file(top)))


def dry_run_install(project: Path, extras: str, venv: Path, tmp_path: Path) -> dict:
    """pip's report of `pip install --dry-run -e PROJECT[EXTRAS]` into `venv`, offline."""
    report = tmp_path / "report.json"
    # --isolated ignores PIP_* variables and the user's pip.conf; PIP_CONFIG_FILE=/dev/null the
    # global one: no find-links or extra index can hand pip a wheel. --no-build-isolation builds
    # the project's metadata with the venv's own setuptools instead of fetching one.
    command = [
        sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "--isolated",
        "install", "--dry-run", "--no-index", "--no-build-isolation", "--quiet",
        "--report", str(report), "-e", f"{project}{extras}",
    ]  # fmt: skip
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    # With no index, pip fails where it would otherwise download something (another torch build).
    assert proc.returncode == 0, f"pip needs a distribution the venv does not hold:\n{proc.stderr}"
    return json.loads(report.read_text())


def test_cpu_torch_kept_and_no_cuda_build(tmp_path: Path):
    # With the test, ray and inspect extras (what .ci/run installs): their tree holds the plain install's
    # (`pip install -e .`), and nothing is installed either way, so one resolve answers for both.
    torch = md.distribution("torch")
    if not torch.version.endswith("+cpu"):
        pytest.skip(f"this environment's torch is {torch.version}, not a CPU build (+cpu)")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    roots = [
        *pyproject["project"]["dependencies"],
        *pyproject["build-system"]["requires"],  # the build without isolation runs in the venv
        *extra_requirements(pyproject, "test"),
        *extra_requirements(pyproject, "ray"),  # .ci/run installs it for the Ray tests
        *extra_requirements(pyproject, "inspect"),  # and this one for the inspect export
    ]
    tree = requirement_closure(roots)
    assert "torch" in tree, "the project does not require torch"
    cuda = sorted(filter(CUDA_BUILD.match, tree))
    assert not cuda, f"the project's dependencies need {cuda}"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    vars_ = {"base": str(venv), "platbase": str(venv)}
    site_packages = Path(sysconfig.get_path("purelib", scheme="venv", vars=vars_))
    for dist in tree.values():
        link_into(dist, site_packages)
    # The metadata files alone, copied: setuptools writes its egg-info beside pyproject.toml.
    project = tmp_path / "ctd-harness"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, project / name)

    report = dry_run_install(project, "[test,ray,inspect]", venv, tmp_path)
    installs = {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]
    }
    # Nothing but the project itself: no nvidia-*, cuda-*, triton, and torch stays as it is.
    assert installs == {"ctd-harness": pyproject["project"]["version"]}, f"pip would install {installs}"
