"""A run's outputs on a full disk: every writer (tables, JSON, the text log) fails naming the file
it was writing, not only "No space left on device", and leaves no half-written file; the
command line turns that into one line and exit code 3, and keeps 2 for a missing input."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import typer
from full_disk import fill

# Private: the exit codes and the error wrapper the commands use.
from harness._errors import EXIT_ENVIRONMENT, EXIT_INPUT, EnvironmentFailure
from harness.cli._common import clean_errors
from harness.data import write_json, write_jsonl, write_table
from harness.run import Manifests, RunLayout

COLUMNS = {"id": np.array([f"ex{i}" for i in range(5000)]), "score": np.linspace(0, 1, 5000)}
WRITERS: dict[str, Callable[[Path], object]] = {
    "out.parquet": lambda path: write_table(path, COLUMNS),
    "out.csv": lambda path: write_table(path, COLUMNS),
    "run.json": lambda path: write_json(path, {"rows": list(range(5000))}),
    "ltt.jsonl": lambda path: write_jsonl(path, [{"row": i} for i in range(5000)]),
}


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_writer_on_a_full_disk_names_its_file_and_leaves_nothing(small_disk: Path, name: str) -> None:
    fill(small_disk)
    path = small_disk / "run" / name
    path.parent.mkdir()
    with pytest.raises(OSError) as caught:
        WRITERS[name](path)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
    assert list(path.parent.iterdir()) == []  # no temporary, no half-written table


def test_the_text_log_on_a_full_disk_names_itself(small_disk: Path) -> None:
    layout = RunLayout(small_disk / "run")
    layout.root.mkdir()
    fill(small_disk)
    with pytest.raises(OSError) as caught:
        Manifests(layout).log("x" * 10_000)  # the append fails at its write or its close
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(layout.text_log)


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (
            OSError(errno.ENOSPC, "No space left on device", "/d/out.csv"),
            EXIT_ENVIRONMENT,
            "/d/out.csv: No space",
        ),
        (
            OSError(errno.EROFS, "Read-only file system", "/d/out.csv"),
            EXIT_ENVIRONMENT,
            "/d/out.csv: Read-only",
        ),
        (OSError(errno.EACCES, "Permission denied", "/d/x"), EXIT_ENVIRONMENT, "/d/x: Permission denied"),
        (OSError(errno.EIO, "Input/output error", "/d/x"), EXIT_ENVIRONMENT, "/d/x: Input/output error"),
        (OSError(errno.EDQUOT, "Disk quota exceeded", "/d/x"), EXIT_ENVIRONMENT, "/d/x: Disk quota exceeded"),
        (EnvironmentFailure("--out /d/x: no space left"), EXIT_ENVIRONMENT, "--out /d/x: no space left"),
        (
            FileNotFoundError(errno.ENOENT, "No such file or directory", "in.csv"),
            EXIT_INPUT,
            "in.csv: No such",
        ),
        (IsADirectoryError(errno.EISDIR, "Is a directory", "data"), EXIT_INPUT, "data: Is a directory"),
    ],
)
def test_the_exit_code_tells_the_machine_from_the_input(
    error: Exception, code: int, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    @clean_errors
    def command() -> None:
        raise error

    with pytest.raises(typer.Exit) as caught:
        command()
    assert caught.value.exit_code == code
    err = capsys.readouterr().err
    assert err.startswith(f"error: {line}") and err.count("\n") == 1, err
