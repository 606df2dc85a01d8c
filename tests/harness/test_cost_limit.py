"""Dollars through the real CLI: `ctd query --cost-limit` stops before a request would pass the
limit (spent <= limit, from the token counts the cache stores), exits 4 with one line, and a
rerun with a higher limit finishes with every example asked once in all; `ctd eval` counts what
its earlier invocations spent (run.json) and shows the dollars in run.json, `ctd runs` and the
report."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from ctd_cli import assert_one_line_error, run_ctd
from eval_data import FAST, SIZES, eval_env, write_tagged_data
from fault_server import FaultPlan, RunningServer

from experts import Price, build_request, load_template

# Private: the exit code a cost limit ends a run with.
from harness._errors import EXIT_COST
from harness.run import RunCosts, RunLog, StageStatus

PRICE_INPUT, PRICE_OUTPUT = 3.0, 15.0  # USD per million tokens


def cache_usd(path: Path) -> float:
    """What the answers in the cache cost, from the token counts the server reported."""
    with sqlite3.connect(path) as db:
        prompt, completion = db.execute(
            "SELECT SUM(prompt_tokens), SUM(completion_tokens) FROM scores"
        ).fetchone()
    return ((prompt or 0) * PRICE_INPUT + (completion or 0) * PRICE_OUTPUT) / 1e6


def register(folder: Path, url: str) -> dict[str, str]:
    """A priced expert at `url`, eight requests in flight, and the cache beside it."""
    registry = folder / "experts.toml"
    registry.write_text(
        f'[experts.paid]\nbase_url = "{url}"\nmodel = "fault-model"\nconcurrency = 8\n'
        f"price_input = {PRICE_INPUT}\nprice_output = {PRICE_OUTPUT}\n"
    )
    return {"CTD_CACHE": str(folder / "cache.sqlite"), "CTD_EXPERTS_FILE": str(registry)}


def item_requests(server: RunningServer) -> dict[int, int]:
    """Requests per example; the endpoint checks (no item tag, key -1) left out."""
    return {k: v for k, v in server.server.counts.requests.items() if k >= 0}


def test_query_stops_at_the_cost_limit_and_a_higher_limit_finishes(tmp_path: Path) -> None:
    rows = [
        {"ids": f"ex{i}", "inputs": f"item-{i}: is this risky?", "labels": "low-stakes"} for i in range(60)
    ]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    limit = 0.02  # ~$0.0008 an answer (~260 prompt tokens): about a third of the 60
    with RunningServer(FaultPlan(delay=0.02)) as server:
        env = register(tmp_path, server.url)
        args = ("query", "--data", "data.jsonl", "--out", "out.csv", "--expert", "paid")
        stopped = run_ctd(*args, "--cost-limit", str(limit), cwd=tmp_path, env=env)
        assert stopped.returncode == EXIT_COST, stopped.stderr
        lines = stopped.stderr.strip().splitlines()
        last = lines[-1]
        assert last.startswith("error: cost limit reached: $") and "--cost-limit" in last, last
        assert "Traceback" not in stopped.stderr
        assert any("about 60 requests, about $" in line for line in lines), lines
        spent = cache_usd(tmp_path / "cache.sqlite")
        assert 0 < spent <= limit
        assert not (tmp_path / "out.csv").exists()  # nothing half-written
        asked = sum(item_requests(server).values())
        assert 0 < asked < 60

        finished = run_ctd(*args, "--cost-limit", "1", "--json", cwd=tmp_path, env=env)
        assert finished.returncode == 0, finished.stderr
        summary = json.loads(finished.stdout)
        assert summary["cached"] == asked and summary["scored"] == 60 - asked
        assert item_requests(server) == dict.fromkeys(range(60), 1)  # nobody paid twice
    assert abs(summary["cost_usd"] + spent - cache_usd(tmp_path / "cache.sqlite")) < 1e-9


def test_a_cost_limit_on_an_expert_without_a_price_is_refused_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    """Every request of an unpriced expert (a URL, or an entry without prices) counts $0, so a
    limit would never stop the run: one line naming the expert and how to price it, no request
    (the endpoint check's neither), exit 2. Without the limit the run goes on, saying why it is $0."""
    (tmp_path / "data.jsonl").write_text(json.dumps({"ids": "a", "inputs": "item-1: hi", "labels": 0}) + "\n")
    with RunningServer() as server:
        env = {"CTD_CACHE": str(tmp_path / "cache.sqlite")}
        args = ("query", "--data", "data.jsonl", "--out", "out.csv", "--expert-url", server.url)
        args += ("--expert-model", "fault-model")
        refused = run_ctd(*args, "--cost-limit", "0.001", cwd=tmp_path, env=env)
        assert_one_line_error(refused, "--cost-limit 0.001", "has no price", "price_input")
        assert sum(server.server.counts.requests.values()) == 0
        free = run_ctd(*args, cwd=tmp_path, env=env)
        assert free.returncode == 0, free.stderr
        assert "costs nothing (no price set for it)" in free.stderr
        # `ctd eval` says so before its first stage: no run folder, nothing asked.
        asked = sum(server.server.counts.requests.values())
        run_env = {**env, "CTD_RUNS_DIR": str(tmp_path / "runs")}
        evaluated = run_ctd(
            "eval", "--expert", server.url, "--expert-model", "fault-model", "--cost-limit", "1",
            cwd=tmp_path, env=run_env, timeout=300,
        )  # fmt: skip
        assert_one_line_error(evaluated, "--cost-limit 1", "has no price")
        assert not (tmp_path / "runs").exists() and sum(server.server.counts.requests.values()) == asked


def test_eval_counts_earlier_spending_and_shows_the_dollars(tmp_path: Path) -> None:
    data = write_tagged_data(tmp_path / "data")
    env = eval_env(tmp_path)
    examples = SIZES["dev"] + SIZES["test"]
    with RunningServer() as server:
        env |= {"CTD_EXPERTS_FILE": register(tmp_path, server.url)["CTD_EXPERTS_FILE"]}
        args = ["eval", "--name", "t", "--expert", "paid", *FAST]
        for token in data:
            args += ["--data", token]
        stopped = run_ctd(*args, "--cost-limit", "0.02", cwd=tmp_path, env=env, timeout=600)
        assert stopped.returncode == EXIT_COST, stopped.stderr
        run_log = json.loads((tmp_path / "runs" / "t" / "run.json").read_text())
        first = run_log["cost_usd"]["query"]
        cache = Path(env["CTD_CACHE"])
        assert 0 < cache_usd(cache) <= first <= 0.02
        assert run_log["stages"]["query"]["status"] == "failed"

        # The limit is the run's: what the first invocation spent counts against it, so a rerun
        # with that limit stops before its first request.
        asked = sum(item_requests(server).values())
        low = run_ctd(*args, "--cost-limit", f"{first:.6f}", cwd=tmp_path, env=env, timeout=600)
        assert low.returncode == EXIT_COST, low.stderr
        assert sum(item_requests(server).values()) == asked

        done = run_ctd(*args, "--cost-limit", "1", "--json", cwd=tmp_path, env=env, timeout=600)
        assert done.returncode == 0, done.stderr
        # Every dev and test example (tagged after the train split's) asked once in all.
        first_item = SIZES["train"]
        assert item_requests(server) == dict.fromkeys(range(first_item, first_item + examples), 1)
    run_log = json.loads((tmp_path / "runs" / "t" / "run.json").read_text())
    total = run_log["cost_usd"]["query"]
    assert abs(total - cache_usd(cache)) < 1e-9 and total > first
    runs = run_ctd("runs", "--json", cwd=tmp_path, env=env)
    (listed,) = json.loads(runs.stdout)["runs"]
    assert abs(listed["cost_usd"] - total) < 1e-9
    assert f"${total:.4f}" in run_ctd("runs", cwd=tmp_path, env=env).stdout
    report = (tmp_path / "runs" / "t" / "report" / "report.md").read_text()
    assert f"${total:.4f}" in report


def test_batch_out_prices_the_batch_with_its_discount(tmp_path: Path) -> None:
    rows = [
        {"ids": f"ex{i}", "inputs": f"item-{i}: is this risky?", "labels": "low-stakes"} for i in range(10)
    ]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    env = register(tmp_path, "http://127.0.0.1:9/v1")  # never asked: a batch sends nothing
    args = ("query", "--data", "data.jsonl", "--expert", "paid", "--json", "--batch-out")
    full = json.loads(run_ctd(*args, "full.jsonl", cwd=tmp_path, env=env).stdout)
    registry = Path(env["CTD_EXPERTS_FILE"])
    registry.write_text(registry.read_text() + "batch_discount = 0.5\n")
    # A new file each; the first file's requests were never read back: released to be written again.
    assert run_ctd("cache", "release-batch", "full.jsonl", cwd=tmp_path, env=env).returncode == 0
    half = json.loads(run_ctd(*args, "half.jsonl", cwd=tmp_path, env=env).stdout)
    assert full["usd"] > 0 and abs(half["usd"] - full["usd"] / 2) < 1e-12
    assert (
        half["estimate"].startswith("about 10 batch lines, about $") and "batch discount" in half["estimate"]
    )


def test_a_running_stage_s_dollars_reach_run_json_while_it_spends(tmp_path: Path) -> None:
    """What `ctd eval` does (harness._eval: RunCosts.record writes the running stage's record):
    the dollars a stage has spent are in run.json while it runs, at most `record_every` seconds
    late, so a run killed outright (SIGKILL, a dead machine) is read back by its rerun with
    what it spent, and the cost limit still holds for the run."""
    path = tmp_path / "run.json"
    run_log = RunLog()
    run_log.started({})
    run_log.record("query", StageStatus.RUNNING, None, "")

    def record(stage: str, usd: float) -> None:
        run_log.record(stage, StageStatus.RUNNING, None, "", usd)
        run_log.write(path)

    costs = RunCosts(record=record, record_every=0.0)
    spend = costs.spend_for("query", Price(input=PRICE_INPUT, output=PRICE_OUTPUT), limit=1.0)
    request = build_request("next-token", load_template("stakes-v1"), "item-1", "m", top_logprobs=5)
    for prompt_tokens in (1000, 2000):
        held = spend.reserve_now(request)
        held.answered(held.sending(), {"usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1}})
        held.close()
    # Killed here: no stage end is recorded. The rerun reads what the stage had spent.
    expected = (3000 * PRICE_INPUT + 2 * PRICE_OUTPUT) / 1e6
    assert RunLog.read(path).costs() == {"query": expected}
    assert RunLog.read(path).stages["query"].status is StageStatus.RUNNING

    throttled = RunCosts(record=lambda stage, usd: calls.append(usd), record_every=3600.0)
    calls: list[float] = []
    spend = throttled.spend_for("query", Price(input=PRICE_INPUT, output=PRICE_OUTPUT), limit=1.0)
    for _ in range(3):
        held = spend.reserve_now(request)
        held.answered(held.sending(), {"usage": {"prompt_tokens": 10, "completion_tokens": 1}})
        held.close()
    assert len(calls) == 1  # the first close, then no more than one write per record_every
