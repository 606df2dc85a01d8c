"""The options that name an expert and the cache, shared by `ctd query`, `ctd experts` and `ctd cache`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from experts import ScoringMethod

ExpertOption = Annotated[
    str | None,
    typer.Option(
        "--expert", help="A registered expert (see `ctd experts list`), or a base URL with --expert-model."
    ),
]
CachedExpertOption = Annotated[
    str | None,
    typer.Option(
        "--expert",
        help="Only this expert's answers, named as the cache names it (`ctd cache stats` lists them; "
        "an expert asked by URL is url:MODEL).",
    ),
]
ExpertUrlOption = Annotated[
    str | None,
    typer.Option("--expert-url", help="Base URL of an OpenAI-compatible API, e.g. http://host:8000/v1."),
]
ExpertModelOption = Annotated[
    str | None, typer.Option("--expert-model", help="Served model name at the --expert or --expert-url URL.")
]
MethodOption = Annotated[
    ScoringMethod | None,
    typer.Option(
        "--method",
        help="next-token (chat logprobs) or likelihood (completions echo) (default: the expert's).",
    ),
]
CacheOption = Annotated[
    Path | None,
    typer.Option(
        "--cache", help="The expert cache, a SQLite file (default: $CTD_CACHE or runs/cache/experts.sqlite)."
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as one JSON object on stdout.")]
CostLimitOption = Annotated[
    float | None,
    typer.Option(
        "--cost-limit",
        help=(
            "Stop before a request would take the US dollars spent at the expert past this (a run "
            "counts its earlier invocations too), with exit code 4; the expert's prices are its "
            "price_input/price_output in experts.toml (built-in local experts cost 0) [no limit]."
        ),
    ),
]
