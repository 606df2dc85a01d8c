"""An export's logs in parts: each probe configuration's samples cut into logs of about
`samples_per_log` samples at most (every seed of an example in the same part, so the viewer still
shows them side by side), built and written by worker processes, each under a temporary name,
and renamed into place only once every part of every configuration is written.

Why parts: inspect_ai's writer compares each sample it buffers with every one buffered before it,
so writing one log takes time that grows with the square of its samples. Measured on this
project's 2-core machine (docs/benchmarks.md; inspect_ai 0.3.285): 2,500 samples
7.1 s, 5,000 18.1 s, 10,000 54.0 s: about 1.8 ms per sample plus 0.36 us times the samples
squared, so one log of a 100,000-example run of 3 seeds (300,000 samples) would take about 9
hours. A part of 5,000 costs about 9 s for each term, and parts run side by side; smaller parts
cost less in all (1,000: 2.2 s each) but make more logs to browse."""

from __future__ import annotations

import glob
import itertools
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .._workers import WorkerPool
from ._inputs import Inputs
from ._records import ArchRecords, ExampleRecord

__all__ = [
    "LogPart",
    "existing_logs",
    "part_paths",
    "plan_parts",
    "remove_dead_temporaries",
    "split_records",
    "write_parts",
]


@dataclass(frozen=True)
class LogPart:
    """One log to write: a configuration's records of some examples, and where they go."""

    run_dir: Path
    found: ArchRecords  # its `records`: this part's only
    inputs: Inputs  # this part's examples only
    part: int  # 1-based
    parts: int
    final: Path
    temporary: Path  # beside `final`, named for the exporting process


def part_paths(path: Path, parts: int) -> list[Path]:
    """The logs of a configuration whose single log would be `path`: itself, or PATH-STEM.partK-of-N.eval."""
    if parts == 1:
        return [path]
    width = len(str(parts))
    names = (f"{path.stem}.part{k:0{width}d}-of-{parts}{path.suffix}" for k in range(1, parts + 1))
    return [path.with_name(name) for name in names]


def existing_logs(path: Path) -> list[Path]:
    """What an earlier export of the same configuration left: `path` and its parts (names
    `part_paths` gives, whatever the number of parts)."""
    pattern = re.compile(re.escape(path.stem) + r"\.part\d+-of-\d+" + re.escape(path.suffix))
    names = path.parent.glob(f"*{path.suffix}") if path.parent.is_dir() else []
    parts = [p for p in names if pattern.fullmatch(p.name)]
    return ([path] if path.exists() else []) + sorted(parts)


def remove_dead_temporaries(path: Path) -> list[Path]:
    """Remove, and return, the temporaries that exports of `path`'s configuration (its parts too)
    left when their process was killed outright (`kill -9`, the OOM killer: no `finally` ran).
    A temporary is `.NAME.PID.tmp`, NAME a log's name; one of a process still running is its own
    business. (Before, `.STEM.PID.tmp.eval`: a name inspect's viewer listed as a log.)"""
    stem, suffix = re.escape(path.stem), re.escape(path.suffix)
    name = rf"\.{stem}(?:\.part\d+-of-\d+)?"
    pattern = re.compile(rf"{name}{suffix}\.(\d+)\.tmp|{name}\.(\d+)\.tmp{suffix}")
    removed = []
    for temporary in path.parent.glob(f".{glob.escape(path.stem)}*") if path.parent.is_dir() else []:
        found = pattern.fullmatch(temporary.name)
        if found and not _running(int(found.group(1) or found.group(2))):
            temporary.unlink(missing_ok=True)
            removed.append(temporary)
    return removed


def _running(pid: int) -> bool:
    """Whether a process `pid` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def split_records(records: Sequence[ExampleRecord], samples_per_log: int) -> list[list[ExampleRecord]]:
    """The records cut by example into as many parts as `samples_per_log` asks for, with about
    equal numbers of examples (so of samples, when every example has every seed), every record
    of an example in one part, the order kept."""
    by_example: dict[str, list[int]] = {}
    for i, record in enumerate(records):
        by_example.setdefault(record.id, []).append(i)
    examples = list(by_example.values())
    parts = max(1, min(len(examples), -(-len(records) // samples_per_log)))
    bounds = [len(examples) * k // parts for k in range(parts + 1)]
    chunks = [sorted(i for rows in examples[a:b] for i in rows) for a, b in itertools.pairwise(bounds)]
    return [[records[i] for i in chunk] for chunk in chunks]


def plan_parts(
    run_dir: Path, found: ArchRecords, inputs: Inputs, path: Path, samples_per_log: int
) -> list[LogPart]:
    """The logs of one configuration (one, or parts when it has more samples than `samples_per_log`)."""
    chunks = split_records(found.records, samples_per_log)
    paths = part_paths(path, len(chunks))
    out = []
    for k, (chunk, final) in enumerate(zip(chunks, paths, strict=True), 1):
        ids = {r.id for r in chunk}
        mine = Inputs({i: inputs.by_id[i] for i in ids if i in inputs.by_id}, inputs.note)
        temporary = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        out.append(LogPart(run_dir, replace(found, records=chunk), mine, k, len(chunks), final, temporary))
    return out


def write_parts(
    parts: list[LogPart],
    write: Callable[[LogPart], object],
    progress: Callable[[str], None],
    *,
    replaced: Sequence[Path] = (),
    in_workers: bool = True,
) -> None:
    """`write(part)` (to `part.temporary`) for every part, by worker processes when there are
    several (`harness._workers`: one per CPU up to 8, no more than the parts), then every
    temporary renamed to its final name and the logs in `replaced` that no part overwrote (an
    earlier export's parts) removed. A failure stops the parts not yet started; any failure or
    interrupt leaves no temporary behind and renames or removes nothing."""
    written = itertools.count(1)

    def done() -> None:
        progress(f"wrote {next(written)} of {len(parts)} logs")

    try:
        if len(parts) == 1 or not in_workers:
            for part in parts:
                write(part)
                done()
        else:
            pool = WorkerPool(workers=len(parts), stop_on_error=True, done=done)
            try:
                for part in parts:
                    pool.submit(write, part)
                pool.wait()
            except BaseException:
                pool.close()  # every worker gone before the temporaries are removed
                raise
        for part in parts:
            os.replace(part.temporary, part.final)
        for old in set(replaced) - {part.final for part in parts}:
            old.unlink(missing_ok=True)
    finally:
        for part in parts:
            part.temporary.unlink(missing_ok=True)
