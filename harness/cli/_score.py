"""`ctd score`: a bundle's cascade over files of conversations, as Parquet shards (harness.score)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from probes import BATCH_TOKENS, MAX_BATCH_TOKENS

from .._errors import MAX_FAILED, InputError, check_failed_fraction, check_max_failed
from ..run import Roots, StageProgress

# the lazy face: only the defaults load
from ..score import DEFAULT_ACTOR_THREADS, DEFAULT_MICRO_BATCH, DEFAULT_SHARD_ROWS
from ._common import clean_errors, print_also, print_json, stdout
from ._expert_options import JsonOption

if TYPE_CHECKING:
    from ..score import RayOptions, ScoreOptions, ScorePlan, ScoreSummary

__all__ = ["register"]


@clean_errors
def score_command(
    *,
    bundle: Annotated[
        Path, typer.Option("--bundle", help="A bundle folder written by `ctd monitor calibrate`.")
    ],
    data: Annotated[
        Path,
        typer.Option("--data", help="A JSONL, CSV or Parquet file of conversations, or a folder of them."),
    ],
    out: Annotated[
        Path, typer.Option("--out", help="Output folder: score.json and shard-NNNNN.parquet files.")
    ],
    shard_rows: Annotated[
        int, typer.Option("--shard-rows", help="Rows per output shard.")
    ] = DEFAULT_SHARD_ROWS,
    limit: Annotated[
        int | None, typer.Option("--limit", help="Score only the first N rows (to try the job).")
    ] = None,
    expert: Annotated[
        bool,
        typer.Option(
            "--expert/--no-expert",
            help="Ask the bundle's expert for the delegated rows (without it they keep the probe score).",
        ),
    ] = False,
    expert_url: Annotated[
        str | None, typer.Option("--expert-url", help="Ask the bundle's expert at this base URL instead.")
    ] = None,
    expert_cache: Annotated[
        Path | None,
        typer.Option(
            "--expert-cache",
            help="The expert cache, a SQLite file (default: $CTD_CACHE or runs/cache/experts.sqlite).",
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Another copy of the probes' model (same weights).")
    ] = None,
    micro_batch: Annotated[
        int,
        typer.Option(
            "--micro-batch", help="Conversations per forward-pass group (as `ctd monitor serve --max-batch`)."
        ),
    ] = DEFAULT_MICRO_BATCH,
    batch_tokens: Annotated[
        int,
        typer.Option(
            "--batch-tokens",
            help=f"Padded tokens in one forward pass at most (as `ctd monitor serve --batch-tokens`; "
            f"1 to {MAX_BATCH_TOKENS:,}).",
        ),
    ] = BATCH_TOKENS,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help=(
                "Score on Ray actors (needs pip install 'ctd-harness[ray]'): 'local' starts Ray on this "
                "machine; 'auto' or HOST:PORT joins a running Ray cluster (`ray start`)."
            ),
        ),
    ] = None,
    actors: Annotated[
        int | None,
        typer.Option(
            "--actors",
            help=(
                "With --ray: how many scoring actors (each loads the model once). Default: one per GPU "
                f"when the cluster has GPUs, else its CPUs // {DEFAULT_ACTOR_THREADS} (at least 1), "
                "each with its share of the CPUs as torch threads."
            ),
        ),
    ] = None,
    max_failed: Annotated[
        float | None,
        typer.Option(
            "--max-failed",
            help=(
                "With --expert: exit with code 1 when more than this fraction of the delegated rows "
                f"got no expert score [{MAX_FAILED:g}] (their shards are scored again by a rerun)."
            ),
            show_default=False,
        ),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Score conversations in bulk with a monitor bundle: probe, DV, delegation, (optionally) the
    expert, merged score and label per row, written as Parquet shards under --out.

    Rerunning the same command resumes: shards already written are skipped. Bad input (a missing
    bundle, no rows, another job in --out) is one line and exit code 2, before anything is written.
    """
    from ..score import ScoreOptions, plan_score

    on_ray = _ray_options(ray, actors)
    if max_failed is not None and not expert:
        raise InputError(f"--max-failed {max_failed:g}: only with --expert (without it no expert is asked)")
    failed_limit = MAX_FAILED if max_failed is None else max_failed
    check_max_failed(failed_limit)
    if expert_url is not None and not expert:
        from experts import redact_url

        raise InputError(
            f"--expert-url {redact_url(expert_url)}: only with --expert (without it no expert is asked)"
        )
    if expert_cache is not None and not expert:
        raise InputError(f"--expert-cache {expert_cache}: only with --expert (without it no expert is asked)")
    # Absolute: Ray actors on other machines start in other working directories.
    options = ScoreOptions(
        bundle=bundle.absolute(),
        out=out.absolute(),
        expert=expert,
        expert_url=expert_url,
        expert_cache=(expert_cache or Roots.resolve().cache).absolute() if expert else None,
        model=model,
        micro_batch=micro_batch,
        batch_tokens=batch_tokens,
    )
    options.check()
    if expert:  # a URL or a cache that cannot work is one line now, before anything is written
        from experts import ScoreCache

        from ..monitor import read_bundle

        read_bundle(bundle).expert_spec(expert_url)
        assert options.expert_cache is not None
        ScoreCache.for_run(options.expert_cache).close()
    plan = plan_score(options, data, shard_rows=shard_rows, limit=limit)
    try:
        with plan.held():  # a second job on --out is refused before the display starts
            summary = _run(plan, options, on_ray, json_output=json_output)
    except (
        KeyboardInterrupt
    ) as stop:  # Ctrl-C or SIGTERM: the shards written stay, the one in work is dropped
        print_also(stop)
        print(
            "error: interrupted; the shards written are kept: rerun the same command to resume",
            file=sys.stderr,
        )
        raise typer.Exit(code=130) from None
    if json_output:
        print_json(summary.to_dict())
    else:
        stdout.print(summary.line(), markup=False, highlight=False)
    if expert:
        after_batch = " (those out in a batch file after its ctd query --batch-in)"
        check_failed_fraction(
            summary.expert_failed,
            summary.delegated,
            failed_limit,
            what="delegated rows without an expert score",
            remedy="their rows say why (reason); rerun the same command to ask them again"
            + (after_batch if summary.expert_in_batch else ""),
        )


def _ray_options(address: str | None, actors: int | None) -> RayOptions | None:
    """--ray/--actors checked before anything is planned or written (Ray installed included)."""
    if address is None:
        if actors is not None:
            raise InputError(f"--actors {actors}: only with --ray (without it one process scores)")
        return None
    from ..score import RayOptions, check_ray_address, check_ray_installed

    options = RayOptions(address=address, actors=actors)
    check_ray_installed()
    check_ray_address(address)
    return options


def _run(
    plan: ScorePlan, options: ScoreOptions, on_ray: RayOptions | None, *, json_output: bool
) -> ScoreSummary:
    """The plan's pending shards scored here, or on Ray actors with --ray."""
    from ..score import score_local, score_ray

    with StageProgress(enabled=not json_output) as progress:
        progress.step(f"scoring {plan.rows:,} rows in {len(plan.shards)} shards")
        if on_ray is None:
            return score_local(plan, options, progress=progress)
        # What the pool is and where Ray's logs are, as a line of its own (a failure names them too).
        return score_ray(
            plan, options, on_ray, progress=progress, on_start=lambda line: progress.print(escape(line))
        )


def register(app: typer.Typer) -> None:
    app.command("score")(score_command)
