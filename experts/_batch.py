"""Expert calls as batches keyed by the cache key: the requests a run would send, written as the
lines of an OpenAI batch file (`vllm run-batch` reads the same format), and the batch's results
scored and committed to the cache, so that the next run finds every answer there.

Each line's `custom_id` is the item's cache key (`ExpertClient.request_for`) and its batch's tag
(`KEY@TAG`, `experts._cache.batch_tag`), and its body is the exact body the client would send, so
a result commits under the key a run looks up, and lets go only its own batch's record of the
request. Likelihood scoring sends two bodies per item: their lines are `KEY.0@TAG` (the
high-stakes answer) and `KEY.1@TAG` (the low-stakes one), and an item scores only with both back
from one batch; with one of them here, it stays out. Items with the same input share
one key and are written once; items already cached are not written.

Results are scored by the client's own code (`parse_response`) and stored with its own rows
(`ExpertClient.rows`, `experts._rows`) through `ScoreCache.put_many`, whose insert keeps the
first answer of a key: a score some run already stored is never overwritten. A result line that
failed (an error, a status other than 200, an answer without a usable score) is recorded as a
failure with its reason, never a hit: a later run asks again (unless a later batch holds the
request now: that one still answers). The whole results file is read
and checked before anything is committed, so a malformed file commits nothing.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._cache import ScoreCache, batch_file_shown, release_batch_command
from ._client import ExpertClient, KeyedItems
from ._errors import ConfigError, ExpertError, HTTPStatusError, ResponseError
from ._items import Item, ItemResult
from ._recovery import RECOVERABLE
from ._redact import MASK, MIN_SECRET, redact
from ._registry import ExpertSpec
from ._scoring import Request, Score, parse_response, total_usage

__all__ = [
    "BATCH_URL_ROOT",
    "BatchAnswer",
    "BatchCommit",
    "BatchRequests",
    "batch_custom_ids",
    "batch_request_lines",
    "commit_batch_results",
    "read_batch_results",
]

BATCH_URL_ROOT = "/v1"
"""What a batch line's url starts with: batch runners take the API path from the root
("/v1/chat/completions"), where the client posts under a base URL that already ends in /v1."""

_LOOKUP_CHUNK = 1024  # items looked up in the cache at a time
_COMMIT_CHUNK = 1000  # rows per transaction: other runs on the cache wait on each one briefly
_NO_ANSWER = "not-in-batch"  # an item's reason in the table when no result line answered it
_INCOMPLETE = "batch-incomplete"  # ... when the lines here hold part of its request (it stays out)
_SUPERSEDED = "in-a-later-batch"  # ... when it failed in a batch older than the one its request is out in


def batch_custom_ids(key: str, request: Request, tag: str | None = None) -> list[str]:
    """The custom_id of each body of an item's request: the cache key for one body (next-token),
    `KEY.0`, `KEY.1` for the two bodies of likelihood scoring (high, then low); with the batch's
    `tag` (`batch_tag`), each followed by `@TAG`."""
    ids = [key] if len(request.bodies) == 1 else [f"{key}.{index}" for index in range(len(request.bodies))]
    return ids if tag is None else [f"{cid}@{tag}" for cid in ids]


def _split_custom_id(custom_id: str) -> tuple[str, str | None]:
    """(the custom_id without its batch's tag, the tag): a line of a batch file written before
    tags were (`KEY`, `KEY.0`) has none."""
    base, at, tag = custom_id.partition("@")
    return (base, tag) if at else (custom_id, None)


@dataclass
class BatchRequests:
    """What a batch file holds for a data set, counted while its lines are produced: `items`
    in all, `cached` already answered (not written), `duplicates` sharing the key of an earlier
    item (written once), `to_recover` left out because their request was answered before without
    label tokens (a recorded `experts._recovery.RECOVERABLE` failure: the same deterministic
    request in a batch would get the same answer, paid again; a live `ctd query` runs the
    recovery ladder for them), `pending` left out because an earlier batch file holds their
    request and no `--batch-in` has read its result back (how many in each file in
    `pending_files`), the keys of both in `left_out`, and `written` items written, as `lines`
    lines, about `tokens` tokens (the client's estimate, `Request.tokens`), their (key, item id)
    in `written_keys`."""

    items: int = 0
    cached: int = 0
    duplicates: int = 0
    to_recover: int = 0
    pending: int = 0
    written: int = 0
    lines: int = 0
    tokens: int = 0
    left_out: set[str] = field(default_factory=set)
    pending_files: Counter[str] = field(default_factory=Counter)
    written_keys: list[tuple[str, str]] = field(default_factory=list)


def pending_line(files: Mapping[str, int], cache: Path) -> str:
    """The batch files that hold requests whose results no `--batch-in` has read back, with how
    many each (a file not found here, say: a `--batch-out` stopped before its file took its
    name, or a file moved since), and how to let those requests be asked again (`cache`: the
    cache that says so)."""
    named = ", ".join(sorted(batch_file_shown(file, n) for file, n in files.items()))
    return (
        f"{named}; for a batch that was never submitted, failed or expired, "
        f"{release_batch_command('FILE', cache)} lets its requests be asked again"
    )


def batch_request_lines(
    spec: ExpertSpec,
    items: Sequence[Item] | KeyedItems,
    cache: ScoreCache | None,
    counts: BatchRequests,
    *,
    tag: str | None = None,
) -> Iterator[dict[str, Any]]:
    """The batch lines (`custom_id`, `method`, `url`, `body`) of the items of `items` that have no
    answer in `cache` and are out in no earlier batch file, one key once, counted into `counts`
    as they go; `tag`: the batch's (`batch_tag`), in every custom_id. Nothing is sent, and no
    credential is in them: a key travels in a header, never in a body."""
    client = ExpertClient(spec, cache=None)
    keyed = client.keyed(items)
    seen: set[str] = set()
    for start in range(0, len(keyed), _LOOKUP_CHUNK):
        keys = keyed.keys[start : start + _LOOKUP_CHUNK]
        cached = cache.get_many(keys) if cache is not None else {}
        unanswered = [key for key in keys if key not in cached]
        # Only next-token scoring has a recovery ladder, and only the live client climbs it.
        recover = (
            cache.failed_keys(unanswered, RECOVERABLE)
            if cache is not None and spec.method == "next-token"
            else set()
        )
        out_in = cache.batch_files(unanswered) if cache is not None else {}
        for item, key in zip(keyed.items[start : start + _LOOKUP_CHUNK], keys, strict=True):
            counts.items += 1
            if key in cached:
                counts.cached += 1
                continue
            if key in seen:
                counts.duplicates += 1
                continue
            seen.add(key)
            if key in recover:
                counts.to_recover += 1
                counts.left_out.add(key)
                continue
            if key in out_in:
                counts.pending += 1
                counts.pending_files[out_in[key]] += 1
                counts.left_out.add(key)
                continue
            request = client.request(item)
            counts.written += 1
            counts.written_keys.append((key, item.id))
            counts.tokens += request.tokens
            for custom_id, body in zip(batch_custom_ids(key, request, tag), request.bodies, strict=True):
                counts.lines += 1
                url = BATCH_URL_ROOT + request.path
                yield {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


@dataclass(frozen=True)
class BatchAnswer:
    """One result line: where it was read (file:line), its HTTP status (None when the request
    got none), the answer's JSON body, and the runner's error (None when there was none)."""

    where: str
    status: int | None
    body: Any
    error: Any

    def failure(self) -> ExpertError | None:
        """Why this line holds no answer to score, or None. The message is redacted (it is stored
        in the failures table): an error may quote a key, as the live client's are redacted."""
        if self.status is not None and self.status != 200:
            return HTTPStatusError(self.status, f"{redact(_shown(self.error or self.body))} ({self.where})")
        if self.error is not None:
            return ResponseError(f"{redact(_shown(self.error))} ({self.where})", reason="batch-error")
        if not isinstance(self.body, Mapping):
            # Not `no-logprobs`: nothing was answered, so it is no answer for the ladder to recover.
            return ResponseError(f"the result holds no answer body ({self.where})", reason="batch-error")
        return None


def _shown(value: Any) -> str:
    """An error as a failure's message holds it: the text of OpenAI's and vLLM's error objects."""
    if isinstance(value, Mapping):
        inner = value.get("error", value)
        if isinstance(inner, Mapping) and "message" in inner:
            return str(inner["message"])
        if "message" in value:
            return str(value["message"])
    return json.dumps(value)[:300] if not isinstance(value, str) else value


def read_batch_results(paths: Sequence[Path], *, api_key_env: str | None = None) -> dict[str, BatchAnswer]:
    """Every result line of `paths` (a batch's output file and, for OpenAI's Batch API, its
    error file), by custom_id. The whole of each file is read and checked first: a line that is
    not a result (`{"custom_id", "response": {"status_code", "body"}, "error"}`) or a custom_id
    seen before is one ConfigError naming file:line. The key `api_key_env` names is masked
    wherever a line holds it (an answer that echoes it is stored), as the live client does."""
    key = os.environ.get(api_key_env, "").encode() if api_key_env else b""
    if len(key) < MIN_SECRET:  # a token as short as "x" would garble the JSON, not hide a secret
        key = b""
    answers: dict[str, BatchAnswer] = {}
    for path in paths:
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        for number, line in enumerate(raw.split(b"\n"), start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            if key and key in line:
                line = line.replace(key, MASK.encode())
            answer, custom_id = _result_line(line, where)
            if custom_id in answers:
                raise ConfigError(f"{where}: custom_id {custom_id!r} repeats {answers[custom_id].where}")
            answers[custom_id] = answer
    return answers


def _result_line(line: bytes, where: str) -> tuple[BatchAnswer, str]:
    try:
        record = json.loads(line)
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply to be a result line") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: expected a result object, found {type(record).__name__}")
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise ConfigError(f"{where}: no custom_id (a batch result line has custom_id, response and error)")
    response, error = record.get("response"), record.get("error")
    if response is None and error is None:
        raise ConfigError(f"{where}: neither a response nor an error for custom_id {custom_id!r}")
    if response is not None and not isinstance(response, dict):
        raise ConfigError(f"{where}: response must be an object with status_code and body")
    status = response.get("status_code") if response is not None else None
    if status is not None and (not isinstance(status, int) or isinstance(status, bool)):
        raise ConfigError(f"{where}: response.status_code must be an integer, found {status!r}")
    body = response.get("body") if response is not None else None
    return BatchAnswer(where, status, body, error), custom_id


@dataclass
class BatchCommit:
    """What committing a batch's results did: `committed` items scored into the cache,
    `already` items the cache answered before (kept, not overwritten), `failed` items recorded
    as failures (`failure_reasons`), `unmatched` result lines whose custom_id is no item's (a
    different data file, expert, method or template), `missing` items still without an answer,
    and `usd` what the batch's answers cost at the expert's prices with the batch discount, from
    the usage they report (every line: an answer is paid whether or not it scores). Of the
    missing items, those whose request is still out in a batch file (its results not read back
    yet, perhaps in another results file) are counted in `still_out`, file -> how many."""

    usd: float = 0.0
    lines: int = 0
    committed: int = 0
    already: int = 0
    failed: int = 0
    unmatched: int = 0
    missing: int = 0
    failure_reasons: Counter[str] = field(default_factory=Counter)
    still_out: dict[str, int] = field(default_factory=dict)


def commit_batch_results(
    spec: ExpertSpec, items: Sequence[Item], answers: Mapping[str, BatchAnswer], cache: ScoreCache
) -> tuple[list[ItemResult], BatchCommit]:
    """Score the answers of a batch for `items` with `spec`'s own scoring, commit them to
    `cache` (a key it already answers keeps its answer), and give one result per item, read
    from the cache afterwards: "cache" for every answered item, "failed" with the reason for
    the rest ("not-in-batch" where no line answered it). When not one line matches an item,
    nothing is committed and the ConfigError says so: the file belongs to other data or another
    expert.

    An item is answered by the lines of one batch (one tag), all of its lines (both of a
    likelihood pair). One that holds part of its lines here ("batch-incomplete") stays out, its
    request not asked again: the rest may be in another results file of the batch, read with
    this one. A failure is recorded, and its request let go to be asked again, only where it is
    that of the batch holding the request now: a failure of an older batch (its results read
    again, or come after the request went out anew) changes nothing."""
    client = ExpertClient(spec, cache=None)
    keyed = [(item, *client.request_for(item)) for item in items]
    owners: dict[str, tuple[Item, Request]] = {}  # each key's first item: its id goes in the row
    for item, request, key in keyed:
        owners.setdefault(key, (item, request))
    wanted = {cid: key for key, (_, request) in owners.items() for cid in batch_custom_ids(key, request)}
    lines: dict[str, dict[str | None, BatchAnswer]] = {}  # custom_id without its tag -> tag -> line
    for custom_id, answer in answers.items():
        base, tag = _split_custom_id(custom_id)
        lines.setdefault(base, {})[tag] = answer
    usage = total_usage([answer.body for answer in answers.values()])
    report = BatchCommit(
        lines=len(answers),
        unmatched=sum(len(tags) for base, tags in lines.items() if base not in wanted),
        usd=spec.price.usd(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0), batch=True),
    )
    if answers and report.unmatched == len(answers):
        raise ConfigError(
            f"none of the {len(answers)} result lines answers an item of the data with expert "
            f"{spec.name} (method {spec.method}, template {spec.template}): the batch was made for "
            "other data or another expert"
        )
    answered = sorted({key for cid, key in wanted.items() if cid in lines})
    stored = cache.get_many(answered)
    holders = cache.batch_tags(answered)  # the batch each request is out in now
    scores, failures = [], []
    failed: dict[str, str] = {}  # key: reason, for the table
    incomplete: set[str] = set()
    superseded: set[str] = set()
    # The requests these results bring back (key -> the batch holding it as read above): a later
    # batch or run may ask them. Released only while that batch still holds them.
    released: dict[str, str] = {}
    for key in answered:
        if key in stored:
            report.already += 1
            if key in holders:
                released[key] = holders[key]
            continue
        item, request = owners[key]
        ids = batch_custom_ids(key, request)
        tags = sorted({tag for cid in ids for tag in lines.get(cid, {})}, key=lambda tag: tag or "")
        whole = [tag for tag in tags if all(tag in lines.get(cid, {}) for cid in ids)]
        if not whole:
            incomplete.add(key)
            continue
        outcomes = [(tag, _score(client, request, [lines[cid][tag] for cid in ids])) for tag in whole]
        good = [outcome for _, outcome in outcomes if not isinstance(outcome, ExpertError)]
        if good:
            payload, score, usage = good[0]
            scores.append(client.rows.score(key, item.id, payload, score, seconds=0.0, usage=usage))
            continue
        holder = holders.get(key)
        if holder is not None and None not in whole and holder not in whole:
            superseded.add(key)  # failed in an older batch: the request is out in another one now
            continue
        error = next((outcome for tag, outcome in outcomes if tag == holder), outcomes[0][1])
        assert isinstance(error, ExpertError)
        failures.append(client.rows.failure(key, item.id, error, attempts=1))
        failed[key] = error.reason
        report.failure_reasons[error.reason] += 1
        if holder is not None:
            released[key] = holder
    for start in range(0, max(len(scores), len(failures)), _COMMIT_CHUNK):
        end = start + _COMMIT_CHUNK
        cache.put_many(scores[start:end], failures[start:end])  # an answered key is out no longer
    cache.release_batches(released)
    report.committed, report.failed = len(scores), len(failures)
    final = cache.get_many([key for *_, key in keyed])
    results = []
    unanswered: list[str] = []  # not in the batch, in part only, or failed in an older one
    for item, _, key in keyed:
        hit = final.get(key)
        if hit is not None:
            results.append(ItemResult(item.id, hit.score, hit.label_mass, "cache", how=hit.how))
            continue
        if key not in failed:
            report.missing += 1
            unanswered.append(key)
        reason = failed.get(
            key, _INCOMPLETE if key in incomplete else _SUPERSEDED if key in superseded else _NO_ANSWER
        )
        results.append(ItemResult(item.id, None, None, "failed", reason=reason))
    report.still_out = cache.pending_files(unanswered)
    return results, report


def _score(
    client: ExpertClient, request: Request, halves: list[BatchAnswer]
) -> ExpertError | tuple[Any, Score, dict[str, int]]:
    """An item's answers (every line of its request) scored as the client scores them: the
    payload to store, its score and token usage, or why there is no score."""
    payloads = []
    for answer in halves:
        problem = answer.failure()
        if problem is not None:
            return problem
        payloads.append(answer.body)
    try:
        score = parse_response(client.spec.method, payloads, client.template, request)
    except ResponseError as exc:
        return exc
    payload = payloads[0] if len(payloads) == 1 else payloads
    return payload, score, total_usage(payloads)
