"""Hidden staging folders that a killed writer does not leave behind for good.

A writer builds its output in `PARENT/PREFIXxxxxxxxx/` and renames it, or the files in it, into
place. A writer killed outright (SIGKILL, the OOM killer, a lost node) cannot remove that folder,
and at scale it holds gigabytes (a sweep's decisions). So each staging folder is held under an
exclusive flock(2) for as long as its writer lives; the kernel drops the lock when the process
dies, however it dies. The next writer with the same prefix removes every folder whose lock it
can take, and none that a live writer holds. Creating (folder, then lock) and clearing happen
under a lock on the parent, so a cleaner never sees a new folder before its lock is taken.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .._errors import named
from ._tables import _umask

__all__ = ["staging_folder"]


@contextmanager
def staging_folder(parent: Path, prefix: str) -> Iterator[Path]:
    """Yield a new empty folder `parent/PREFIX*` (mode as a plain mkdir's), held for this process;
    remove folders of the same prefix left by dead writers first, and this one (if still there)
    on exit."""
    parent = Path(parent)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with _locked(parent):
            _remove_abandoned(parent, prefix)
            folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            held = _hold(folder)
    except OSError as exc:
        raise named(exc, parent) from None
    try:
        os.chmod(folder, 0o777 & ~_umask())  # mkdtemp makes it owner-only
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(held)  # after the removal: no cleaner may take a folder still being removed


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _hold(folder: Path) -> int:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new and unseen by cleaners: never contended
    return fd


def _remove_abandoned(parent: Path, prefix: str) -> None:
    for folder in parent.glob(f"{prefix}*"):
        if folder.is_symlink() or not folder.is_dir():
            continue
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue  # gone meanwhile, or not ours to open
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live writer's
        else:
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(fd)
