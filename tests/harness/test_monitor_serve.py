"""`ctd monitor` as a new user runs it: a small `ctd eval` on the embedded model with a
fault-injecting expert, `ctd monitor calibrate`, then `ctd monitor serve` in a fresh process.

- Equivalence: the test split replayed through the server gives, example by example, the run's
  probe and DV scores and the offline policy's delegation decisions and merged scores at the
  bundle's threshold (tolerance 1e-5).
- Bad input: a dozen malformed requests, each a 4xx with one clear message; the server lives on.
- The expert killed during a load run: every request is answered, and every decision without an
  expert score says why.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import fault_server
import httpx
import numpy as np
import pytest
from ctd_cli import assert_one_line_error, free_port, run_ctd
from fault_server import RunningServer
from monitor_run import conversations_of, labels_of, replay, serve, stop
from prometheus_client.parser import text_string_to_metric_families

import calibrate
from harness.data import read_table

TOLERANCE = 1e-5


def test_calibrate_writes_a_bundle_with_its_audit_record_or_says_why_not(made: dict) -> None:
    bundle, record = made["bundle"], made["record"]
    assert {p.name for p in bundle.iterdir()} >= {
        "bundle.json",
        "safety.safetensors",
        "safety.json",
        "dv.json",
    }
    ltt = record["ltt"]
    assert ltt["mode"] == "budget" and ltt["alpha"] == 0.5 and ltt["n_est"] + ltt["n_cal"] == record["n_test"]
    # The audit record is complete: the p-values are the exact binomial tails of the counts.
    assert ltt["pvalues"] == pytest.approx(
        [float(calibrate.binomial_pvalue(k, ltt["n"], 0.5)) for k in ltt["k"]], rel=1e-12
    )
    # ... and the counts are those of the run's DV scores on the D_cal examples it names.
    scores = read_table(made["tmp"] / "runs" / "t" / "scores.parquet").columns
    rows = (
        (scores["split"] == "test") & (scores["seed"] == record["seed"]) & (scores["arch"] == record["arch"])
    )
    dv = dict(zip(scores["id"][rows].astype(str), scores["dv"][rows], strict=True))
    assert len(record["cal_ids"]) == ltt["n_cal"] and not set(record["cal_ids"]) & set(record["est_ids"])
    cal_dv = np.array([dv[i] for i in record["cal_ids"]])
    thresholds = [float(t) for t in record["candidates"]["thresholds"]]
    assert ltt["k"] == [int((cal_dv > thresholds[j]).sum()) for j in ltt["order"]]
    assert float(record["threshold"]) == thresholds[ltt["selected"]] and ltt["selected"] in ltt["certified"]
    assert "api_key" not in json.dumps(record["expert"]).replace("api_key_env", "")
    assert record["expert"]["base_urls"][0].startswith("http://127.0.0.1:")

    impossible = run_ctd(
        "monitor", "calibrate", "--run", "t", "--accuracy", "0.9", "--name", "never",
        cwd=made["tmp"], env=made["env"], timeout=300,
    )  # fmt: skip
    assert impossible.returncode == 1 and "nothing certified" in impossible.stderr
    assert not (made["tmp"] / "runs" / "t" / "monitor" / "never").exists()
    for bad, fragment in (
        (["--run", "nope", "--budget", "0.3"], "--run nope: no run folder"),
        (["--run", "t", "--budget", "1.5"], "--budget 1.5: must lie in (0, 1)"),
        (["--run", "t"], "give --budget ALPHA or --accuracy LEVEL, or both"),
        (["--run", "t", "--budget", "0.3", "--arch", "mlp"], "--arch mlp: not in"),
    ):
        assert_one_line_error(
            run_ctd("monitor", "calibrate", *bad, cwd=made["tmp"], env=made["env"]), fragment
        )


def test_serving_the_test_split_reproduces_the_run_and_the_offline_policy(made: dict) -> None:
    tmp, record = made["tmp"], made["record"]
    ids, conversations = conversations_of(tmp / "data")
    scores = read_table(tmp / "runs" / "t" / "scores.parquet").columns
    rows = (
        (scores["split"] == "test") & (scores["seed"] == record["seed"]) & (scores["arch"] == record["arch"])
    )
    offline = {
        str(i): (p, d, e)
        for i, p, d, e in zip(
            scores["id"][rows], scores["probe"][rows], scores["dv"][rows], scores["expert"][rows], strict=True
        )
    }
    threshold = float(record["threshold"])
    port = free_port()
    with RunningServer() as expert:  # the same deterministic expert as the run's, on a new port
        process = serve(made["bundle"], port, "--expert-url", expert.url, cwd=tmp, env=made["env"])
        try:
            answers = asyncio.run(replay(port, conversations, concurrency=16))
            labels = labels_of(tmp / "data")
            fed = [
                httpx.post(
                    f"http://127.0.0.1:{port}/v1/feedback",
                    json={"request_id": a.json()["request_id"], "label": label},
                    timeout=30,
                ).status_code
                for a, label in zip(answers, labels, strict=True)
            ]
            repeat = httpx.post(  # a retried post of a label must not count twice
                f"http://127.0.0.1:{port}/v1/feedback",
                json={"request_id": answers[0].json()["request_id"], "label": labels[0]},
                timeout=30,
            )
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
            bad = _malformed(port)
            alive = httpx.post(
                f"http://127.0.0.1:{port}/v1/check", json={"input": "still here?"}, timeout=600
            )
        finally:
            stop(process)
    assert [a.status_code for a in answers] == [200] * len(answers)
    decisions = [a.json() for a in answers]
    delegated_count = 0
    for example_id, decision in zip(ids, decisions, strict=True):
        probe, dv, expert_score = offline[example_id]
        assert decision["probe"] == pytest.approx(probe, abs=TOLERANCE), example_id
        assert decision["dv"] == pytest.approx(dv, abs=TOLERANCE), example_id
        delegated = bool(dv > threshold)
        assert decision["delegated"] is delegated, (example_id, dv, threshold)
        merged = calibrate.cascade_scores(probe, expert_score, delegated, "overwrite")
        assert decision["score"] == pytest.approx(float(merged), abs=TOLERANCE)
        assert decision["label"] == int(float(merged) >= 0.5)
        if delegated:
            delegated_count += 1
            assert (
                decision["expert"] == pytest.approx(expert_score, abs=TOLERANCE)
                and decision["reason"] is None
            )
        else:
            assert decision["expert"] is None and decision["reason"] == "not-delegated"
        assert set(decision["latency_ms"]) == {"probe_ms", "expert_ms", "total_ms"}
    assert delegated_count >= 1
    counted = {s.name: s.value for f in text_string_to_metric_families(metrics) for s in f.samples}
    assert counted["ctd_monitor_requests_total"] == len(conversations)
    assert counted["ctd_monitor_delegated_total"] == delegated_count
    assert 'ctd_monitor_rate_ci95_high{risk="delegation"}' in metrics
    assert alive.status_code == 200
    # Labels posted back: the error rate /metrics shows is the offline cascade's on this split.
    assert fed == [200] * len(answers)
    assert repeat.status_code == 409 and "already labelled" in repeat.json()["error"]
    errors = sum(d["label"] != y for d, y in zip(decisions, labels, strict=True))
    shown = {
        ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in metrics.splitlines() if not ln.startswith("#")
    }
    assert shown['ctd_monitor_rate{risk="error"}'] == pytest.approx(errors / len(labels))
    for status, body in bad:
        assert 400 <= status < 500 and isinstance(body.get("error"), str) and "\n" not in body["error"], body
    log = [json.loads(line) for line in (made["bundle"] / "decisions.jsonl").read_text().splitlines()]
    checked = [r for r in log if r["event"] == "decision"]
    assert len(checked) == len(conversations) + 1 and all("text" not in r for r in checked)


def _malformed(port: int) -> list[tuple[int, dict]]:
    url = f"http://127.0.0.1:{port}"
    json_type = {"content-type": "application/json"}
    sent = [
        httpx.post(f"{url}/v1/check", content=b"{oops", headers=json_type, timeout=30),
        httpx.post(f"{url}/v1/check", content=b"", headers=json_type, timeout=30),
        httpx.post(f"{url}/v1/check", json={"messages": []}, timeout=30),
        httpx.post(f"{url}/v1/check", json={"messages": [{"role": "wizard", "content": "x"}]}, timeout=30),
        httpx.post(f"{url}/v1/check", json={"messages": [{"role": "user", "content": None}]}, timeout=30),
        httpx.post(f"{url}/v1/check", json={"input": ""}, timeout=30),
        httpx.post(f"{url}/v1/check", json=["a list"], timeout=30),
        httpx.post(f"{url}/v1/check", json={"prompt": "x"}, timeout=30),
        httpx.post(f"{url}/v1/check", content=b"input=x", headers={"content-type": "text/plain"}, timeout=30),
        httpx.post(f"{url}/v1/check", json={"input": "x" * (2 << 20)}, timeout=30),
        httpx.post(f"{url}/v1/feedback", json={"request_id": "nope", "label": 1}, timeout=30),
        httpx.post(f"{url}/v1/feedback", json={"request_id": "x", "label": 7}, timeout=30),
    ]
    return [(r.status_code, r.json()) for r in sent]


def test_killing_the_expert_mid_load_loses_no_request_and_says_why(made: dict) -> None:
    tmp = made["tmp"]
    # The same bundle, made to delegate everything, so that every request needs the expert.
    everything = tmp / "delegate-all"
    if not everything.exists():
        everything.mkdir()
        for path in made["bundle"].iterdir():
            if path.suffix in (".json", ".safetensors"):
                (everything / path.name).write_bytes(path.read_bytes())
        record = {**made["record"], "threshold": -1e9}
        (everything / "bundle.json").write_text(json.dumps(record))
    port_file = tmp / "expert-port"
    port_file.unlink(missing_ok=True)
    plan = json.dumps({"delay": 0.05})
    expert = subprocess.Popen([sys.executable, fault_server.__file__, str(port_file), plan])
    try:
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.monotonic() < deadline and expert.poll() is None
            time.sleep(0.05)
        expert_url = f"http://127.0.0.1:{int(port_file.read_text())}/v1"
        _, conversations = conversations_of(tmp / "data")
        conversations = conversations[:24]
        port = free_port()
        process = serve(everything, port, "--expert-url", expert_url, cwd=tmp, env=made["env"])
        try:
            before = asyncio.run(replay(port, conversations[:8], concurrency=4))
            expert.kill()  # mid-load: the monitor has answered some requests with the expert's help
            expert.wait(10)
            after = asyncio.run(replay(port, conversations[8:], concurrency=8))
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        finally:
            stop(process)
    finally:
        if expert.poll() is None:
            expert.kill()
            expert.wait(10)
    assert [r.status_code for r in before + after] == [200] * len(conversations)  # none lost
    assert all(r.json()["expert"] is not None for r in before)
    for decision in (r.json() for r in after):
        assert decision["delegated"] is True and decision["expert"] is None
        assert decision["reason"] in ("expert-down", "expert-failed: connection")
        assert decision["score"] == pytest.approx(decision["probe"])  # the fallback is the probe score
    failures = sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "ctd_monitor_expert_failures_total"
    )
    assert failures == len(after)
    # The breaker is the client's, shared by every micro-batch: once 4 delegated requests in a
    # row have failed at the endpoint the others are answered "expert-down" without a request.
    reasons = [r.json()["reason"] for r in after]
    assert reasons.count("expert-down") >= 1, reasons
    assert np.isfinite([r.json()["probe"] for r in after]).all()
