"""`ctd query`, `ctd experts list|show|add|check` and `ctd cache stats|explain|export`."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.table import Table

import experts
from experts import ConfigError, InvalidSetting, ScoreCache, ScoringMethod

from .._errors import MAX_FAILED, InputError, check_max_failed
from ..data._datasets import read_dataset
from ..data._tables import check_writable, write_table
from ..stages._query import QuerySummary, check_expert, default_cache_path, pick_expert, query_dataset
from ._common import clean_errors, print_json, stdout

ExpertOption = Annotated[
    str | None, typer.Option("--expert", help="A registered expert (see `ctd experts list`).")
]
ExpertUrlOption = Annotated[
    str | None,
    typer.Option("--expert-url", help="Base URL of an OpenAI-compatible API, e.g. http://host:8000/v1."),
]
ExpertModelOption = Annotated[
    str | None, typer.Option("--expert-model", help="Served model name at --expert-url.")
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
    typer.Option("--cache", help="SQLite cache (default: $CTD_CACHE or runs/cache/experts.sqlite)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as one JSON object on stdout.")]


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
    check_max_failed(max_failed)
    spec = pick_expert(expert, expert_url, expert_model, method)
    summary = query_dataset(data, spec, out, cache_path=cache, check=check, progress=not json_output)
    if json_output:
        print_json(summary.to_dict())
    else:
        _print_summary(summary)
    summary.check_failures(max_failed)


def _print_summary(summary: QuerySummary) -> None:
    stdout.print(
        f"{summary.total} examples: {summary.cached} from the cache, {summary.scored} scored, "
        f"{summary.failed} failed ({summary.retries} retries, {summary.rate_limited} answers 429) "
        f"in {summary.seconds:.1f} s; wrote {summary.out}"
    )
    for reason, count in sorted(summary.failure_reasons.items()):
        stdout.print(f"  failed: {count} x {reason} (they are retried on the next run)")


experts_app = typer.Typer(
    help="The expert registry: list, show, add and check experts.", no_args_is_help=True
)


def _registry() -> dict[str, experts.ExpertSpec]:
    try:
        return experts.load_experts()
    except ConfigError as exc:
        raise InputError(str(exc)) from None


@experts_app.command("list")
@clean_errors
def experts_list(json_output: JsonOption = False) -> None:
    """List the built-in and user experts."""
    registry = _registry()
    if json_output:
        print_json(
            {
                name: {
                    "model": s.model,
                    "urls": list(s.resolved_urls()),
                    "method": s.method,
                    "source": s.source,
                }
                for name, s in registry.items()
            }
        )
        return
    table = Table(title=f"Experts (user file: {experts.experts_file()})")
    for column in ("name", "served model", "base URL(s)", "method", "from"):
        table.add_column(column)
    for name, spec in sorted(registry.items()):
        table.add_row(name, spec.model, ", ".join(spec.resolved_urls()), spec.method, spec.source)
    stdout.print(table)


@experts_app.command("show")
@clean_errors
def experts_show(
    name: Annotated[str, typer.Argument(help="Expert name.")], json_output: JsonOption = False
) -> None:
    """Show every setting of one expert."""
    registry = _registry()
    if name not in registry:
        raise InputError(f"unknown expert {name!r}; known: {', '.join(sorted(registry))}")
    record = asdict(registry[name])
    record["resolved_urls"] = list(registry[name].resolved_urls())
    if json_output:
        print_json(record)
        return
    for key, value in record.items():
        stdout.print(f"[bold]{key}[/bold]: {value}")


@experts_app.command("add")
@clean_errors
def experts_add(
    name: Annotated[str, typer.Argument(help="Name for the new expert.")],
    url: Annotated[list[str], typer.Option("--url", help="Base URL; repeat for replicas.")],
    model: Annotated[str, typer.Option("--model", help="Served model name.")],
    api_key_env: Annotated[
        str | None,
        typer.Option("--api-key-env", help="Name of the variable holding the API key (never the key)."),
    ] = None,
    method: Annotated[ScoringMethod, typer.Option("--method", help="Scoring method.")] = "next-token",
    template: Annotated[
        str, typer.Option("--template", help="Prompt template name or .toml path.")
    ] = "stakes-v1",
    concurrency: Annotated[int, typer.Option("--concurrency", help="Requests in flight (at least 1).")] = 16,
    rpm: Annotated[float | None, typer.Option("--rpm", help="Requests per minute.")] = None,
    tpm: Annotated[float | None, typer.Option("--tpm", help="Tokens per minute.")] = None,
) -> None:
    """Add an expert to the user registry file (or replace one of the same name)."""
    entry = {
        "base_urls": list(url),
        "model": model,
        "api_key_env": api_key_env,
        "method": method,
        "template": template,
        "concurrency": concurrency,
        "rpm": rpm,
        "tpm": tpm,
    }
    try:
        path = experts.add_expert(name, entry)
    except InvalidSetting as exc:  # named by the option it came from; nothing was written
        option = "--url" if exc.setting in ("base_url", "base_urls") else "--" + exc.setting.replace("_", "-")
        raise InputError(f"{option} {exc.shown}: {exc.problem}") from None
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    stdout.print(f"added {name} to {path}; check it with `ctd experts check {name}`")


@experts_app.command("check")
@clean_errors
def experts_check(
    name: Annotated[str | None, typer.Argument(help="Expert name (or use --expert-url).")] = None,
    expert_url: ExpertUrlOption = None,
    expert_model: ExpertModelOption = None,
    method: MethodOption = None,
    json_output: JsonOption = False,
) -> None:
    """Probe an endpoint: reachable, served model, chat logprobs, completions echo, and the
    scoring method that will be used. Exit code 2 if the expert cannot be used as configured."""
    spec = pick_expert(name, expert_url, expert_model, method)
    report = check_expert(spec)
    if json_output:
        print_json(asdict(report))
    else:
        stdout.print(f"endpoint: {report.url} ({'reachable' if report.reachable else 'unreachable'})")
        if report.reachable:
            stdout.print(f"served models: {', '.join(report.served_models) or '-'}")
            stdout.print(f"chat logprobs / top_logprobs: {report.chat_logprobs}")
            stdout.print(f"completions echo with prompt logprobs: {report.completions_echo}")
        stdout.print(f"scoring method: {report.method or 'none usable'}")
    if not report.ok:
        raise InputError(report.problem or "the endpoint check failed")


@experts_app.command("serve")
@clean_errors
def experts_serve(
    name: Annotated[
        str, typer.Argument(help="A registered expert with a local server (smollm2, gemma-27b, llama-1b).")
    ],
    port: Annotated[
        int | None, typer.Option("--port", help="Port (default: the one in the expert's URL).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the command and exit.")] = False,
) -> None:
    """Start a local server for an expert (llama.cpp on CPU for smollm2, vLLM for the GPU
    entries), wait until it answers, and keep it running until Ctrl-C."""
    from experts._serve import LocalServer

    registry = _registry()
    if name not in registry:
        raise InputError(f"unknown expert {name!r}; known: {', '.join(sorted(registry))}")
    try:
        server = LocalServer(registry[name], port=port)
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    stdout.print(" ".join(server.command))
    if dry_run:
        return
    try:
        with server:
            stdout.print(f"serving {name} at {server.url} (Ctrl-C stops it)")
            assert server.process is not None
            server.process.wait()
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    except KeyboardInterrupt:
        stdout.print("stopped")


cache_app = typer.Typer(
    help="The SQLite cache of expert answers: stats, explain, export.", no_args_is_help=True
)


def _open_cache(path: Path | None) -> ScoreCache:
    path = path or default_cache_path()
    if not path.exists():
        raise InputError(f"--cache {path}: no cache there yet (it is created by `ctd query`)")
    return ScoreCache(path)


@cache_app.command("stats")
@clean_errors
def cache_stats(cache: CacheOption = None, json_output: JsonOption = False) -> None:
    """Scores and recorded failures per expert, and the items runs are asking about right now
    (claims; a stale claim is one whose run is gone: the next run takes it over)."""
    store = _open_cache(cache)
    counts = store.counts()
    holders = experts.list_claims(store)
    for c in counts.values():
        c.update(claims=0, stale_claims=0)
    for holder in holders:
        c = counts.setdefault(holder.expert, {"scores": 0, "failures": 0, "claims": 0, "stale_claims": 0})
        c["claims"] += holder.live
        c["stale_claims"] += holder.stale
    now = time.time()
    if json_output:
        claimed = [
            {
                "expert": h.expert,
                "host": h.host,
                "pid": h.pid,
                "claims": h.live,
                "stale_claims": h.stale,
                "lease_left_s": round(max(0.0, h.expires - now), 1),
            }
            for h in holders
        ]
        print_json({"cache": str(store.path), "experts": counts, "holders": claimed})
        return
    table = Table(title=str(store.path))
    for column in ("expert", "scores", "failures", "claimed now", "stale claims"):
        table.add_column(column)
    for name, c in sorted(counts.items()):
        table.add_row(name, str(c["scores"]), str(c["failures"]), str(c["claims"]), str(c["stale_claims"]))
    stdout.print(table)
    for h in holders:
        state = f"lease {max(0.0, h.expires - now):.0f} s left" if h.live else "stale: its run is gone"
        stdout.print(f"  {h.expert}: {h.live + h.stale} items claimed by pid {h.pid} on {h.host} ({state})")


@cache_app.command("explain")
@clean_errors
def cache_explain(
    item_id: Annotated[str, typer.Argument(help="The example id.")],
    data: Annotated[Path | None, typer.Option("--data", help="Dataset holding the example.")] = None,
    expert: ExpertOption = None,
    expert_url: ExpertUrlOption = None,
    expert_model: ExpertModelOption = None,
    method: MethodOption = None,
    cache: CacheOption = None,
) -> None:
    """Why an example is (not) served from the cache: its stored answers and failures, and with
    --data and an expert, which part of the cache key differs from what is stored."""
    store = _open_cache(cache)
    scores, failures = store.lookup_item(item_id)
    stdout.print(f"{item_id}: {len(scores)} stored answer(s), {len(failures)} recorded failure(s)")
    for row in scores:
        stdout.print(
            f"  stored: expert={row.expert} model={row.model} method={row.method} endpoint={row.endpoint} "
            f"template={row.template_sha256[:12]} score={row.score:.4f} at {row.created}"
        )
    for row in failures:
        stdout.print(
            f"  failed: expert={row.expert} reason={row.reason} attempts={row.attempts} ({row.message[:120]})"
        )
    if data is None or (expert is None and expert_url is None):
        return
    spec = pick_expert(expert, expert_url, expert_model, method)
    matches = [item for item in read_dataset(data).items if item.id == item_id]
    if not matches:
        raise InputError(f"{data}: no example with id {item_id!r}")
    client = experts.ExpertClient(spec, cache=None)
    _, key = client.request_for(matches[0])
    if store.get_many([key]):
        stdout.print(f"  hit: {spec.name} would be served from the cache (key {key[:16]})")
        return
    stdout.print(f"  miss: no stored answer has key {key[:16]} for {spec.name}")
    current = {
        "model": spec.model,
        "method": spec.method,
        "endpoint": spec.endpoint_id(),
        "template_sha256": client.template.sha256,
    }
    for row in scores:
        differs = [f"{k} ({getattr(row, k)} -> {v})" for k, v in current.items() if getattr(row, k) != v]
        reason = ", ".join(differs) if differs else "the request body (prompt text or sampling settings)"
        stdout.print(f"  stored answer from {row.expert} differs in: {reason}")


@cache_app.command("export")
@clean_errors
def cache_export(
    out: Annotated[Path, typer.Option("--out", help="Output file: .csv, .jsonl or .parquet.")],
    expert: ExpertOption = None,
    cache: CacheOption = None,
    with_response: Annotated[bool, typer.Option("--with-response", help="Include the raw answers.")] = False,
) -> None:
    """Export stored scores (one row per answer)."""
    check_writable(out, "--out", (".csv", ".jsonl", ".parquet"))
    store = _open_cache(cache)
    columns = [
        "key",
        "expert",
        "item_id",
        "endpoint",
        "model",
        "method",
        "template_sha256",
        "score",
        "label_mass",
        "prompt_tokens",
        "completion_tokens",
        "latency_ms",
        "created",
    ]
    if with_response:
        columns.append("response")
    rows = [{c: getattr(row, c) for c in columns} for row in store.rows(expert)]
    if out.suffix.lower() == ".jsonl":
        from ..data._tables import atomic_path

        with atomic_path(out) as tmp, tmp.open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(
                    json.dumps({k: (str(v) if k == "created" else v) for k, v in row.items()}) + "\n"
                )
    else:
        table = {
            c: np.array([(str(r[c]) if c == "created" else (np.nan if r[c] is None else r[c])) for r in rows])
            for c in columns
        }
        write_table(out, table)
    stdout.print(f"wrote {len(rows)} rows to {out}")


def register(app: typer.Typer) -> None:
    app.command("query")(query_command)
    app.add_typer(experts_app, name="experts")
    app.add_typer(cache_app, name="cache")
