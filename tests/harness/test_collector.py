"""Python's cyclic garbage collector out of `ctd eval`'s way (issue 25): torch and transformers are
imported with it paused, and what they loaded is frozen (`gc.freeze`). Collecting as usual, the
import made six full collections, each over every object made so far, and later ones scanned the
400,000 objects it left: about 0.9 s of a 2-core machine's `ctd eval` (`docs/benchmarks.md`).
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
