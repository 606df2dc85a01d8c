"""Where runs live: the runs root, the activation store and the expert cache that runs share, each
from an option, a `CTD_*` variable or its default under the runs root, read here and nowhere else."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from probes import MODEL_CACHE_ENV, model_cache_root

from .._errors import InputError
from ._layout import RunLayout

__all__ = ["CACHE_ENV", "RUNS_DIR_ENV", "STORE_ENV", "Roots", "check_roots"]

RUNS_DIR_ENV = "CTD_RUNS_DIR"  # the runs root (default ./runs)
STORE_ENV = "CTD_STORE"  # the activation store shared by runs (default RUNS/cache/activations)
CACHE_ENV = "CTD_CACHE"  # the expert cache shared by runs (default RUNS/cache/experts.sqlite)


@dataclass(frozen=True)
class Roots:
    """The three shared roots, with the `CTD_*` environment read once, here."""

    runs: Path
    store: Path
    cache: Path

    @classmethod
    def resolve(cls, runs: Path | None = None) -> Roots:
        """`runs` (a --runs-dir option) or $CTD_RUNS_DIR or ./runs; the activation store and the
        expert cache live under it unless $CTD_STORE or $CTD_CACHE say otherwise."""
        root = Path(runs) if runs is not None else Path(os.environ.get(RUNS_DIR_ENV) or "runs")
        store = os.environ.get(STORE_ENV)
        cache = os.environ.get(CACHE_ENV)
        return cls(
            runs=root,
            store=Path(store) if store else root / "cache" / "activations",
            cache=Path(cache) if cache else root / "cache" / "experts.sqlite",
        )

    def run(self, name: str) -> RunLayout:
        return RunLayout(self.runs / name)


def check_roots(runs: Path | None = None) -> None:
    """Every shared place a run uses, checked before any work and named as the user gave it (an
    option, a variable, or what it is by default): the runs root, the activation store and the
    model cache are folders, the expert cache a SQLite file ($CTD_CACHE names the file, not a
    folder: `ctd query --cache` and `ctd cache --cache` take the same file). Each is there as
    such, or can be made: no file stands where one of its folders would go. One InputError line
    otherwise."""
    roots = Roots.resolve(runs)
    runs_named = (
        f"--runs-dir {runs}" if runs is not None else _named(RUNS_DIR_ENV, roots.runs, "the runs folder")
    )
    folders = {
        runs_named: roots.runs,
        _named(STORE_ENV, roots.store, "the activation store"): roots.store,
        _named(MODEL_CACHE_ENV, model_cache_root(), "the model cache"): model_cache_root(),
    }
    for named, folder in folders.items():
        if folder.exists() and not folder.is_dir():
            raise InputError(f"{named}: is a file, where a folder is expected")
        _check_makeable(named, folder)
    cache_named = _named(CACHE_ENV, roots.cache, "the expert cache")
    if roots.cache.is_dir():
        raise InputError(
            f"{cache_named}: is a folder; the expert cache is a SQLite file: "
            f"for example {CACHE_ENV}={roots.cache / 'experts.sqlite'}"
        )
    _check_makeable(cache_named, roots.cache)


def _named(variable: str, path: Path, what: str) -> str:
    """A shared place as an error line names it: its variable when set, else what it is."""
    return f"{variable}={path}" if os.environ.get(variable) else f"{what} {path}"


def _check_makeable(named: str, path: Path) -> None:
    """A file where one of the folders above `path` would go: `path` can never be made."""
    existing = next((parent for parent in path.parents if parent.exists()), None)
    if existing is not None and not existing.is_dir():
        raise InputError(f"{named}: {existing} is a file, so nothing can be made under it")
