"""The plan of a `ctd score` job: its input cut into shards of `shard_rows` rows (a shard never
spans two files), written down in the output folder's manifest (score.json) so that a rerun of the
same job resumes and a different job is refused before anything is written.

Planning reads the inputs once, streaming: it converts and checks every row (a bad row is one
line naming its file and line before any work is paid for) and keeps only where each shard
starts, so ten million rows plan in bounded memory."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experts import redact_url

from .._errors import InputError
from ..data import folder_writer, read_json, write_json
from ..monitor import read_bundle
from ..run import file_sha256
from ._inputs import input_files, walk_rows
from ._layout import ScoreLayout

if TYPE_CHECKING:
    from ._shard import ScoreOptions

__all__ = ["MANIFEST_VERSION", "ScorePlan", "ShardTask", "one_job", "plan_score", "shard_record"]

MANIFEST_VERSION = 1
# What a rerun must share with the job that wrote the folder (the limit may change: a job tried
# on a few rows is then run in full, and only the shards it lacks are scored).
SAME_JOB = ("version", "bundle", "inputs", "shard_rows", "expert", "expert_url")
_HELD_HERE: set[Path] = set()  # output folders this process holds (`ScorePlan.held`)


@dataclass(frozen=True)
class ShardTask:
    """One shard: rows [first_row, stop_row) of the input file `path` (counted from 0 among the
    file's rows), written as shard-{index:05d}.parquet. Plain fields: it travels as a dict row."""

    index: int
    path: str
    first_row: int
    stop_row: int
    byte_offset: int | None  # JSONL/CSV: where first_row starts; None for Parquet
    first_line: int = 1  # JSONL/CSV: the file line of first_row, for messages

    @property
    def rows(self) -> int:
        return self.stop_row - self.first_row

    def row_range(self) -> dict[str, Any]:
        """What a shard file's record says of its rows, so that a file is known to be this task's."""
        return {"path": self.path, "first_row": self.first_row, "stop_row": self.stop_row}

    def done_by(self, record: Mapping[str, Any] | None) -> bool:
        """Whether a shard file's record (`shard_record`) makes this task done: the file holds at
        least this task's rows (a job rerun with a smaller --limit keeps the whole shard an earlier
        run wrote) and the expert answered every row it was asked about (a shard with expert
        failures is scored again: the answers that came back are in the cache, only the failed
        rows are asked again)."""
        if not self.wrote(record):
            return False
        assert record is not None
        return int(record.get("stop_row", -1)) >= self.stop_row and not record.get("expert_failed", 0)

    def wrote(self, record: Mapping[str, Any] | None) -> bool:
        """Whether a shard file's record is of this task's shard (the same file and first row),
        whatever its rows' end and expert failures."""
        if record is None:
            return False
        return record.get("path") == self.path and record.get("first_row") == self.first_row

    def to_row(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: Mapping[str, object]) -> ShardTask:
        values: dict[str, Any] = {f.name: row[f.name] for f in fields(cls) if f.name in row}
        offset = values.get("byte_offset")
        # A dict row that went through Arrow may carry a missing offset as NaN or numpy ints.
        values["byte_offset"] = None if offset is None or offset != offset else int(offset)
        for name in ("index", "first_row", "stop_row", "first_line"):
            if name in values:
                values[name] = int(values[name])
        values["path"] = str(values["path"])
        return cls(**values)


@dataclass(frozen=True)
class ScorePlan:
    out: Path
    shards: tuple[ShardTask, ...]
    rows: int

    @property
    def layout(self) -> ScoreLayout:
        return ScoreLayout(self.out)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the output folder as its one job's for the block (`score_local` and `score_ray` do;
        the command line holds it from before its display starts): see `one_job`. Under the hold,
        a killed job's temporary files are removed before, and this job's after."""
        with one_job(self.out):
            self._clear_temps()
            yield
            self._clear_temps()

    def _clear_temps(self) -> None:
        for temp in self.layout.temps():
            temp.unlink(missing_ok=True)

    def pending(self) -> list[ShardTask]:
        """Shards not done yet (`ShardTask.done_by`): no file, fewer rows than the task's (the last
        shard of a job tried with a smaller --limit), or rows the expert failed on."""
        return [task for task in self.shards if not task.done_by(shard_record(self.layout.shard(task.index)))]


@contextmanager
def one_job(out: Path) -> Iterator[None]:
    """Hold the folder `out` for one `ctd score` job for the block (a lock the system drops when
    the process ends): a second job there (the same command started twice, a resubmitted batch
    job beside the old one) is one InputError, and neither its plan nor its shards touch the
    running job's files. A hold this process has already is taken as it is; a folder not there
    yet has no job to meet."""
    key = Path(out).resolve()
    if key in _HELD_HERE or not Path(out).is_dir():
        yield
        return
    with ExitStack() as stack:
        try:
            stack.enter_context(folder_writer(Path(out)))
        except BlockingIOError:
            raise InputError(
                f"--out {out}: another `ctd score` job is writing there; wait for it to end "
                "(or stop it), then rerun to resume"
            ) from None
        _HELD_HERE.add(key)
        stack.callback(_HELD_HERE.discard, key)
        yield


def shard_record(path: Path) -> dict[str, Any] | None:
    """The `ctd` metadata of a written shard file (its rows' range and its totals), None when
    there is no such file."""
    import pyarrow.parquet as pq

    if not path.is_file():
        return None
    try:
        metadata = pq.read_schema(path).metadata or {}
    except Exception:  # a file that is not Parquet: scored again, not trusted
        return {}
    return json.loads(metadata.get(b"ctd", b"{}"))


def plan_score(options: ScoreOptions, data: Path, *, shard_rows: int, limit: int | None) -> ScorePlan:
    """Check the job, cut it into shards, and write (or check) out/score.json; see the module
    docstring. Every problem is one InputError line, and then nothing is written."""
    if shard_rows < 1:
        raise InputError(f"--shard-rows {shard_rows}: must be at least 1")
    if limit is not None and limit < 1:
        raise InputError(f"--limit {limit}: must be at least 1")
    out = Path(options.out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: is a file, where a folder is expected")
    if Path(data).is_dir() and out.resolve() == Path(data).resolve():
        raise InputError(f"--out {out}: is the --data folder; the shards go to a folder of their own")
    bundle = read_bundle(Path(options.bundle))
    files = input_files(Path(data))
    shards: list[ShardTask] = []
    rows = 0
    for path in files:
        if limit is not None and rows >= limit:
            break  # later files are not read at all: --limit rows are all the job scores
        text = path.suffix.lower() != ".parquet"
        opened: ShardTask | None = None  # the shard being counted, its stop_row not yet known
        count = 0
        for row in walk_rows(path):
            if count % shard_rows == 0:
                if opened is not None:
                    shards.append(replace(opened, stop_row=count))
                line = int(row.where.rsplit(":", 1)[1]) if text else 1  # text files say "FILE:LINE"
                opened = ShardTask(
                    len(shards), str(path.resolve()), count, count, row.start if text else None, line
                )
            count += 1
            rows += 1
            if limit is not None and rows >= limit:
                break  # before the next row is read: a row past the limit is never parsed
        if opened is not None:
            shards.append(replace(opened, stop_row=count))
    if rows == 0:
        raise InputError(f"--data {data}: no rows to score")
    manifest = {
        "version": MANIFEST_VERSION,
        "bundle": file_sha256(bundle.layout.record),
        "inputs": [
            {"path": str(p.resolve()), "size": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns}
            for p in files
        ],
        "shard_rows": shard_rows,
        "expert": bool(options.expert),
        # Which server answered matters as much as whether one did; never its credentials.
        "expert_url": redact_url(options.expert_url) if options.expert and options.expert_url else None,
        "limit": limit,
        "rows": rows,
        "shards": len(shards),
    }
    layout = ScoreLayout(out)
    # Made before it is held: two jobs started at once on a new folder would otherwise both find
    # nothing to hold, and the second's manifest would stand over the first's shards.
    out.mkdir(parents=True, exist_ok=True)
    with one_job(out):  # a running job's manifest is neither judged nor rewritten by another
        _check_same_job(layout, manifest)
        write_json(layout.manifest, manifest)
    return ScorePlan(out, tuple(shards), rows)


def _check_same_job(layout: ScoreLayout, manifest: dict[str, Any]) -> None:
    if not layout.manifest.is_file():
        if any(layout.shards()):
            raise InputError(
                f"--out {layout.root}: holds shard files but no {layout.manifest.name}; use another --out"
            )
        return
    before = read_json(layout.manifest)
    for key in SAME_JOB:
        if before.get(key) != manifest[key]:
            raise InputError(
                f"--out {layout.root}: holds another job ({_differs(key, before.get(key), manifest[key])}); "
                "rerun it with the options it was started with, or use another --out"
            )


def _differs(key: str, before: Any, now: Any) -> str:
    """The difference as a person reads it."""
    if key == "bundle":
        return "another bundle (its record differs)"
    if key == "inputs":
        old = {i["path"]: i for i in before or []}
        for entry in now:
            if entry["path"] not in old:
                return f"--data: {entry['path']} was not among its inputs"
            if old[entry["path"]] != entry:
                return f"--data: {entry['path']} changed since (size or modification time)"
        return "--data: other input files"
    if key == "shard_rows":
        return f"--shard-rows was {before}, now {now}"
    if key == "expert_url":
        own = "the bundle's own"
        return f"the expert's URL was {before or own}, now {now or own}"
    if key == "expert":
        return f"--{'' if before else 'no-'}expert was given, now --{'' if now else 'no-'}expert"
    return f"{key} was {before}, now {now}"
