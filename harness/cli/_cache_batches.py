"""`ctd cache release-batch`: forget that a batch file's requests are out (`ctd query --batch-out`
records them until `--batch-in` reads their results back), for a batch that was never submitted,
failed or expired, so that a later batch file or a live `ctd query` asks them again."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .._errors import InputError
from ._cache import cache_app, open_cache
from ._common import clean_errors, print_json, stdout
from ._expert_options import CacheOption, JsonOption

__all__: list[str] = []


@cache_app.command("release-batch")
@clean_errors
def cache_release_batch(
    batch: Annotated[
        Path,
        typer.Argument(
            help="The batch file `ctd query --batch-out` wrote (as `--batch-out` and `ctd query` name it).",
            show_default=False,
        ),
    ],
    cache: CacheOption = None,
    json_output: JsonOption = False,
) -> None:
    """Forget that the requests of a batch file are out, for a batch that was never submitted,
    failed or expired: a later `--batch-out` writes them again and a live `ctd query` asks them.
    Its results, should they come after all, still commit with `--batch-in`."""
    store = open_cache(cache)
    try:
        released = store.release_batch(str(batch.resolve()))
        out = store.batch_files_out() if not released else {}
    finally:
        store.close()
    if not released:
        listed = ", ".join(f"{file} ({n})" for file, n in sorted(out.items())) or "none"
        raise InputError(
            f"{batch}: no requests of this batch file ({batch.resolve()}) are out in the cache "
            f"{store.path}; the batch files with requests out there: {listed}"
        )
    if json_output:
        print_json({"cache": str(store.path), "batch": str(batch.resolve()), "released": released})
        return
    stdout.print(
        f"released {released} requests of {batch.resolve()}: they are asked again by the next "
        "--batch-out or live `ctd query`",
        markup=False,
        highlight=False,
    )
