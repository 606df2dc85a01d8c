"""`--limit N`: at most N examples per split, stratified by group and label, deterministic, and
part of the run's name and fingerprints as the data is."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pytest
from ctd_cli import assert_one_line_error, free_port, run_ctd

from harness.data import SPLITS, load_data

# Private: the stratified --limit, unit-tested.
from harness.data._limit import stratified_limit
from harness.run import RunConfig, RunLog, StageStatus


def strata(examples) -> Counter[tuple[str, int]]:  # type: ignore[no-untyped-def]
    return Counter((e.group, e.label) for e in examples)


@pytest.mark.parametrize("limit", [2, 7, 24, 50, 159])
def test_each_split_keeps_limit_examples_in_the_proportions_of_its_strata(limit: int) -> None:
    full = load_data(None)
    limited = load_data(None, limit=limit)
    for split in SPLITS:
        kept, every = limited[split], full[split]
        assert len(kept) == min(limit, len(every))
        assert {e.id for e in kept} <= {e.id for e in every}
        assert [e.id for e in kept] == sorted(e.id for e in kept)  # still in id order
        # Largest remainders: each stratum within one example of its exact share.
        for key, size in strata(every).items():
            share = len(kept) * size / len(every)
            assert abs(strata(kept)[key] - share) < 1, (split, key, strata(kept)[key], share)


def test_the_subset_depends_on_content_only_and_a_larger_limit_keeps_a_smaller_ones() -> None:
    test = load_data(None)["test"]
    small = stratified_limit(test, 16)
    assert [e.id for e in stratified_limit(list(reversed(test)), 16)] == [e.id for e in reversed(small)]
    assert {e.id for e in small} <= {e.id for e in stratified_limit(test, 40)}
    assert [e.id for e in small] != [e.id for e in test[:16]]  # not simply the first rows


def test_a_limit_at_or_above_the_split_size_changes_nothing() -> None:
    full, same = load_data(None), load_data(None, limit=10_000)
    assert all(full.content_hash(s) == same.content_hash(s) for s in SPLITS)
    limited = load_data(None, limit=40)
    assert all(full.content_hash(s) != limited.content_hash(s) for s in SPLITS)  # stage fingerprints


def test_the_limit_is_part_of_the_run_name() -> None:
    assert RunConfig().run_name == "smollm2-smollm2-builtin"
    assert RunConfig(limit=40).run_name == "smollm2-smollm2-builtin-limit40"
    assert RunConfig(limit=40, data=("train=a.jsonl", "dev=b.jsonl")).run_name.endswith("-limit40")
    assert "limit = 40" in RunConfig(limit=40).to_toml()


def test_eval_with_limit_writes_the_limited_split_sizes(tmp_path: Path) -> None:
    """Through the real command on the built-in data, stopped cheaply at the endpoint check (a
    closed port): the run log has already recorded the split sizes under the limited run's name."""
    env = {"CTD_RUNS_DIR": str(tmp_path / "runs"), "CTD_CACHE": str(tmp_path / "cache.sqlite")}
    url = f"http://127.0.0.1:{free_port()}/v1"
    args = ("eval", "--limit", "40", "--budgets", "0.5,0.7", "--expert", url, "--expert-model", "m")
    result = run_ctd(*args, "--serve", "never", cwd=tmp_path, env=env)
    assert_one_line_error(result, "cannot reach")
    runs = [p.name for p in (tmp_path / "runs").iterdir()]
    assert len(runs) == 1 and runs[0].endswith("-builtin-limit40"), runs
    log = (tmp_path / "runs" / runs[0] / "log.txt").read_text()
    assert "40 train, 40 dev, 40 test" in log, log


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("eval", "--limit", "0"), "--limit 0: must be at least 1"),
        (("probe", "--out", "p", "--limit", "-3"), "--limit -3: must be at least 1"),
        # The default budgets need a larger test split than 40 examples can give: said, not run.
        (("eval", "--limit", "40"), "budget 0.05 of the default --budgets: the test split has 40 examples"),
        (("eval", "--limit", "40", "--budgets", "0.1,0.5"), "--budgets 0.1: the test split has 40 examples"),
    ],
)
def test_bad_limits_are_one_line(args: tuple[str, ...], fragment: str, tmp_path: Path) -> None:
    env = {"CTD_RUNS_DIR": str(tmp_path / "runs")}
    assert_one_line_error(run_ctd(*args, cwd=tmp_path, env=env), fragment)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "p").exists()


def test_a_too_small_test_split_names_the_budgets_that_would_work(tmp_path: Path) -> None:
    """Plain `--limit 40`: D_cal holds 14 rows, which certify budgets of 1 - 0.1^(1/14) = 0.152 or
    more; the refusal names the default budgets from 0.2 on, and those budgets pass the check
    (the same command stops only at the endpoint, a closed port)."""
    env = {"CTD_RUNS_DIR": str(tmp_path / "runs"), "CTD_CACHE": str(tmp_path / "cache.sqlite")}
    refused = run_ctd("eval", "--limit", "40", cwd=tmp_path, env=env)
    assert_one_line_error(refused, "D_cal holds 14", "needs at least 45", "budgets of 0.152 or more")
    (named,) = re.findall(r"pass --budgets (\S+)", refused.stderr)
    assert named == ",".join(f"{b:g}" for b in RunConfig().budgets if b >= 0.2)
    assert not (tmp_path / "runs").exists()
    url = f"http://127.0.0.1:{free_port()}/v1"
    args = ("eval", "--limit", "40", "--budgets", named, "--expert", url, "--expert-model", "m")
    assert_one_line_error(run_ctd(*args, "--serve", "never", cwd=tmp_path, env=env), "cannot reach")
    # Asked only for budgets that 14 rows cannot certify: none to keep, the smallest that could.
    too_low = run_ctd("eval", "--limit", "40", "--budgets", "0.05,0.1", cwd=tmp_path, env=env)
    assert_one_line_error(too_low, "none of those asked for can; pass budgets of 0.16 or more")


def test_runs_shows_the_limit_in_the_table_and_in_json(tmp_path: Path) -> None:
    """`ctd runs` tells a --limit run from the full run on the same built-in data: a limit
    column (all for the full run) and a `limit` field in --json, from run.json's configuration
    as `ctd eval` records it."""
    runs = tmp_path / "runs"
    for config in (RunConfig(), RunConfig(limit=40, budgets=(0.5, 0.7))):
        log = RunLog()
        log.started(asdict(config))
        log.record("probe", StageStatus.RAN, 3.0, "trained")
        (runs / config.run_name).mkdir(parents=True)
        log.write(runs / config.run_name / "run.json")
    listed = run_ctd("runs", "--json", "--runs-dir", str(runs), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    by_name = {r["name"]: r for r in json.loads(listed.stdout)["runs"]}
    assert by_name["smollm2-smollm2-builtin"]["limit"] is None
    assert by_name["smollm2-smollm2-builtin-limit40"]["limit"] == 40
    assert {r["data"] for r in by_name.values()} == {"built-in"}
    table = run_ctd("runs", "--runs-dir", str(runs), cwd=tmp_path, env={"COLUMNS": "250"})
    assert table.returncode == 0, table.stderr
    header = next(line for line in table.stdout.splitlines() if " limit " in line)
    rows = {line.split("│")[1].strip(): line for line in table.stdout.splitlines() if "smollm2-" in line}
    column = [cell.strip() for cell in header.split("┃")].index("limit")
    assert rows["smollm2-smollm2-builtin"].split("│")[column].strip() == "all", table.stdout
    assert rows["smollm2-smollm2-builtin-limit40"].split("│")[column].strip() == "40", table.stdout
    assert re.search(r"built-in\s*│\s*40\s*│", table.stdout), table.stdout
