"""Staging folders a killed writer leaves: the next writer with the same prefix removes them, never
one a live writer holds, and a stage's manifest never records what is inside one.

The writers are real processes, killed with SIGKILL (nothing of theirs runs after it)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import calibrate
from harness import calibrate_scores, simulate_scores, write_table
from harness.data import staging_folder
from harness.run import Manifests, RunLayout

_WRITER = """
import sys, time
from pathlib import Path
from harness.data import staging_folder
with staging_folder(Path(sys.argv[1]), ".sweep.") as folder:
    (folder / "decisions.parquet").write_bytes(b"x" * 4096)
    print(folder, flush=True)
    time.sleep(120)
"""


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A writer process inside its staging folder (under tmp_path/out), and that folder."""
    process = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path / "out")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        folder = Path(process.stdout.readline().strip())
        assert (folder / "decisions.parquet").is_file()
        yield process, folder
    finally:
        process.kill()
        process.wait()


def test_a_live_writers_folder_is_kept_and_a_killed_ones_removed(
    writer: tuple[subprocess.Popen[str], Path],
) -> None:
    process, theirs = writer
    with staging_folder(theirs.parent, ".sweep.") as ours:
        assert ours != theirs and ours.is_dir()
    assert theirs.is_dir() and not ours.exists()  # the live writer's is untouched; ours is gone
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert theirs.is_dir()  # nothing of the killed writer ran to remove it
    with staging_folder(theirs.parent, ".sweep.") as ours:
        assert not theirs.exists()
    with staging_folder(theirs.parent, ".report.") as other:  # another prefix: not its business
        (theirs.parent / ".sweep.kept").mkdir()
    assert (theirs.parent / ".sweep.kept").is_dir() and not other.exists()


def test_the_next_sweep_removes_a_killed_sweeps_staging(tmp_path: Path) -> None:
    scores = tmp_path / "scores.parquet"
    write_table(scores, simulate_scores("strong", 300, 1, n_dev=150))
    out = tmp_path / "out"
    left = out / ".sweep.killed"  # as a killed sweep leaves it: no process holds it
    left.mkdir(parents=True)
    (left / "decisions.parquet").write_bytes(b"x" * 4096)
    calibrate_scores(scores, out, calibrate.SweepConfig(budgets=(0.3,)))
    assert not left.exists()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


def test_a_manifest_records_nothing_inside_a_hidden_folder(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "run")
    sweep = layout.sweep("attention").root
    sweep.mkdir(parents=True)
    (sweep / "sweep.csv").write_text("a\n1\n")
    (sweep / ".sweep.killed").mkdir()
    (sweep / ".sweep.killed" / "sweep.csv").write_text("a\n2\n")
    (sweep / ".summary.json.x.tmp").write_text("{}")
    manifests = Manifests(layout)
    manifests.finish("calibrate", "f", {}, [layout.calibrate], {})
    recorded = manifests.read("calibrate")
    assert recorded is not None
    assert list(recorded["outputs"]) == [str((sweep / "sweep.csv").relative_to(layout.root))]
    (sweep / ".sweep.killed" / "sweep.csv").unlink()  # the next sweep removes it: nothing changed
    assert manifests.changed_outputs("calibrate") == []


def test_where_folders_cannot_be_locked_staging_goes_on_and_clears_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on NFS (flock of a folder: EBADF) or Lustre without -o flock (ENOSYS): the writer still
    gets its folder and removes it, and leaves every other folder alone (it cannot tell a dead
    writer's), with no descriptor left open."""
    # Private: the module's flock, made to fail as those file systems fail it.
    from harness.data import _staging

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))

    monkeypatch.setattr(_staging.fcntl, "flock", no_locks)
    other = tmp_path / ".sweep.other"
    other.mkdir()
    descriptors = len(os.listdir("/proc/self/fd"))
    with staging_folder(tmp_path, ".sweep.") as ours:
        (ours / "sweep.csv").write_text("a\n")
    assert not ours.exists() and other.is_dir()
    assert len(os.listdir("/proc/self/fd")) == descriptors


def test_a_folder_swapped_in_for_the_staged_one_is_left_alone(tmp_path: Path) -> None:
    """As a monitor bundle's install leaves it when the old bundle, exchanged to the staged path,
    cannot be renamed: on exit the writer removes its own folder, never what lies at its path."""
    old = tmp_path / "bundle"
    old.mkdir()
    (old / "bundle.json").write_text("{}")
    with staging_folder(tmp_path, ".bundle.partial-") as ours:
        (ours / "bundle.json").write_text('{"new": true}')
        os.rename(ours, tmp_path / "new")
        os.rename(old, ours)  # the old bundle at the staged path
    assert (ours / "bundle.json").read_text() == "{}"
    with staging_folder(tmp_path, ".sweep.") as renamed:
        os.rename(renamed, tmp_path / "published")  # renamed into place: nothing to remove
    assert (tmp_path / "published").is_dir()
