"""Python's cyclic garbage collector out of `ctd eval`'s way (issue 25): torch and transformers are
imported with it paused, and what they loaded is frozen (`gc.freeze`). Collecting as usual, the
import made six full collections, each over every object made so far, and later ones and the
interpreter's exit scanned the 400,000 objects it left: with the rest of Python's work removed
alongside, about 3 s of a 2-core machine's `ctd eval` (`docs/benchmarks.md`).
Checked here by what the collector records, in a fresh interpreter; the seconds are the
benchmark's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

IMPORT_MODEL_STACK = """
import gc, json, sys
# Private: the eval's import of the model stack.
from harness._eval import _import_model_stack
enabled = gc.isenabled()
full = gc.get_stats()[2]["collections"]
_import_model_stack()
print(json.dumps({
    "full_collections": gc.get_stats()[2]["collections"] - full,
    "frozen": gc.get_freeze_count(),
    "enabled_before": enabled,
    "enabled_after": gc.isenabled(),
    "loaded": "transformers.modeling_utils" in sys.modules,
}))
"""


def run_python(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_the_model_stack_is_imported_with_the_collector_paused_then_frozen(tmp_path: Path) -> None:
    done = run_python(IMPORT_MODEL_STACK, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["loaded"]
    # One full collection: the one that clears what was garbage before the freeze. Collecting
    # as usual, the import alone made about six, each over every object made so far.
    assert seen["full_collections"] == 1, seen
    assert seen["frozen"] > 100_000, seen  # torch's and transformers' objects, out of later scans
    assert seen["enabled_before"] and seen["enabled_after"], seen


def test_a_second_import_and_a_failed_one_leave_the_collector_as_it_was(tmp_path: Path) -> None:
    """A process that has the model stack (a second `run_eval` in a notebook) is not frozen
    again; an import that fails raises, with the collector running again and nothing frozen."""
    done = run_python(
        IMPORT_MODEL_STACK + "_import_model_stack()\nprint(gc.get_freeze_count())\n", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    first, again = done.stdout.splitlines()[-2:]
    assert int(again) == json.loads(first)["frozen"]  # nothing more frozen, no collection forced

    broken = tmp_path / "broken" / "transformers"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("")
    (broken / "modeling_utils.py").write_text("raise ImportError('a broken install')\n")
    code = (
        "import gc, sys\n"
        f"sys.path.insert(0, {str(broken.parent)!r})\n"
        "# Private: the eval's import of the model stack.\n"
        "from harness._eval import _import_model_stack\n"
        "try:\n"
        "    _import_model_stack()\n"
        "except ImportError as error:\n"
        "    print(error, gc.isenabled(), gc.get_freeze_count())\n"
    )
    done = run_python(code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["a", "broken", "install", "True", "0"]
