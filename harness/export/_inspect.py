"""A finished run as inspect_ai `.eval` logs, one per probe configuration (in parts when it is
large, see `_parts.py`), written through inspect_ai's own Python API (`write_eval_log`): its
maintainers keep the file format free to change and the API stable, so nothing here writes the
zip itself.

In a log, a sample is a test example and an epoch a probe seed (epoch k is the k-th seed of the
run, ascending; the seed itself is in the sample's metadata), so the viewer shows the seeds of
one example side by side. Each sample carries a score for the probe, the expert and every
policy's cascade at every exported budget (named POLICY@BUDGET, as in the report's
examples.parquet); the log's results hold the run's headline numbers under the same names.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import calibrate

from .._errors import InputError
from ..run import RunLayout, RunLog
from . import SAMPLES_PER_LOG
from ._inputs import ExampleInput, Inputs, read_inputs
from ._parts import LogPart, existing_logs, plan_parts, remove_dead_temporaries, write_parts
from ._records import ArchRecords, ExampleRecord, Outcome, check_finished, read_arch, score_name

if TYPE_CHECKING:
    from inspect_ai.log import EvalLog
    from inspect_ai.model import ChatMessage
    from inspect_ai.scorer import Score

__all__ = ["INSPECT_MISSING", "TARGETS", "export_inspect", "log_paths", "sample_id"]

INSPECT_MISSING = "inspect_ai is not installed; install the extra: pip install -e '.[inspect]'"
TARGETS = {1: "high-stakes", 0: "low-stakes"}  # a label as the data files spell it
TASK = "ctd"  # the log's task name; the probe configuration follows it
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")


def sample_id(example_id: str) -> str:
    """An example id as a sample id: inspect names each sample's file in the zip after it, so an
    id that is not a plain name (a slash, a space, a leading dot, 80 characters or more) becomes
    one, with a hash of the original to keep ids apart (the original is in the metadata)."""
    if _SAFE_ID.fullmatch(example_id):
        return example_id
    digest = hashlib.sha256(example_id.encode()).hexdigest()[:10]
    plain = re.sub(r"[^A-Za-z0-9._-]", "_", example_id).lstrip("._-")[:60]
    return f"{plain}-{digest}" if plain else f"id-{digest}"


def log_paths(run_dir: Path, out: Path | None, archs: list[str]) -> dict[str, Path]:
    """Where each probe configuration's log goes: by default RUN/inspect/ARCH.eval; with --out,
    `out` itself for a run of one configuration (a name ending in .eval), else `out`/ARCH.eval
    (a folder) for each. One InputError line when --out does not fit the run."""
    layout = RunLayout(run_dir)
    if out is None:
        return {arch: layout.inspect_log(arch) for arch in archs}
    suffix = layout.inspect_log(archs[0]).suffix
    if len(archs) == 1:
        if out.suffix != suffix:
            raise InputError(
                f"--out {out}: a log's name ends in {suffix} (the run has one probe configuration)"
            )
        return {archs[0]: out}
    if out.suffix == suffix:
        raise InputError(
            f"--out {out}: the run has {len(archs)} probe configurations ({', '.join(archs)}): "
            f"name a folder, which gets ARCH{suffix} for each"
        )
    return {arch: layout.inspect_log(arch, out) for arch in archs}


def _messages(conversation: object) -> str | list[ChatMessage]:
    """The conversation as inspect messages when it has turns, else its text."""
    from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageTool, ChatMessageUser

    if isinstance(conversation, str):
        return conversation
    kinds = {"system": ChatMessageSystem, "assistant": ChatMessageAssistant, "tool": ChatMessageTool}
    out: list[ChatMessage] = []
    for message in conversation:  # type: ignore[attr-defined]
        role, content = str(message.get("role", "user")), str(message.get("content", ""))
        kind = kinds.get(role)
        if kind is None:  # a role inspect does not know: a user turn that says whose it was
            out.append(ChatMessageUser(content=content if role == "user" else f"[{role}] {content}"))
        else:
            out.append(kind(content=content))
    return out


def _right(score: float, label: int) -> bool:
    return (score >= calibrate.DECISION_THRESHOLD) == (label == 1)


def _fmt(value: float, sign: bool = False) -> str:
    if math.isnan(value):
        return "none"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"  # a threshold of inf: never delegate
    return f"{value:+.3f}" if sign else f"{value:.3f}"


def _outcome_score(record: ExampleRecord, outcome: Outcome) -> Score:
    from inspect_ai.scorer import Score

    policy = calibrate.POLICIES[outcome.policy]
    if outcome.rank is not None:
        how = f"rank {outcome.rank} in its batch of {outcome.batch} by {policy.signal} {_fmt(outcome.signal)}"
        threshold = "no threshold (top-k)"
    else:
        how = f"{policy.signal} signal {_fmt(outcome.signal)} against threshold {_fmt(outcome.threshold)}"
        threshold = f"threshold {_fmt(outcome.threshold)}"
    verb = "delegated" if outcome.delegated else "retained"
    return Score(
        value={"score": outcome.score, "delegated": outcome.delegated, "correct": outcome.correct},
        answer=TARGETS[int(outcome.score >= calibrate.DECISION_THRESHOLD)],
        explanation=(
            f"{verb}: {how}; DV score {_fmt(record.dv, sign=True)}, {threshold}, "
            f"v {_fmt(record.v, sign=True)}; cascade score {_fmt(outcome.score)}"
        ),
        metadata={
            "threshold": _json_number(outcome.threshold),
            "signal": outcome.signal,
            "rank": outcome.rank,
        },
    )


def _json_number(value: float) -> float | str | None:
    """A threshold as JSON holds it: inf (never delegate) as the string "inf", NaN (none) as null."""
    if math.isnan(value):
        return None
    return value if math.isfinite(value) else _fmt(value)


def _scores(record: ExampleRecord) -> dict[str, Score]:
    from inspect_ai.scorer import Score

    out = {
        name: Score(
            value={"score": value, "correct": _right(value, record.label)},
            answer=TARGETS[int(value >= calibrate.DECISION_THRESHOLD)],
            explanation=(
                f"{name} score {_fmt(value)}; DV score {_fmt(record.dv, sign=True)}, "
                f"v {_fmt(record.v, sign=True)}"
            ),
        )
        for name, value in (("probe", record.probe), ("expert", record.expert))
    }
    for outcome in record.outcomes:
        out[score_name(outcome.policy, outcome.budget)] = _outcome_score(record, outcome)
    return out


def _sample(record: ExampleRecord, epoch: int, seen: ExampleInput, arch: str) -> Any:
    from inspect_ai.log import EvalSample
    from inspect_ai.model import ChatMessageUser

    conversation = _messages(seen.conversation)
    return EvalSample(
        id=sample_id(record.id),
        epoch=epoch,
        input=conversation,
        # The viewer's Messages tab shows these: the conversation the monitor saw.
        messages=[ChatMessageUser(content=conversation)] if isinstance(conversation, str) else conversation,
        target=TARGETS[record.label],
        scores=_scores(record),
        metadata={
            "id": record.id,
            "arch": arch,
            "seed": record.seed,
            "group": record.group,
            "label": record.label,
            "probe": record.probe,
            "dv": record.dv,
            "expert": record.expert,
            "v": record.v,
            "half": "evaluation" if record.evaluation else "calibration",
            "input": seen.source,
            "tokens": seen.tokens,
            "max_tokens": seen.max_tokens,
            "truncated": seen.truncated,
        },
    )


def _results(found: ArchRecords, samples: int) -> Any:
    from inspect_ai.log import EvalMetric, EvalResults, EvalScore

    scores = [
        EvalScore(
            name=name,
            scorer=name,
            metrics={m: EvalMetric(name=m, value=v) for m, v in metrics.items() if math.isfinite(v)},
        )
        for name, metrics in found.headline.items()
    ]
    return EvalResults(total_samples=samples, completed_samples=samples, scores=scores)


def build_log(run_dir: Path, found: ArchRecords, inputs: Inputs, part: tuple[int, int] = (1, 1)) -> EvalLog:
    """One probe configuration's log, or part k of n of it (`part`): its records' samples."""
    from inspect_ai.log import EvalConfig, EvalDataset, EvalLog, EvalPlan, EvalSpec, EvalStats

    layout = RunLayout(run_dir)
    seeds = list(found.seeds)  # the configuration's, so that every part numbers epochs alike
    epoch = {seed: k + 1 for k, seed in enumerate(seeds)}
    samples = [_sample(r, epoch[r.seed], inputs.get(r.id), found.arch) for r in found.records]
    ids = sorted({s.id for s in samples})
    started, completed = _run_times(layout)
    model = str(_config_value(layout, "model") or "unknown")
    k, n = part
    return EvalLog(
        status="success",
        eval=EvalSpec(
            created=started,
            task=f"{TASK}/{found.arch}",
            task_display_name=f"{run_dir.name}: {found.arch}" + (f" (part {k} of {n})" if n > 1 else ""),
            task_args={
                "budgets": list(found.budgets),
                "objective": found.objective,
                "batch_size": found.batch_size,
            },
            dataset=EvalDataset(
                name=run_dir.name, location=str(layout.scores), samples=len(ids), sample_ids=ids
            ),
            model=model,
            config=EvalConfig(epochs=len(seeds)),
            metadata={
                "run": str(run_dir),
                "arch": found.arch,
                "seeds": seeds,
                "policies": list(found.policies),
                "expert": _config_value(layout, "expert"),
                "inputs": inputs.note,
                "exported_by": f"ctd-harness {_version()} (ctd export inspect)",
                # a log in parts: which one; the results are the whole run's in every part
                **({"part": k, "parts": n} if n > 1 else {}),
            },
        ),
        plan=EvalPlan(name="ctd cascade"),
        results=_results(found, len(samples)),
        stats=EvalStats(started_at=started, completed_at=completed),
        samples=samples,
    )


def _run_times(layout: RunLayout) -> tuple[str, str]:
    """When the run began (run.json's `created`) and when its last stage record was written: the
    viewer shows the difference as the log's duration."""
    log = RunLog.read(layout.run_log)
    finished = [record.at for record in log.stages.values()]
    return log.created, max(finished, default=log.created)


def _config_value(layout: RunLayout, key: str) -> object:
    """One value of the run's config.toml (the monitored model, the expert), None without one."""
    import tomllib

    try:
        document = tomllib.loads(layout.config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document.get("run", document).get(key)


def _version() -> str:
    try:
        return metadata.version("ctd-harness")
    except metadata.PackageNotFoundError:
        return "unknown"


def export_inspect(
    run_dir: Path,
    out: Path | None = None,
    *,
    force: bool = False,
    budgets: tuple[float, ...] | None = None,
    progress: Callable[[str], None] | None = None,
    samples_per_log: int = SAMPLES_PER_LOG,
    in_workers: bool = True,
) -> list[Path]:
    """Write the run's logs (see `log_paths`; a configuration of more than `samples_per_log`
    samples in parts, see `part_paths`) and return their paths. Every input is checked before
    the first log is written; each is written under a temporary name (by worker processes when
    there are several, unless `in_workers` is False) and all are renamed into place together,
    so an interrupted export leaves no file that looks complete. With `force`, an earlier
    export's logs of the same configurations (its parts too) are replaced."""
    try:
        import inspect_ai.log  # noqa: F401
    except ImportError:
        raise InputError(INSPECT_MISSING) from None
    if samples_per_log < 1:
        raise InputError(f"--samples-per-log {samples_per_log}: give at least 1")
    say = progress or (lambda _message: None)
    run_dir = Path(run_dir)
    table = check_finished(run_dir, budgets)
    paths = log_paths(run_dir, out, table.archs)
    earlier: list[Path] = []
    for path in paths.values():
        for old in existing_logs(path):
            if not force:
                raise InputError(f"--out {old}: already exists (--force replaces it)")
            if not old.is_file():
                raise InputError(f"--out {old}: is not a file")
            earlier.append(old)
    test = table.split == "test"
    labels = {str(i): int(y) for i, y in zip(table.id[test], table.label[test], strict=True)}
    say("reading the run's inputs")
    inputs = read_inputs(run_dir, labels)
    parts: list[LogPart] = []
    for arch, path in paths.items():
        say(f"{arch}: reading the sweep's decisions")
        found = read_arch(run_dir, table, arch, budgets=budgets)
        parts += plan_parts(run_dir, found, inputs, path, samples_per_log)
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        for dead in remove_dead_temporaries(path):
            say(f"removed {dead.name}, left by an export that was killed")
    say(f"writing {len(parts)} log{'s' if len(parts) > 1 else ''}")
    write_parts(parts, write_part, say, replaced=earlier, in_workers=in_workers)
    return [part.final for part in parts]


def write_part(part: LogPart) -> None:
    """Build one log and write it to its temporary name (in a worker process)."""
    from inspect_ai.log import write_eval_log

    log = build_log(part.run_dir, part.found, part.inputs, (part.part, part.parts))
    write_eval_log(log, str(part.temporary), format="eval")
