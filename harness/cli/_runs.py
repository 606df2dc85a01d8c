"""`ctd runs`: the runs under the runs root, from their run.json."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ..run import Manifests, Roots, RunLayout, RunLog, RunLogError, StageRecord, StageStatus, listed_paths
from ._common import clean_errors, print_json, stdout

__all__ = ["register"]

_STOPPED = (StageStatus.RUNNING, StageStatus.FAILED, StageStatus.INTERRUPTED)
_PATH = re.compile(r"[^=,:\s]*/[^,\s]+")  # a path inside a data spec token


@dataclass(frozen=True)
class RunSummary:
    """One run folder as `ctd runs` lists it."""

    name: str
    path: str
    status: str  # done, incomplete, "failed at STAGE", "interrupted at STAGE", "running STAGE", unreadable
    data: str  # the data spec tokens, or "built-in"
    limit: int | None  # --limit: at most this many examples per split (None: every example)
    model: str
    expert: str
    invocations: int
    last_invocation: str | None  # UTC time the latest `ctd eval` started
    stages: dict[str, dict[str, Any]]  # each stage's latest record that did work (see RunLog)
    problem: str = ""  # why run.json could not be read
    cost_usd: float | None = None  # dollars spent at the expert, every invocation's; None: none recorded
    changed: list[str] = field(default_factory=list)  # outputs whose sha256 no longer matches their manifest


def summarise(layout: RunLayout) -> RunSummary:
    """What run.json says about a run: the latest invocation's configuration and status, and the
    record of each stage's latest work."""
    try:
        log = RunLog.read(layout.run_log)
    except RunLogError as error:
        return RunSummary(
            layout.name, str(layout.root), "unreadable", "", None, "", "", 0, None, {}, str(error)
        )
    latest = log.invocations[-1] if log.invocations else None
    config = latest.config if latest else {}
    changed = _changed_on_disk(layout, log)
    status = _status(latest.stages if latest else {})
    costs = log.costs()
    return RunSummary(
        name=layout.name,
        path=str(layout.root),
        status=f"changed on disk: {listed_paths(changed)}" if changed else status,
        data=" ".join(config.get("data") or ()) or "built-in",
        limit=config.get("limit"),
        model=str(config.get("model", "")),
        expert=str(config.get("expert", "")),
        invocations=len(log.invocations),
        last_invocation=latest.started if latest else None,
        stages={name: asdict(record) for name, record in log.stages.items()},
        changed=changed,
        cost_usd=sum(costs.values()) if costs else None,
    )


def _changed_on_disk(layout: RunLayout, log: RunLog) -> list[str]:
    """The outputs, of every stage with a manifest, edited, truncated or deleted since the stage
    wrote them (their sha256 against the manifest's): such a run is not "done" whatever run.json
    says, and its next `ctd eval` redoes those stages."""
    manifests = Manifests(layout)
    return [path for stage in log.stages for path in manifests.changed_outputs(stage)]


def _status(stages: dict[str, StageRecord]) -> str:
    """The latest invocation's outcome: the stage it stopped at, done when the report stage
    ran or was up to date, else incomplete."""
    for name, record in stages.items():
        if record.status in _STOPPED:
            return f"running {name}" if record.status is StageStatus.RUNNING else f"{record.status} at {name}"
    report = stages.get("report")
    return (
        "done"
        if report is not None and report.status in (StageStatus.RAN, StageStatus.SKIPPED)
        else "incomplete"
    )


def _short_data(data: str) -> str:
    """Data spec tokens with each path cut to its file name, for the table."""
    return _PATH.sub(lambda match: Path(match.group()).name, data)


def _when(record: dict[str, Any]) -> str:
    """'11-25 01:02 12.3s' (UTC; the year is in --json) for a stage that ran; its status first
    when it did not finish."""
    at = str(record["at"]).replace("T", " ")[5:16]
    seconds = f" {record['seconds']:.1f}s" if record["seconds"] is not None else ""
    status = "" if record["status"] == StageStatus.RAN else f"{record['status']} "
    return f"{status}{at}{seconds}"


def runs_command(
    *,
    runs_dir: Annotated[
        Path | None, typer.Option("--runs-dir", help="Runs root (default: $CTD_RUNS_DIR or ./runs).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the runs as one JSON object.")] = False,
) -> None:
    """List the runs under the runs root: status, data, --limit (examples per split; "all"
    without one), model, expert, the dollars spent at the expert (every invocation's), and when
    each stage last ran (UTC), from each run's run.json.
    Every output is checked against the sha256 its stage's manifest recorded: a run with an
    output edited, truncated or deleted since shows "changed on disk" (and its next `ctd eval`
    redoes the stages concerned)."""
    roots = Roots.resolve(runs_dir)
    layouts = (
        [RunLayout(p) for p in sorted(roots.runs.iterdir()) if RunLayout(p).run_log.is_file()]
        if roots.runs.is_dir()
        else []
    )
    runs = [summarise(layout) for layout in layouts]
    if json_out:
        print_json({"runs_root": str(roots.runs), "runs": [asdict(run) for run in runs]})
        return
    if not runs:
        where = escape(str(roots.runs.absolute()))
        if roots.runs.is_dir():
            stdout.print(f"no runs under {where}")
        else:  # the likeliest reason: another folder than the runs were made in
            stdout.print(
                f"no runs folder at {where} (`ctd eval` makes it; --runs-dir or $CTD_RUNS_DIR names another)"
            )
        return
    stage_names = list(dict.fromkeys(name for run in runs for name in run.stages))
    table = Table(title=f"runs under {escape(str(roots.runs))} (stage times: when each last ran, UTC)")
    for column in ("run", "status", "data", "limit", "model", "expert", "cost", *stage_names):
        # A long URL or path is folded, never cut; a run's name (what the other commands take)
        # and its status are kept whole.
        table.add_column(column, overflow="fold", no_wrap=column in ("run", "status"))
    for run in runs:
        limit = "" if run.status == "unreadable" else "all" if run.limit is None else f"{run.limit:,}"
        cost = "-" if run.cost_usd is None else f"${run.cost_usd:.4f}"
        cells = [run.name, run.status, _short_data(run.data), limit, run.model, run.expert, cost]
        cells += [_when(run.stages[name]) if name in run.stages else "-" for name in stage_names]
        table.add_row(*(escape(cell) for cell in cells))
    stdout.print(table)
    for run in runs:
        if run.problem:
            stdout.print(f"{escape(run.name)}: {escape(run.problem)}")


def register(app: typer.Typer) -> None:
    app.command("runs")(clean_errors(runs_command))
