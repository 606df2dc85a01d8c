"""`ctd cache stats|explain|export|forget|check|salvage`: the shared SQLite cache of expert answers
(`release-batch` in `_cache_batches`, `merge` and `import` in `_cache_merge`)."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import numpy as np
import typer
from rich.table import Table

import experts

from .._errors import EXIT_FAILED, EnvironmentFailure, InputError
from ..data import atomic_path, check_writable, read_dataset, write_table
from ..expert import resolve_expert
from ..run import Roots
from ._common import clean_errors, print_json, stdout
from ._expert_options import (
    CachedExpertOption,
    CacheOption,
    ExpertModelOption,
    ExpertOption,
    ExpertUrlOption,
    JsonOption,
    MethodOption,
)

if TYPE_CHECKING:
    from experts import ScoreCache

__all__ = ["register"]


cache_app = typer.Typer(
    help=(
        "The SQLite cache of expert answers: stats, explain, export, forget, check, salvage, "
        "release-batch, merge, import."
    ),
    no_args_is_help=True,
)

EXPORT_SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}
"""The formats `ctd cache export` writes, by the suffix of --out (the one way to choose)."""


def _check_held(store: ScoreCache, expert: str | None, path: Path) -> None:
    """An --expert the cache holds no answers of is one line naming those it holds."""
    if expert is not None and expert not in (held := store.counts()):
        experts_held = ", ".join(sorted(held)) or "none"
        raise InputError(f"--expert {expert}: no answers of it in {path} (its experts: {experts_held})")


def open_cache(path: Path | None) -> ScoreCache:
    path = path or Roots.resolve().cache
    if not path.exists():
        raise InputError(f"--cache {path}: no cache there yet (it is created by `ctd query`)")
    return experts.ScoreCache(path)


@cache_app.command("stats")
@clean_errors
def cache_stats(cache: CacheOption = None, json_output: JsonOption = False) -> None:
    """Scores and recorded failures per expert, the requests out in batch files whose results no
    `ctd query --batch-in` has read back, and the items runs are asking about right now (claims; a
    stale claim is one whose run is gone: the next run takes it over)."""
    store = open_cache(cache)
    counts = store.counts()
    holders = experts.list_claims(store)
    for c in counts.values():
        c.update(claims=0, stale_claims=0)
    for holder in holders:
        c = counts.setdefault(holder.expert, dict.fromkeys(("scores", "failures", "batch_out", "claims"), 0))
        c.setdefault("stale_claims", 0)
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
    for column in ("expert", "scores", "failures", "out in batches", "claimed now", "stale claims"):
        table.add_column(column)
    for name, c in sorted(counts.items()):
        shown = (c[key] for key in ("scores", "failures", "batch_out", "claims", "stale_claims"))
        table.add_row(name, *map(str, shown))
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
    store = open_cache(cache)
    scores, failures = store.lookup_item(item_id)
    stdout.print(f"{item_id}: {len(scores)} stored answer(s), {len(failures)} recorded failure(s)")
    for row in scores:
        stdout.print(
            f"  stored: expert={row.expert} model={row.model} method={row.method} endpoint={row.endpoint} "
            f"template={row.template_sha256[:12]} score={row.score:.4f} at {row.created}"
        )
    for row in failures:
        # A cache written before redaction may hold a key: that expert's own, whatever its shape.
        said = experts.redact(row.message, _key_variable(row.expert))
        stdout.print(
            f"  failed: expert={row.expert} reason={row.reason} attempts={row.attempts} ({said[:120]})"
        )
    if data is None or (expert is None and expert_url is None):
        return
    spec = resolve_expert(expert, expert_url, expert_model, method).spec
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
    expert: CachedExpertOption = None,
    cache: CacheOption = None,
    with_response: Annotated[
        bool, typer.Option("--with-response", help="Include the raw answers (.jsonl always has them).")
    ] = False,
    export_format: Annotated[
        Literal["csv", "jsonl", "parquet"] | None,
        typer.Option(
            "--format",
            help="The format --out's suffix chooses, stated (a mismatch is an error). jsonl keeps "
            "every column of each answer as stored: what `ctd cache import` reads on another machine.",
        ),
    ] = None,
) -> None:
    """Export stored scores (one row per answer)."""
    cache = cache or Roots.resolve().cache
    check_writable(out, "--out", tuple(EXPORT_SUFFIXES), inputs=[("--cache", cache)])
    chosen = EXPORT_SUFFIXES[out.suffix.lower()]
    if export_format is not None and export_format != chosen:
        raise InputError(
            f"--format {export_format}: --out {out} is {chosen} by its suffix; "
            f"name the file .{export_format} (the suffix chooses the format)"
        )
    store = open_cache(cache)
    _check_held(store, expert, cache)  # a typo exported nothing, exit 0
    if chosen == "jsonl":
        with atomic_path(out) as tmp, tmp.open("w", encoding="utf-8") as handle:
            written = experts.write_answers(store, handle, expert=expert)
        stdout.print(f"wrote {written} rows to {out}")
        return
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
        "how",
        "prompt_tokens",
        "completion_tokens",
        "latency_ms",
        "created",
    ]
    if with_response:
        columns.append("response")
    rows = [{c: getattr(row, c) for c in columns} for row in store.rows(expert)]
    table = {
        c: np.array([(str(r[c]) if c == "created" else (np.nan if r[c] is None else r[c])) for r in rows])
        for c in columns
    }
    write_table(out, table)
    stdout.print(f"wrote {len(rows)} rows to {out}")


@cache_app.command("forget")
@clean_errors
def cache_forget(
    how: Annotated[
        str,
        typer.Option(
            "--how",
            help="How the answers to forget were got, as the cache and the report name it: "
            + ", ".join(experts.HOWS)
            + " (choice: the vLLM recovery rung's first version, off by up to 0.18).",
        ),
    ],
    expert: CachedExpertOption = None,
    cache: CacheOption = None,
    backup: Annotated[
        Path | None,
        typer.Option(
            "--backup",
            help="A new .jsonl file the answers are copied to first (default: beside the cache, "
            "NAME.forgotten-HOW-TIME.jsonl); `ctd cache import` puts them back.",
        ),
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", help="Forget them; without it the command only counts them.")
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """Remove the stored answers got one way (--how), so that the next `ctd query` (or `ctd eval
    --retry-failed`) asks those items again and pays for them alone, not for every answer as a
    new cache would. They are copied to --backup first, synced and named before anything is
    removed: a failure there removes nothing, and a stop later leaves every removed answer in
    the copy. Without --yes, only says how many there are."""
    if how not in experts.HOWS:
        raise InputError(f"--how {how}: not a way answers are got; one of: {', '.join(experts.HOWS)}")
    path = _existing(cache)
    where = "--backup" if backup is not None else "the copy"
    if backup is not None:
        check_writable(backup, "--backup", (".jsonl",))
        if backup.exists():
            raise InputError(f"--backup {backup}: already exists; the answers go to a new file")
    store = experts.ScoreCache(path)
    forgotten = 0
    try:
        _check_held(store, expert, path)
        found = experts.answers_by_how(store, how, expert=expert)
        if yes and found:
            backup = backup or _default_backup(path, how)
            try:
                forgotten = experts.forget_answers(store, backup, how=how, expert=expert)
            except experts.StorageError as exc:
                if exc.path != backup:
                    raise
                # The copy failed, not the cache: nothing was removed (see forget_answers).
                said = str(exc).removeprefix(f"{backup}: ")
                problem = f"{where} {backup}: cannot be written ({said}); nothing was forgotten"
                raise (EnvironmentFailure if exc.environment else InputError)(problem) from None
    finally:
        store.close()
    total = sum(found.values())
    if json_output:
        print_json(
            {
                "cache": str(path),
                "how": how,
                "answers": found,
                "forgotten": forgotten,
                "backup": str(backup) if yes and found else None,
            }
        )
        return
    of = f" of {expert}" if expert is not None else ""
    if not found:
        stdout.print(f"{path}: no answers{of} got as {how}; nothing to forget", highlight=False, markup=False)
        return
    each = ", ".join(f"{name}: {count}" for name, count in found.items())
    if not yes:
        stdout.print(
            f"{path}: {total} answers{of} got as {how} ({each}); nothing changed: add --yes to forget "
            "them (copied to a .jsonl file first); then `ctd query`, or `ctd eval --retry-failed`, "
            "asks those items again",
            highlight=False,
            markup=False,
        )
        return
    stdout.print(
        f"{path}: forgot {forgotten} answers{of} got as {how}; copied first to {backup} "
        f"(`ctd cache import {backup} --cache {path}` puts them back)",
        highlight=False,
        markup=False,
    )


@cache_app.command("check")
@clean_errors
def cache_check(cache: CacheOption = None, json_output: JsonOption = False) -> None:
    """Run SQLite's integrity check on the cache (every page, every index against its table) and
    say what is wrong, if anything: exit code 0 when it is sound, 1 when it is damaged."""
    path = _existing(cache)
    result = experts.check_cache(path)
    if json_output:
        print_json({"cache": str(path), "ok": result.ok, "problems": list(result.problems)})
    elif result.ok:
        stdout.print(f"{path}: ok")
    else:
        stdout.print(f"{path}: damaged, SQLite's integrity check says:", highlight=False)
        for line in result.problems:
            stdout.print(f"  {line}", highlight=False, markup=False)
        stdout.print(
            f"copy every readable answer into a new cache: ctd cache salvage --cache {path} --out NEW.sqlite",
            highlight=False,
        )
    if not result.ok:
        raise typer.Exit(code=EXIT_FAILED)


@cache_app.command("salvage")
@clean_errors
def cache_salvage(
    out: Annotated[Path, typer.Option("--out", help="The new cache (.sqlite); it must not exist yet.")],
    cache: CacheOption = None,
    json_output: JsonOption = False,
) -> None:
    """Copy every answer and recorded failure that can still be read from a damaged cache into a
    new one, skipping the unreadable pages, and say how many rows came through. Use the new file
    as the cache (--cache or $CTD_CACHE), or move it over the old one."""
    path = _existing(cache)
    check_writable(out, "--out", (".sqlite", ".db", ".sqlite3"))
    if out.exists():
        raise InputError(f"--out {out}: already exists; salvage writes a new cache")
    result = experts.salvage_cache(path, out)
    if json_output:
        print_json(result.to_dict())
        return
    lost = {t: sum(b - a + 1 for a, b in ranges) for t, ranges in result.unreadable.items()}
    skipped = ", ".join(f"{n} rowid(s) of {t}" for t, n in lost.items() if n)
    stdout.print(
        f"recovered {result.recovered['scores']} answers, {result.recovered['failures']} recorded "
        f"failures and {result.recovered['batch_out']} requests out in batch files from {path} into {out}"
        + (f"; unreadable, so lost: {skipped}" if skipped else ""),
        highlight=False,
    )


def _default_backup(cache: Path, how: str) -> Path:
    """Where `ctd cache forget` copies the answers without --backup: a new file beside the cache."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = cache.with_name(f"{cache.stem}.forgotten-{how}-{stamp}")
    return next(
        candidate
        for n in itertools.count(1)
        if not (candidate := Path(f"{base}{'' if n == 1 else f'-{n}'}.jsonl")).exists()
    )


def _existing(path: Path | None) -> Path:
    """The cache a repair command reads: it must exist (bad input otherwise)."""
    path = path or Roots.resolve().cache
    if not path.is_file():
        raise InputError(f"--cache {path}: " + ("is a folder" if path.is_dir() else "no such file"))
    return path


def register(app: typer.Typer) -> None:
    from . import _cache_batches, _cache_merge  # noqa: F401  (their commands join cache_app)

    app.add_typer(cache_app, name="cache")


def _key_variable(expert: str) -> str | None:
    """The variable holding the API key of the registered expert `expert`, if it is one."""
    try:
        return experts.resolve_expert(expert).api_key_env
    except experts.ExpertError:  # not registered (any longer), or the registry is broken
        return None
