"""`ctd eval --expert small,large`: a cascade of two experts end to end through the real CLI (the
embedded monitored model, two fault-injecting experts that count requests): the later expert
asked once per example, its DV probe, the cascade's scores table, a rerun that asks nothing, and a
run of the first expert alone whose files are those of the cascade run, byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from ctd_cli import assert_one_line_error, run_ctd
from eval_data import FAST, SIZES, eval_env, write_tagged_data
from fault_server import FaultPlan, RunningServer, item_score

from harness import read_scores, read_table


def tagged_label(item: int) -> int:
    """The label of tagged item N: each split of SIZES in turn, its first half high-stakes."""
    for size in SIZES.values():
        if item < size:
            return int(item < size // 2)
        item -= size
    raise ValueError("no such item")


def larger_expert(item: int) -> float:
    """A better expert than the fault server's: mostly right, with some noise."""
    return 0.1 + 0.6 * tagged_label(item) + 0.3 * item_score(item)


def stage_status(out: str) -> dict[str, str]:
    return {s["stage"]: s["status"] for s in json.loads(out)["stages"]}


def test_a_cascade_of_two_experts_runs_end_to_end_and_one_expert_stays_as_it_was(tmp_path: Path) -> None:
    env = eval_env(tmp_path)
    experts_file = tmp_path / "experts.toml"
    env["CTD_EXPERTS_FILE"] = str(experts_file)
    data = write_tagged_data(tmp_path / "data")
    with RunningServer() as small, RunningServer(score=larger_expert) as large:
        experts_file.write_text(
            f'[experts.small]\nbase_url = "{small.url}"\nmodel = "fault-model"\n\n'
            f'[experts.large]\nbase_url = "{large.url}"\nmodel = "fault-model"\n'
        )
        args = ["eval", *FAST, "--json"] + [a for token in data for a in ("--data", token)]
        done = run_ctd(*args, "--name", "two", "--expert", "small,large", cwd=tmp_path, env=env, timeout=600)
        assert done.returncode == 0, done.stderr
        assert stage_status(done.stdout) == dict.fromkeys(
            ("probe", "query", "dv", "cascade", "calibrate", "validate", "report"), "ran"
        )
        asked = {k: v for k, v in large.server.counts.requests.items() if k >= 0}
        examples = SIZES["dev"] + SIZES["test"]
        assert len(asked) == examples and set(asked.values()) == {1}

        run = tmp_path / "runs" / "two"
        cascade = read_scores(run / "cascade" / "scores.parquet")
        assert cascade.stages == 2
        first = read_scores(run / "scores.parquet")
        np.testing.assert_array_equal(cascade.expert, first.expert)
        # The later expert's raw answers are the large server's scores, one per dev and test example.
        raw = read_table(run / "cascade" / "query-2" / "expert_scores.parquet").columns
        served = sorted(round(larger_expert(item), 6) for item in asked)
        assert sorted(round(float(score), 6) for score in raw["expert"]) == served
        test = cascade.split == "test"
        assert np.isfinite(cascade.later_dv[0][test]).all() and np.isnan(cascade.later_dv[0][~test]).all()
        by_seed = cascade.cascade_scores()
        assert by_seed[0].stages == 2 and by_seed[0].n == SIZES["test"]
        # The validate stage validated the cascade, and the report shows it.
        (record_path,) = sorted((run / "validate" / "cascade").glob("*.json"))
        record = json.loads(record_path.read_text())
        assert record["experts"] == ["small", "large"] and set(record["levels"]) == {"budget-1", "budget-2"}
        report = (run / "report" / "report.md").read_text()
        assert "## Cascade of experts" in report and "expert 1: small, expert 2: large" in report

        again = run_ctd(*args, "--name", "two", "--expert", "small,large", cwd=tmp_path, env=env, timeout=600)
        assert again.returncode == 0, again.stderr
        assert set(stage_status(again.stdout).values()) == {"skipped"}
        assert {k: v for k, v in large.server.counts.requests.items() if k >= 0} == asked

        one = run_ctd(*args, "--name", "one", "--expert", "small", cwd=tmp_path, env=env, timeout=600)
        assert one.returncode == 0, one.stderr
        assert "cascade" not in stage_status(one.stdout)
    single = tmp_path / "runs" / "one"
    assert not (single / "cascade").exists() and not (single / "validate" / "cascade").exists()
    assert "## Cascade of experts" not in (single / "report" / "report.md").read_text()
    # The first stage's tables and everything calibrated from them: the same bytes with or without
    # a later expert (query/ differs only where it says its answers came from the cache).
    compared = [
        p.relative_to(single)
        for p in sorted(single.rglob("*"))
        if p.is_file()
        and p.suffix in (".parquet", ".csv", ".jsonl")
        and p.relative_to(single).parts[0] in ("dv", "calibrate", "validate")
    ]
    compared.append(Path("scores.parquet"))
    assert len(compared) > 5
    for relative in compared:
        assert (single / relative).read_bytes() == (run / relative).read_bytes(), relative
    toml = (single / "config.toml").read_text()
    assert "\ncascade =" not in toml and 'cascade = ["large"]' in (run / "config.toml").read_text()
    # The cascade's run back to one expert (every answer cached): its earlier cascade tables go,
    # and the report says nothing of a cascade.
    back = run_ctd(*args, "--name", "two", "--expert", "small", cwd=tmp_path, env=env, timeout=600)
    assert back.returncode == 0, back.stderr
    assert not (run / "cascade").exists() and not (run / "validate" / "cascade").exists()
    assert "## Cascade of experts" not in (run / "report" / "report.md").read_text()


def test_a_later_expert_must_be_a_registered_name_other_than_the_one_before(tmp_path: Path) -> None:
    env = eval_env(tmp_path)
    for expert, fragment in (
        ("smollm2,http://127.0.0.1:9/v1", "a later expert of a cascade must be a registered name"),
        ("smollm2,smollm2", "'smollm2' follows itself"),
        ("smollm2,,llama-1b", "an empty name between commas"),
        (",llama-1b", "an empty name between commas"),
        # A later expert's typo is told before the first stage, not after hours of work.
        ("smollm2,lrage", "unknown expert 'lrage'"),
        ("smollm2,llama-1b,gemma-27b,llama-guard-3-1b", "4 experts in the cascade, at most 3"),
    ):
        done = run_ctd("eval", "--expert", expert, cwd=tmp_path, env=env, timeout=120)
        assert_one_line_error(done, fragment)
    assert not (tmp_path / "runs").exists()


def test_retry_failed_asks_a_later_expert_again_for_what_it_failed_on(tmp_path: Path) -> None:
    """The later expert fails on two test examples: the cascade leaves them out and says so; once
    it answers them, --retry-failed asks it for those two and no other, and the cascade has them."""
    env = eval_env(tmp_path)
    experts_file = tmp_path / "experts.toml"
    env["CTD_EXPERTS_FILE"] = str(experts_file)
    data = write_tagged_data(tmp_path / "data")
    first_test_item = SIZES["train"] + SIZES["dev"]
    broken = frozenset({first_test_item + 2, first_test_item + 3})
    with RunningServer() as small, RunningServer(FaultPlan(broken=broken), score=larger_expert) as large:
        experts_file.write_text(
            f'[experts.small]\nbase_url = "{small.url}"\nmodel = "fault-model"\n\n'
            f'[experts.large]\nbase_url = "{large.url}"\nmodel = "fault-model"\n'
        )
        args = ["eval", *FAST, "--json", "--name", "two", "--expert", "small,large"]
        args += [a for token in data for a in ("--data", token)]
        done = run_ctd(*args, cwd=tmp_path, env=env, timeout=600)
        assert done.returncode == 0, done.stderr
        cascade = next(s for s in json.loads(done.stdout)["stages"] if s["stage"] == "cascade")
        assert "later experts failed on 2 (rerun with --retry-failed" in cascade["detail"]
        run = tmp_path / "runs" / "two"

        def test_ids(table: Path) -> set[str]:
            scores = read_scores(table)
            return set(scores.id[scores.split == "test"].tolist())

        every = test_ids(run / "scores.parquet")
        assert len(every - test_ids(run / "cascade" / "scores.parquet")) == len(broken)  # left out
        asked = {k: v for k, v in large.server.counts.requests.items() if k >= 0}

        large.server.plan = FaultPlan()  # the expert answers them now
        again = run_ctd(*args, "--retry-failed", cwd=tmp_path, env=env, timeout=600)
        assert again.returncode == 0, again.stderr
        status = stage_status(again.stdout)
        assert status["query"] == "skipped" and status["cascade"] == "ran"
        now = {k: v for k, v in large.server.counts.requests.items() if k >= 0}
        assert {k for k in now if now[k] != asked.get(k)} == set(broken)  # those two, no other
        assert test_ids(run / "cascade" / "scores.parquet") == every
