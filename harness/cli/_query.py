"""`ctd query`: score a data set with an expert."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .._errors import MAX_FAILED, InputError, check_cost_limit, check_max_failed
from ..expert import resolve_expert
from ..run import StageProgress
from ._common import clean_errors, print_json, stdout
from ._expert_options import (
    CacheOption,
    CostLimitOption,
    ExpertModelOption,
    ExpertOption,
    ExpertUrlOption,
    JsonOption,
    MethodOption,
)

if TYPE_CHECKING:
    from experts import ExpertSpec

    from ..stages import QuerySummary

__all__ = ["register"]


@clean_errors
def query_command(
    *,
    data: Annotated[Path, typer.Option("--data", help="A dataset file (McKenzie et al. JSONL or CSV).")],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Output table (.parquet, or .csv), aligned with --data."),
    ] = None,
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
    cost_limit: CostLimitOption = None,
    batch_out: Annotated[
        Path | None,
        typer.Option(
            "--batch-out",
            help="Send nothing: write the uncached requests as an OpenAI batch file (.jsonl).",
        ),
    ] = None,
    batch_in: Annotated[
        list[Path] | None,
        typer.Option(
            "--batch-in",
            help="Send nothing: commit a batch's results (.jsonl, repeatable) and write --out.",
        ),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Score every example of a dataset with an expert LLM (async, rate-limited, cached).

    Rerunning resumes: examples whose score is in the cache send no request. Failures after the
    retries are recorded with their reason and listed at the end; they are retried next time.
    A run that goes to its end writes the table, failures included, and exits 0, or 1 when more
    than --max-failed of the examples failed (a revoked key, a broken endpoint). A run stopped
    early writes no table (its answers are in the cache): 1 when the endpoint went down, 3 when
    the machine failed it (a full disk), 4 at --cost-limit. Bad input is 2, before anything is sent.

    --batch-out and --batch-in run the same requests as a batch (`vllm run-batch`, a provider's
    Batch API): the first writes them, the second commits their results to the cache.
    """
    # The expert engine (sqlmodel, aiohttp) loads when a command runs, not on --help
    from ..stages import query_dataset

    check_max_failed(max_failed)
    check_cost_limit(cost_limit)
    spec = resolve_expert(expert, expert_url, expert_model, method).spec
    if (batch_out is not None or batch_in) and cost_limit is not None:
        raise InputError("--cost-limit with --batch-out or --batch-in: a batch sends nothing from here")
    if batch_out is not None or batch_in:
        _batch(data, spec, out, cache, batch_out, batch_in or [], max_failed, json_output)
        return
    if out is None:
        raise InputError("--out is required: the table to write (.parquet or .csv)")
    try:
        with StageProgress(enabled=not json_output) as progress:
            summary = query_dataset(
                data, spec, out, cache_path=cache, check=check, progress=progress, cost_limit=cost_limit
            )
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
        f"in {summary.seconds:.1f} s; spent ${summary.cost_usd:.4f}; wrote {summary.out}"
    )
    for reason, count in sorted(summary.failure_reasons.items()):
        stdout.print(f"  failed: {count} x {reason} (they are retried on the next run)")


def _batch(
    data: Path,
    spec: ExpertSpec,
    out: Path | None,
    cache: Path | None,
    batch_out: Path | None,
    batch_in: list[Path],
    max_failed: float,
    json_output: bool,
) -> None:
    """`--batch-out` (the requests, written) or `--batch-in` (the results, committed)."""
    from experts import pending_line

    from ..stages import batch_in as commit_batch
    from ..stages import batch_out as write_batch

    if batch_out is not None and batch_in:
        raise InputError("--batch-out and --batch-in: give one (write the requests, or read their results)")
    if batch_out is not None:
        if out is not None:
            raise InputError("--out with --batch-out: the batch holds requests, not a table; leave out --out")
        written = write_batch(data, spec, batch_out, cache_path=cache)
        if json_output:
            print_json(written.to_dict())
            return
        stdout.print(
            f"{written.total} examples: {written.cached} already in the cache, "
            f"{written.duplicates} duplicates of an earlier example; wrote {written.lines} request lines "
            f"for {written.written} examples (about {written.tokens:,} tokens) to {written.out}; "
            "nothing was sent"
        )
        if written.to_recover:
            stdout.print(
                f"left out {written.to_recover} requests answered before without label tokens: the same "
                "request in a batch gets the same answer; `ctd query` (live) tries the recovery ladder "
                "for them"
            )
        if written.pending:
            stdout.print(
                f"left out {written.pending} requests out in earlier batch files whose results no "
                f"--batch-in has read back: {pending_line(written.pending_files, written.cache)}",
                markup=False,
            )
        stdout.print(f"cost: {written.estimate}")
        return
    if out is None:
        raise InputError("--out is required with --batch-in: the table to write (.parquet or .csv)")
    summary = commit_batch(data, spec, batch_in, out, cache_path=cache)
    if json_output:
        print_json(summary.to_dict())
    else:
        stdout.print(
            f"{summary.lines} result lines for {summary.total} examples: {summary.committed} committed, "
            f"{summary.already} already in the cache (kept), {summary.failed} failed, "
            f"{summary.unmatched} lines matched no example (ignored); "
            f"{summary.missing} examples not in the batch; wrote {summary.out}"
        )
        for reason, count in sorted(summary.failure_reasons.items()):
            stdout.print(f"  failed: {count} x {reason} (a later run asks them again)")
        if summary.still_out:
            stdout.print(summary.still_out_line(), markup=False)
        if not spec.price.free:
            stdout.print(
                f"cost: about ${summary.usd:.4f} for the batch's answers at {spec.name}'s prices with the "
                "batch discount, from the usage they report"
            )
    summary.check_failures(max_failed)


def register(app: typer.Typer) -> None:
    app.command("query")(query_command)
