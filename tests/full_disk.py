"""Filling a small file system to its last byte, for the tests of what a full disk does."""

from __future__ import annotations

from pathlib import Path


def fill(folder: Path) -> None:
    """Fill the file system under `folder` to the last byte (unbuffered: nothing is left for
    the close to fail on)."""
    with (folder / "filler").open("wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass
