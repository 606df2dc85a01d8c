"""`ctd cache merge|import`: answers from other machines' caches, or from exported files, brought
into this cache by key (`experts.merge_caches`, `experts.import_answers`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

import experts

from ..run import Roots
from ._cache import cache_app
from ._common import clean_errors, print_json, stdout
from ._expert_options import CacheOption, JsonOption

if TYPE_CHECKING:
    from experts import MergeReport

__all__: list[str] = []

CONFLICTS_SHOWN = 10
"""Conflicts `ctd cache merge` names one per line on the terminal (--json lists them all)."""


@cache_app.command("merge")
@clean_errors
def cache_merge(
    others: Annotated[
        list[Path], typer.Argument(help="Other machines' caches (.sqlite), merged in the order given.")
    ],
    cache: CacheOption = None,
    json_output: JsonOption = False,
) -> None:
    """Bring the scored answers of other caches into this one (created if missing). A key new
    here is copied as stored there; a key stored here with the same score is a duplicate; with
    another score it is a conflict, and this cache's answer is kept (the report says by how much
    and why). Recorded failures are not answers: counted, not merged; requests out in a batch
    file there are named, not recorded here. Every source is checked first (exists, not this
    cache, a sound ctd cache of this version); rerunning finishes an interrupted merge."""
    path = cache or Roots.resolve().cache
    experts.check_merge_sources(path, others)  # before the target is created or written
    store = experts.ScoreCache.for_run(path)
    try:
        reports = experts.merge_caches(store, others)
    finally:
        store.close()
    _print_merge(path, reports, json_output)


@cache_app.command("import")
@clean_errors
def cache_import(
    files: Annotated[
        list[Path], typer.Argument(help="Answers as `ctd cache export --out FILE.jsonl` writes them.")
    ],
    cache: CacheOption = None,
    json_output: JsonOption = False,
) -> None:
    """Read exported answers (.jsonl) into this cache (created if missing), as `ctd cache merge`
    does with a cache: every line is checked first, and a malformed one (FILE:LINE) stops the
    import before anything is added."""
    path = cache or Roots.resolve().cache
    _print_merge(path, experts.import_answers(path, files), json_output)


def _print_merge(path: Path, reports: list[MergeReport], json_output: bool) -> None:
    if json_output:
        print_json({"cache": str(path), "sources": [report.to_dict() for report in reports]})
        return
    for report in reports:
        stdout.print(
            f"{report.source}: {report.answers} answers: {report.added} new, {report.duplicates} already "
            f"here, {report.conflicts} in conflict (this cache's answer kept); "
            f"{report.failures} recorded failures not merged",
            highlight=False,
            markup=False,  # a path may hold [brackets]
        )
        if report.out_there:
            files = ", ".join(f"{file} ({n})" for file, n in report.out_there.items())
            stdout.print(
                f"  {sum(report.out_there.values())} requests are out in batch files there, not read back "
                f"yet: {files}; a run here would ask again (and pay for) those it has no answer for: "
                "merge again after their --batch-in there",
                highlight=False,
                markup=False,
            )
        if report.claimed:
            stdout.print(
                f"  {report.claimed} of the new answers are for items a running query is asking about "
                "(its claims stay; its commit will find them answered)",
                highlight=False,
            )
        for conflict in report.listed[:CONFLICTS_SHOWN]:
            stdout.print(
                f"  conflict: {conflict.expert} item {conflict.item_id} key {conflict.key[:16]}: "
                + conflict.reason,
                highlight=False,
                markup=False,
            )
        if report.conflicts > CONFLICTS_SHOWN:
            stdout.print(f"  ... {report.conflicts - CONFLICTS_SHOWN} more conflicts (--json lists them)")
    stdout.print(f"merged into {path}", highlight=False, markup=False)
