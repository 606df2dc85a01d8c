"""`ctd query`: score a data set with an expert."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .._errors import MAX_FAILED, check_max_failed
from ..expert import resolve_expert
from ..run import StageProgress
from ._common import clean_errors, print_json, stdout
from ._expert_options import (
    CacheOption,
    ExpertModelOption,
    ExpertOption,
    ExpertUrlOption,
    JsonOption,
    MethodOption,
)

if TYPE_CHECKING:
    from ..stages import QuerySummary

__all__ = ["register"]


@clean_errors
def query_command(
    *,
    data: Annotated[Path, typer.Option("--data", help="A dataset file (McKenzie et al. JSONL or CSV).")],
    out: Annotated[
        Path, typer.Option("--out", help="Output table (.parquet, or .csv), aligned with --data.")
    ],
    expert: ExpertOption = None,
    expert_url: ExpertUrlOption = None,
    expert_model: ExpertModelOption = None,
    method: MethodOption = None,
    cache: CacheOption = None,
    check: Annotated[bool, typer.Option("--check/--no-check", help="Probe the endpoint first.")] = True,
    max_failed: Annotated[
        float,
        typer.Option(
            "--max-failed",
            help=f"Exit with code 1 when more than this fraction of the examples failed [{MAX_FAILED:g}].",
        ),
    ] = MAX_FAILED,
    json_output: JsonOption = False,
) -> None:
    """Score every example of a dataset with an expert LLM (async, rate-limited, cached).

    Rerunning resumes: examples whose score is in the cache send no request. Failures after the
    retries are recorded with their reason and listed at the end; they are retried next time.
    The table is written either way; the exit code is 1 when more than --max-failed of the
    examples failed (a revoked key, a broken endpoint), 2 for bad input, else 0.
    """
    # The expert engine (sqlmodel, aiohttp) loads when a command runs, not on --help
    from ..stages import query_dataset

    check_max_failed(max_failed)
    spec = resolve_expert(expert, expert_url, expert_model, method).spec
    try:
        with StageProgress(enabled=not json_output) as progress:
            summary = query_dataset(data, spec, out, cache_path=cache, check=check, progress=progress)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM; the answers in flight were committed first
        print(
            "error: interrupted; the answers so far are cached: rerun the same command to resume",
            file=sys.stderr,
        )
        raise typer.Exit(code=130) from None
    if json_output:
        print_json(summary.to_dict())
    else:
        _print_summary(summary)
    summary.check_failures(max_failed)


def _print_summary(summary: QuerySummary) -> None:
    stdout.print(
        f"{summary.total} examples: {summary.cached} from the cache, {summary.scored} scored, "
        f"{summary.shared} shared with an identical example, "
        f"{summary.failed} failed ({summary.retries} retries, {summary.rate_limited} answers 429) "
        f"in {summary.seconds:.1f} s; wrote {summary.out}"
    )
    for reason, count in sorted(summary.failure_reasons.items()):
        stdout.print(f"  failed: {count} x {reason} (they are retried on the next run)")


def register(app: typer.Typer) -> None:
    app.command("query")(query_command)
