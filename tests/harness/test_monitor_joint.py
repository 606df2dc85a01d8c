"""`ctd monitor calibrate --budget A --accuracy B [--fnr C]`: a joint bundle from the shared run
(`made`), certified by calibrate's joint control. Its record names every level and the counts at
the threshold are the run's; `ctd monitor audit` redoes it and tells a tampered level; serving it
delegates exactly where DV > threshold, shows each certified level on /metrics and refuses a cap
on expert calls; bad combinations of levels are one line, exit code 2, nothing written."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from ctd_cli import assert_one_line_error, free_port, run_ctd
from monitor_run import conversations_of, replay, serve, stop
from prometheus_client.parser import text_string_to_metric_families

import calibrate
from harness.data import read_table

# The small run's cascade is weak (see test_monitor_bundle's accuracy bundle), and its probe
# misses about a third of the positives: lenient levels, with the shared bundle's budget.
LEVELS = ("--budget", "0.5", "--accuracy", "0.2", "--fnr", "0.7")


@pytest.fixture(scope="module")
def joint(made: dict) -> dict:
    """A joint bundle of the shared run whose threshold delegates: as for the shared bundle
    (D_est has 19 rows: on some cuts only "never delegate" is chosen), the first such cut from
    the shared bundle's on."""
    tmp, env = made["tmp"], made["env"]
    first = made["record"]["split_seed"]
    for split_seed in range(first, first + 20):
        done = run_ctd(
            "monitor", "calibrate", "--run", "t", *LEVELS, "--split-seed", str(split_seed), "--force",
            cwd=tmp, env=env, timeout=300,
        )  # fmt: skip
        if done.returncode == 1:
            assert "nothing certified" in done.stderr, done.stderr
            continue
        assert done.returncode == 0, done.stderr
        bundle = Path(done.stdout.strip().splitlines()[-1])
        record = json.loads((bundle / "bundle.json").read_text())
        if record["threshold"] != "inf":
            return {"bundle": bundle, "record": record, "accuracy": 0.2, "stdout": done.stdout}
    pytest.fail(f"no cut of the test split certified a joint threshold that delegates: {done.stdout}")


def test_a_joint_bundle_records_every_level_and_the_run_s_counts_at_its_threshold(
    made: dict, joint: dict
) -> None:
    bundle, record, accuracy = joint["bundle"], joint["record"], joint["accuracy"]
    assert bundle.name == "budget-0.5-accuracy-0.2-fnr-0.7"  # the default name
    error = round(1 - accuracy, 12)
    assert (record["version"], record["mode"], record["alpha"]) == (3, "joint", None)
    assert record["levels"] == {"budget": 0.5, "error": error, "fnr": 0.7} == record["ltt"]["levels"]
    assert (record["test_order"], record["selection"], record["objective"]) == (
        "est_max_pvalue",
        "est_objective",
        "auroc",
    )
    ltt = record["ltt"]
    assert ltt["mode"] == "joint" and ltt["selected"] in ltt["certified"]
    thresholds = [float(t) for t in record["candidates"]["thresholds"]]
    assert float(record["threshold"]) == thresholds[ltt["selected"]]
    # The counts at every tested threshold are the run's, recounted here from its scores table.
    scores = read_table(made["tmp"] / "runs" / "t" / "scores.parquet").columns
    rows = (
        (scores["split"] == "test") & (scores["seed"] == record["seed"]) & (scores["arch"] == record["arch"])
    )
    by_id = {
        str(i): (y, p, d, e)
        for i, y, p, d, e in zip(
            *(scores[c][rows] for c in ("id", "label", "probe", "dv", "expert")), strict=True
        )
    }
    label, probe, dv, expert = (
        np.array(column) for column in zip(*map(by_id.get, record["cal_ids"]), strict=True)
    )
    positive = label == 1
    for position, j in enumerate(ltt["order"]):
        delegated = dv > thresholds[j]
        decided = np.where(delegated, expert, probe) >= 0.5  # the CTD merge: overwrite
        counted = {
            "budget": int(delegated.sum()),
            "error": int((decided != positive).sum()),
            "fnr": int((positive & ~decided).sum()),
        }
        assert {risk: ltt["cal_losses"][risk][position] for risk in counted} == counted, position
        # Each risk's p-value is the exact binomial tail of its count; the threshold's is their max.
        tails = [
            float(calibrate.binomial_pvalue(counted[risk], ltt["n_cal"][risk], record["levels"][risk]))
            for risk in counted
        ]
        assert [ltt["risk_pvalues"][risk][position] for risk in counted] == pytest.approx(tails, rel=1e-12)
        assert ltt["pvalues"][position] == max(ltt["risk_pvalues"][risk][position] for risk in counted)
    assert ltt["n_cal"] == {
        "budget": len(record["cal_ids"]),
        "error": len(record["cal_ids"]),
        "fnr": int(positive.sum()),
    }
    # What the command said: each risk's level, count and p-value at the chosen threshold.
    at = ltt["order"].index(ltt["selected"])
    lines = joint["stdout"].splitlines()
    assert lines[0].startswith("joint control of budget 0.5, accuracy 0.2, fnr 0.7 at delta 0.1:")
    for risk, rows_name in (("budget", "rows"), ("error", "rows"), ("fnr", "positives")):
        k, n, p = ltt["cal_losses"][risk][at], ltt["n_cal"][risk], ltt["risk_pvalues"][risk][at]
        level = record["levels"][risk]
        assert any(
            line.startswith(f"  {risk} <= {level:g}: {k} of {n} D_cal {rows_name}")
            and f"p-value {p:.3g}" in line
            for line in lines
        ), (risk, lines)
        assert p <= ltt["pvalues"][at] <= 0.1
    assert lines[-1] == str(bundle)


def test_the_audit_redoes_a_joint_bundle_and_tells_a_tampered_level(made: dict, joint: dict) -> None:
    tmp, env, bundle = made["tmp"], made["env"], joint["bundle"]
    ok = run_ctd("monitor", "audit", str(bundle), cwd=tmp, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "matches its run" in ok.stdout and "DIFFERS" not in ok.stdout
    for where in ("levels", "ltt"):  # the level the record names, or the one its LTT record names
        tampered = tmp / f"tampered-{where}"
        shutil.copytree(bundle, tampered, dirs_exist_ok=True)
        forged = json.loads((tampered / "bundle.json").read_text())
        levels = forged["levels"] if where == "levels" else forged["ltt"]["levels"]
        levels["error"] = round(levels["error"] + 0.05, 12)
        (tampered / "bundle.json").write_text(json.dumps(forged))
        audit = run_ctd("monitor", "audit", str(tampered), "--json", cwd=tmp, env=env)
        assert audit.returncode == 1, audit.stdout + audit.stderr
        failed = [c for c in json.loads(audit.stdout)["checks"] if not c["ok"]]
        assert [c["what"] for c in failed] == ["LTT record"], where
        assert "recomputed 'ltt' differs" in failed[0]["detail"]


def test_a_joint_bundle_serves_as_a_budget_one_shows_each_level_and_refuses_a_cap(
    made: dict, joint: dict
) -> None:
    tmp, env, bundle, record = made["tmp"], made["env"], joint["bundle"], joint["record"]
    started = time.monotonic()
    refused = run_ctd("monitor", "serve", str(bundle), "--max-delegation-rate", "0.2", cwd=tmp, env=env)
    assert_one_line_error(refused, "--max-delegation-rate", "certifies an error at most", "false-negative")
    assert time.monotonic() - started < 30  # refused before the model loads
    ids, conversations = conversations_of(tmp / "data")
    scores = read_table(tmp / "runs" / "t" / "scores.parquet").columns
    rows = (
        (scores["split"] == "test") & (scores["seed"] == record["seed"]) & (scores["arch"] == record["arch"])
    )
    offline_dv = dict(zip(scores["id"][rows].astype(str), scores["dv"][rows], strict=True))
    threshold = float(record["threshold"])
    port = free_port()
    process = serve(
        bundle, port, "--no-expert", "--log", str(tmp / "joint-decisions.jsonl"), cwd=tmp, env=env
    )
    try:
        answers = asyncio.run(replay(port, conversations, concurrency=16))
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    finally:
        stop(process)
    decisions = [a.json() for a in answers]
    # The threshold decides, as in a budget bundle: on the served DV, which is the run's.
    assert [d["delegated"] for d in decisions] == [bool(offline_dv[i] > threshold) for i in ids]
    assert [d["delegated"] for d in decisions] == [d["dv"] > threshold for d in decisions]
    assert any(d["delegated"] for d in decisions) and not all(d["delegated"] for d in decisions)
    gauges = {
        (s.name, s.labels.get("risk")): s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
    }
    levels = record["levels"]
    assert gauges[("ctd_monitor_certified_alpha", "delegation")] == levels["budget"]
    assert gauges[("ctd_monitor_certified_alpha", "error")] == levels["error"]
    assert gauges[("ctd_monitor_certified_alpha", "fnr")] == levels["fnr"]
    assert gauges[("ctd_monitor_threshold", None)] == threshold
    # Both watched risks have their drift evidence on show (the delegation rate and the error).
    assert {risk for name, risk in gauges if name == "ctd_monitor_drift_threshold"} == {"delegation", "error"}


def test_either_level_alone_is_as_before_and_bad_combinations_are_one_line(made: dict) -> None:
    tmp, env = made["tmp"], made["env"]
    record = made["record"]  # the shared budget bundle: version 2, one level, no `levels`
    assert (record["version"], record["mode"], record["alpha"]) == (
        2,
        "budget",
        0.5,
    ) and "levels" not in record
    monitor = tmp / "runs" / "t" / "monitor"
    before = sorted(p.name for p in monitor.iterdir())
    for bad, fragment in (
        (["--fnr", "0.2"], "--fnr 0.2: give it with --budget ALPHA and/or --accuracy LEVEL"),
        (["--budget", "0.5", "--accuracy", "1.5"], "--accuracy 1.5: must lie in (0, 1)"),
        (["--budget", "0", "--accuracy", "0.3"], "--budget 0: must lie in (0, 1)"),
        (["--budget", "0.5", "--accuracy", "0.3", "--fnr", "1"], "--fnr 1: must lie in (0, 1)"),
        (["--budget", "0.5", "--fnr", "nan"], "--fnr nan: must lie in (0, 1)"),
        # The false-negative rate is counted on D_cal's positives: too few for a level of 0.05.
        (["--budget", "0.5", "--fnr", "0.05"], "positives (label 1); fnr level 0.05 at --delta 0.1 needs"),
        (["--budget", "0.5", "--accuracy", "0.3", "--delta", "2"], "--delta 2: must lie in (0, 1)"),
        (["--budget", "0.5", "--accuracy", "0.3", "--name", "../x"], "--name '../x'"),
    ):
        assert_one_line_error(run_ctd("monitor", "calibrate", "--run", "t", *bad, cwd=tmp, env=env), fragment)
    # Nothing certified jointly: the reason on stdout, one line on stderr, exit 1, no bundle.
    impossible = run_ctd(
        "monitor", "calibrate", "--run", "t", "--budget", "0.5", "--accuracy", "0.95", "--name", "never",
        cwd=tmp, env=env,
    )  # fmt: skip
    assert impossible.returncode == 1 and impossible.stderr.count("\n") == 1
    assert (
        "nothing certified: no threshold holds budget <= 0.5 and error <= 0.05 at once" in impossible.stderr
    )
    assert "  error <= 0.05: " in impossible.stdout and "at the first threshold tested" in impossible.stdout
    assert sorted(p.name for p in monitor.iterdir()) == before
