"""`ctd export inspect`: a finished run as inspect_ai `.eval` logs, read back with the real
inspect_ai package and checked against the run's own tables (scores.parquet, the sweep's
decisions.parquet, sweep.csv, baselines.csv, the validation records, the data files)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ctd_cli import CTD, assert_one_line_error, run_ctd

import calibrate
from calibrate import SweepConfig
from harness import calibrate_scores, simulate_scores, write_scores
from harness.data import read_table
from harness.export import INSPECT_MISSING, export_inspect
from harness.run import JOBS, RunLayout, RunLog, StageStatus, read_joint_job

inspect_log = pytest.importorskip("inspect_ai.log")

SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
TARGET = {1: "high-stakes", 0: "low-stakes"}


# ---------------------------------------------------------------- the check against the run


def _decision_rows(run: Path, arch: str) -> dict[tuple[str, int, str], bool]:
    """(id, seed, POLICY@BUDGET) -> delegated, from the sweep's own masks: calibrated policies as
    selected for AUROC, top-k ones at the largest batch size."""
    sweep = RunLayout(run).sweep(arch)
    c = read_table(sweep.decisions).columns
    batch = int(c["batch_size"].max())
    out = {}
    names = ("id", "seed", "policy", "objective", "budget", "batch_size", "delegated")
    for i, seed, policy, objective, budget, size, delegated in zip(*(c[n] for n in names), strict=True):
        calibrated = calibrate.POLICIES[str(policy)].calibrated
        if (calibrated and objective == "auroc") or (not calibrated and int(size) == batch):
            out[str(i), int(seed), f"{policy}@{float(budget):g}"] = bool(delegated)
    return out


def mismatches(log: Any, run: Path, arch: str) -> list[str]:
    """Every way the log's samples differ from the run's tables (empty: they agree)."""
    table = read_table(RunLayout(run).scores).columns
    names = ("id", "seed", "label", "probe", "expert", "group", "arch", "split")
    rows = {
        (str(i), int(s)): (int(y), float(p), float(e), str(g))
        for i, s, y, p, e, g, a, split in zip(*(table[n] for n in names), strict=True)
        if split == "test" and a == arch
    }
    decided = _decision_rows(run, arch)
    rules = {p: calibrate.POLICIES[p].merge for p in calibrate.POLICIES}
    problems = []
    seen = set()
    for sample in log.samples:
        key = (sample.metadata["id"], sample.metadata["seed"])
        seen.add(key)
        if key not in rows:
            problems.append(f"{key}: not a test row of the run")
            continue
        label, probe, expert, group = rows[key]
        if sample.target != TARGET[label] or sample.metadata["group"] != group:
            problems.append(f"{key}: target or group")
        for name, value in (("probe", probe), ("expert", expert)):
            got = sample.scores[name].value
            if not np.isclose(got["score"], value) or got["correct"] != ((value >= 0.5) == (label == 1)):
                problems.append(f"{key}: {name} {got}")
        for (i, seed, name), delegated in decided.items():
            if (i, seed) != key:
                continue
            got = sample.scores.get(name)
            if got is None:
                problems.append(f"{key}: no score {name}")
                continue
            policy = name.split("@")[0]
            merged = expert if rules[policy] == "overwrite" else (probe + expert) / 2
            score = merged if delegated else probe
            if got.value["delegated"] != delegated or not np.isclose(got.value["score"], score):
                problems.append(f"{key}: {name} {got.value}, the run: delegated={delegated} score={score}")
            if got.value["correct"] != ((score >= 0.5) == (label == 1)):
                problems.append(f"{key}: {name} correct")
    if seen != set(rows):
        problems.append(f"samples for {len(seen)} (id, seed) pairs, the run has {len(rows)}")
    return problems


# ---------------------------------------------------------------- a real `ctd eval` run


@pytest.fixture(scope="module")
def exported(made: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The session's finished `ctd eval` run (tests/harness/conftest.py), exported by the CLI."""
    out = tmp_path_factory.mktemp("inspect") / "t.eval"
    done = run_ctd("export", "inspect", "t", "--out", str(out), cwd=made["tmp"], env=made["env"], timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    run = made["tmp"] / "runs" / "t"
    return {"run": run, "out": out, "log": inspect_log.read_eval_log(str(out)), **made}


def test_a_sample_per_test_example_and_seed_with_the_runs_scores(exported: dict) -> None:
    run, log = exported["run"], exported["log"]
    table = read_table(RunLayout(run).scores).columns
    test = table["split"] == "test"
    seeds = np.unique(table["seed"][test])
    assert log.status == "success"
    assert len(log.samples) == np.unique(table["id"][test]).size * seeds.size
    assert sorted({s.epoch for s in log.samples}) == list(range(1, seeds.size + 1))
    assert mismatches(log, run, "attention") == []
    # every cascade of the sweep at every budget of the run, on the evaluation half
    evaluated = [s for s in log.samples if s.metadata["half"] == "evaluation"]
    assert evaluated
    names = {f"{p}@{b:g}" for p in calibrate.DEFAULT_POLICIES for b in (0.3, 0.5, 0.7)}
    assert all(names | {"probe", "expert"} == set(s.scores) for s in evaluated)
    explained = evaluated[0].scores["ctd@0.5"].explanation
    assert "DV score" in explained and "threshold" in explained and "v " in explained


def test_inputs_are_the_conversations_with_their_truncation(exported: dict) -> None:
    log = exported["log"]
    data = {}
    for line in (exported["tmp"] / "data" / "test.jsonl").read_text().splitlines():
        row = json.loads(line)
        data[row["ids"]] = row["inputs"]
    turns = plain = 0
    for sample in log.samples:
        text = data[sample.metadata["id"]]
        assert sample.metadata["input"] == "data"
        if text.startswith("["):
            messages = json.loads(text)
            assert [m.role for m in sample.input] == [m["role"] for m in messages]
            assert [m.text for m in sample.input] == [m["content"] for m in messages]
            turns += 1
        else:
            assert sample.input == text
            plain += 1
        tokens, limit = sample.metadata["tokens"], sample.metadata["max_tokens"]
        assert limit == 96 and 0 < tokens <= limit
        assert sample.metadata["truncated"] == (tokens == limit)
    assert turns and plain
    assert {s.metadata["truncated"] for s in log.samples} == {True, False}  # --max-tokens 96 cuts some


def _numbers(values: np.ndarray) -> np.ndarray:
    """A CSV column as numbers (read_table keeps a CSV's cells as text)."""
    return np.asarray(values, dtype=np.float64)


def test_results_are_the_runs_headline_numbers(exported: dict) -> None:
    run, log = exported["run"], exported["log"]
    results = {s.name: {k: m.value for k, m in s.metrics.items()} for s in log.results.scores}
    sweep = RunLayout(run).sweep("attention")
    baselines = read_table(sweep.baselines).columns
    assert np.isclose(results["probe"]["auroc"], _numbers(baselines["probe_auroc"]).mean())
    assert np.isclose(results["expert"]["accuracy"], _numbers(baselines["expert_accuracy"]).mean())
    c = read_table(sweep.table).columns
    rows = (c["policy"] == "ctd") & (c["objective"] == "auroc") & np.isclose(_numbers(c["budget"]), 0.5)
    assert np.isclose(results["ctd@0.5"]["realised"], _numbers(c["realised"][rows]).mean())
    assert np.isclose(results["ctd@0.5"]["auroc"], _numbers(c["auroc"][rows]).mean())
    for job in JOBS:
        record = json.loads(RunLayout(run).validation("attention").record(job.name).read_text())
        level = next(r for r in record["levels"] if np.isclose(r["alpha"], record["headline_alpha"]))
        assert np.isclose(
            results[f"validation/{job.name}"]["violation_rate"], level["population"]["violation_rate"]
        )
    joint = read_joint_job(RunLayout(run).validation("attention").root)
    assert joint is not None  # the validate stage's joint job ran
    if joint.headline_record is None:  # its headline levels were not validated: nothing to export
        assert "validation/joint" not in results
    else:
        assert np.isclose(
            results["validation/joint"]["violation_rate"],
            joint.headline_record["population"]["violation_rate"],
        )
        assert results["validation/joint"]["budget_level"] == joint.headline["budget"]
    assert log.results.total_samples == len(log.samples)
    # The viewer's duration: from run.json's start to its last stage record.
    run_log = RunLog.read(RunLayout(run).run_log)
    assert log.stats.started_at == run_log.created == log.eval.created
    assert log.stats.completed_at == max(r.at for r in run_log.stages.values()) > run_log.created


def test_the_viewer_lists_and_summarises_the_log(exported: dict) -> None:
    folder = exported["out"].parent
    found = inspect_log.list_eval_logs(str(folder))
    assert [Path(f.name).name for f in found] == [exported["out"].name]
    summaries = inspect_log.read_eval_log_sample_summaries(found[0])
    assert len(summaries) == len(exported["log"].samples)
    assert all(SAFE_ID.fullmatch(str(s.id)) for s in summaries)
    assert all(s.scores and "ctd@0.5" in s.scores for s in summaries if s.scores and len(s.scores) > 2)
    assert [p.name for p in folder.iterdir()] == [exported["out"].name]  # no temporary file left


def test_the_check_sees_a_broken_log(exported: dict) -> None:
    """The control: flip one cascade's decision in the log and the check above names it."""
    run, log = exported["run"], exported["log"].model_copy(deep=True)
    sample = next(s for s in log.samples if "ctd@0.7" in s.scores)
    value = dict(sample.scores["ctd@0.7"].value)
    value["delegated"] = not value["delegated"]
    sample.scores["ctd@0.7"].value = value
    found = mismatches(log, run, "attention")
    assert len(found) == 1 and "ctd@0.7" in found[0], found


# ---------------------------------------------------------------- a run of two configurations


ODD_IDS = {0: "test/with slash", 1: "../up", 2: ".hidden", 3: "x" * 120}


def _simulated_run(folder: Path) -> Path:
    """A finished run of two probe configurations and two seeds, odd ids among its examples."""
    parts = []
    for arch in ("linear", "attention:2"):
        columns = simulate_scores("strong", 60, 2)
        parts.append(columns | {"arch": np.full(columns["label"].size, arch)})
    columns = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    first = sorted(set(columns["id"][columns["split"] == "test"].tolist()))
    renamed = {first[n]: odd for n, odd in ODD_IDS.items()}
    columns["id"] = np.array([renamed.get(i, i) for i in columns["id"].tolist()])
    folder.mkdir(parents=True)
    layout = RunLayout(folder)
    write_scores(layout.scores, columns)
    config = SweepConfig(budgets=(0.2, 0.5), batch_sizes=(16,))
    for arch in ("linear", "attention:2"):
        calibrate_scores(layout.scores, layout.sweep(arch).root, config, arch=arch)
    return folder


@pytest.fixture(scope="module")
def two_archs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _simulated_run(tmp_path_factory.mktemp("runs") / "two")


def test_one_log_per_probe_configuration_with_plain_ids(two_archs: Path, tmp_path: Path) -> None:
    heard: list[str] = []
    paths = export_inspect(two_archs, tmp_path / "logs", progress=heard.append)
    assert sorted(p.name for p in paths) == ["attention_2.eval", "linear.eval"]
    assert heard
    for path, arch in zip(sorted(paths), ("attention:2", "linear"), strict=True):
        log = inspect_log.read_eval_log(str(path))
        assert log.eval.metadata["arch"] == arch
        assert len(log.samples) == 60 * 2
        assert mismatches(log, two_archs, arch) == []
        assert all(s.messages and s.messages[-1].text == s.input for s in log.samples)  # the Messages tab
        pairs = [(s.id, s.epoch) for s in log.samples]
        assert len(set(pairs)) == len(pairs)
        assert all(SAFE_ID.fullmatch(str(i)) and len(str(i)) <= 80 for i, _ in pairs)
        assert set(ODD_IDS.values()) <= {s.metadata["id"] for s in log.samples}
        # no config.toml to find the data by: the inputs are what the run kept, and the log says so
        assert {s.metadata["input"] for s in log.samples} == {"preview"}
        assert "config.toml" in log.eval.metadata["inputs"]
    # the default place: inspect/ in the run folder
    assert export_inspect(two_archs) == [
        RunLayout(two_archs).inspect_log(a) for a in ("attention:2", "linear")
    ]


def test_budgets_narrow_the_cascades(two_archs: Path, tmp_path: Path) -> None:
    (path, *_) = export_inspect(two_archs, tmp_path, budgets=(0.5,))
    log = inspect_log.read_eval_log(str(path))
    cascades = {name for s in log.samples for name in s.scores} - {"probe", "expert"}
    assert cascades == {f"{p}@0.5" for p in calibrate.DEFAULT_POLICIES}


class _Parts:
    """The samples of a configuration's logs in parts, read back as one (for `mismatches`)."""

    def __init__(self, paths: list[Path]) -> None:
        self.logs = [inspect_log.read_eval_log(str(p)) for p in paths]
        self.samples = [s for log in self.logs for s in log.samples]


def test_a_large_configuration_is_written_in_parts_by_worker_processes(
    two_archs: Path, tmp_path: Path
) -> None:
    """Above --samples-per-log, a configuration's log is cut by example into parts, each a log of
    the same run (epochs numbered alike, the whole run's results), together the whole export."""
    out = tmp_path / "logs"
    export_inspect(two_archs, out)
    paths = export_inspect(two_archs, out, force=True, samples_per_log=50)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in paths)  # no log, no temporary
    assert [p.name for p in paths if p.name.startswith("linear")] == [
        f"linear.part{k}-of-3.eval" for k in (1, 2, 3)
    ]
    for arch, slug in (("linear", "linear"), ("attention:2", "attention_2")):
        parts = _Parts([p for p in paths if p.name.startswith(slug + ".")])
        assert mismatches(parts, two_archs, arch) == []
        assert [len(log.samples) for log in parts.logs] == [40, 40, 40]
        owners = {}
        for k, log in enumerate(parts.logs, 1):
            assert log.eval.metadata["part"] == k and log.eval.metadata["parts"] == 3
            assert log.eval.task_display_name.endswith(f"(part {k} of 3)")
            assert {s.epoch for s in log.samples} == {1, 2}
            for s in log.samples:
                assert owners.setdefault(s.id, k) == k  # every seed of an example in one part
            assert [score.name for score in log.results.scores] == [
                score.name for score in parts.logs[0].results.scores
            ]
    # again as one log each: the parts of the earlier export go, with --force only
    done = _ctd("export", "inspect", str(two_archs), "--out", str(out), cwd=tmp_path)
    assert_one_line_error(done, "--out", "part1-of-3.eval", "already exists", "--force")
    assert sorted(export_inspect(two_archs, out, force=True)) == sorted(out.iterdir())
    assert sorted(p.name for p in out.iterdir()) == ["attention_2.eval", "linear.eval"]


def test_a_failed_part_renames_nothing_and_leaves_no_temporary(
    two_archs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import inspect_ai.log

    out = tmp_path / "logs"
    export_inspect(two_archs, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real, calls = inspect_ai.log.write_eval_log, []

    def fails_on_the_third(log: Any, location: str, **kwargs: Any) -> Any:
        calls.append(location)
        if len(calls) == 3:
            raise OSError(28, "No space left on device", location)
        return real(log, location, **kwargs)

    monkeypatch.setattr(inspect_ai.log, "write_eval_log", fails_on_the_third)
    with pytest.raises(OSError):
        export_inspect(two_archs, out, force=True, samples_per_log=50, in_workers=False)
    assert len(calls) == 3
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_what_a_killed_export_left_is_not_a_log_and_the_next_export_removes_it(
    two_archs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export killed outright (`kill -9`: its `finally` never runs) leaves its temporaries. They
    are not named as logs, so inspect's viewer does not list them as parts of the run, and the
    next export removes those of a process that is gone (and only of this configuration)."""
    import inspect_ai.log

    out = tmp_path / "logs"
    out.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = [
            out / f".linear.part1-of-3.eval.{gone.pid}.tmp",  # as a killed export leaves it now
            out / f".linear.part2-of-3.{gone.pid}.tmp.eval",  # as an earlier version named it
        ]
        kept = [out / f".linear.eval.{alive.pid}.tmp", out / f".other.eval.{gone.pid}.tmp"]
        for path in dead + kept:
            path.write_bytes(b"a part written to its end")
        real, written = inspect_ai.log.write_eval_log, []

        def noting(log: Any, location: str, **kwargs: Any) -> Any:
            written.append(location)
            return real(log, location, **kwargs)

        monkeypatch.setattr(inspect_ai.log, "write_eval_log", noting)
        paths = export_inspect(two_archs, out, samples_per_log=50, in_workers=False)
        assert written and all(name.endswith(".tmp") for name in written)  # a temporary is never `*.eval`
        assert [path.exists() for path in dead + kept] == [False, False, True, True]
        listed = [Path(info.name).name for info in inspect_ai.log.list_eval_logs(str(out), recursive=False)]
        assert sorted(listed) == sorted(path.name for path in paths)
    finally:
        alive.kill()
        alive.wait()


def test_a_full_disk_in_a_worker_is_one_line_and_leaves_nothing(two_archs: Path, tmp_path: Path) -> None:
    """A worker's OSError reaches the command line as itself: one line naming the file, exit
    code 3; the parts not started are skipped; no log and no temporary is left."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import errno, inspect_ai.log\n"
        "real = inspect_ai.log.write_eval_log\n"
        "def write_eval_log(log, location, **kwargs):\n"
        "    if '.part2-' in location:\n"
        "        raise OSError(errno.ENOSPC, 'No space left on device', location)\n"
        "    return real(log, location, **kwargs)\n"
        "inspect_ai.log.write_eval_log = write_eval_log\n"
    )
    out = tmp_path / "logs"
    args = ["export", "inspect", str(two_archs), "--out", str(out), "--samples-per-log", "50"]
    done = subprocess.run(
        [sys.executable, "-c", CTD, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])},
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr  # progress lines, then the error's one line
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [done.stderr.strip().splitlines()[-1]]
    assert "No space left on device" in errors[0] and ".part2-of-3." in errors[0]
    assert sorted(out.iterdir()) == []


# ---------------------------------------------------------------- bad input: one line, nothing written


def _ctd(*args: str, cwd: Path, prelude: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", prelude + CTD, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
        env={**os.environ, "CTD_RUNS_DIR": str(cwd / "runs")},
    )  # fmt: skip


def test_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = _ctd("export", "inspect", str(tmp_path / "empty"), "--out", str(tmp_path / "x.eval"), cwd=tmp_path)
    assert_one_line_error(done, "not a run folder")
    assert not (tmp_path / "x.eval").exists()
    assert_one_line_error(_ctd("export", "inspect", "nothing", cwd=tmp_path), "no such run folder")


def test_an_unfinished_run(two_archs: Path, tmp_path: Path) -> None:
    run = tmp_path / "runs" / "unfinished"
    run.mkdir(parents=True)
    layout = RunLayout(run)
    layout.scores.write_bytes(RunLayout(two_archs).scores.read_bytes())
    log = RunLog()
    log.started({})
    log.record("calibrate", StageStatus.INTERRUPTED, 1.0, "")
    log.write(layout.run_log)
    done = _ctd("export", "inspect", "unfinished", cwd=tmp_path)
    assert_one_line_error(done, "stage calibrate interrupted", "not finished")
    assert not layout.inspect.exists()


def test_an_existing_out_is_kept_without_force(two_archs: Path, tmp_path: Path) -> None:
    out = tmp_path / "logs"
    out.mkdir()
    kept = out / "linear.eval"
    kept.write_text("mine")
    done = _ctd("export", "inspect", str(two_archs), "--out", str(out), cwd=tmp_path)
    assert_one_line_error(done, "--out", "already exists", "--force")
    assert kept.read_text() == "mine" and sorted(p.name for p in out.iterdir()) == ["linear.eval"]
    done = _ctd("export", "inspect", str(two_archs), "--out", str(out), "--force", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert inspect_log.read_eval_log(str(kept), header_only=True).status == "success"


def test_out_that_does_not_fit_the_run(two_archs: Path, tmp_path: Path) -> None:
    done = _ctd("export", "inspect", str(two_archs), "--out", str(tmp_path / "one.eval"), cwd=tmp_path)
    assert_one_line_error(done, "--out", "2 probe configurations", "name a folder")
    done = _ctd(
        "export", "inspect", str(two_archs), "--budgets", "0.3", "--out", str(tmp_path / "d"), cwd=tmp_path
    )
    assert_one_line_error(done, "--budgets 0.3", "not a budget of the run's sweep")
    assert sorted(tmp_path.iterdir()) == []


def test_without_inspect_ai_one_line_names_the_extra(two_archs: Path, tmp_path: Path) -> None:
    hide = "import sys; sys.modules['inspect_ai'] = None; sys.modules['inspect_ai.log'] = None\n"
    done = _ctd("export", "inspect", str(two_archs), "--out", str(tmp_path / "d"), cwd=tmp_path, prelude=hide)
    assert_one_line_error(done, INSPECT_MISSING)
    assert "pip install -e '.[inspect]'" in done.stderr
    assert not (tmp_path / "d").exists()
