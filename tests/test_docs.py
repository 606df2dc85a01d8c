"""The docs: the site builds with no warning, the CLI reference is what `--help` prints, every
relative link of the README leads somewhere, and the README's test command is the one CI runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

# Private: the generator of the CLI reference.
from harness.cli._reference import REFERENCE_FILE, command_helps, render_reference

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def test_the_site_builds_without_a_warning(tmp_path: Path):
    # --strict turns every warning (a broken link or anchor, a page left out of the nav, an API
    # name mkdocstrings cannot find) into a failure. mkdocs is a dependency of the test extra:
    # its absence fails here rather than skipping.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()


def test_the_committed_cli_reference_is_current():
    assert REFERENCE_FILE.read_text(encoding="utf-8") == render_reference(), (
        f"{REFERENCE_FILE.relative_to(REPO)} is out of date: run python -m harness.cli._reference"
    )


# Every command's --help through the real entry point (`ctd`, sys.argv[0] as the console script
# sets it), in one interpreter rather than one per command (about a second each).
_PRINT_HELPS = """
import contextlib, io, json, sys
from harness.cli import main
helps = {}
for path in json.loads(sys.argv[1]):
    sys.argv = [*path.split(), "--help"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main()
        except SystemExit as exit:
            assert exit.code in (0, None), (path, exit.code)
    helps[path] = out.getvalue()
print(json.dumps(helps))
"""


def test_the_cli_reference_is_what_help_prints():
    generated = dict(command_helps())
    proc = subprocess.run(
        [sys.executable, "-c", _PRINT_HELPS, json.dumps(list(generated))],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "120"},  # a terminal wider than click's 80-column cap
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert len(generated) > 20  # every command and group, not just the top
    for path, text in generated.items():
        assert printed[path].rstrip() == text.rstrip(), path


def _slug(heading: str) -> str:
    """The anchor GitHub and mkdocs give a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_the_readme_links_resolve():
    text = README.read_text(encoding="utf-8")
    anchors = {_slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert targets, "the README links to nothing"
    for target in targets:
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        if not path:
            assert anchor in anchors, f"README: no heading for #{anchor}"
            continue
        assert (REPO / path).exists(), f"README links to {path}, which does not exist"


def test_the_readme_test_command_is_the_one_ci_runs():
    # .ci/run says it runs exactly the README's test command: the last line of the README's
    # block under "## Tests" is the command .ci/run ends with.
    tests_section = README.read_text(encoding="utf-8").split("\n## Tests\n", 1)[1]
    block = tests_section.split("```bash\n", 1)[1].split("```", 1)[0]
    readme_command = block.strip().splitlines()[-1]
    ci_command = (REPO / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert ci_command == readme_command
