"""vLLM as a real expert: `ctd experts setup vllm` installs it in a venv of its own (at once when
it is there), `ctd experts serve smollm2-vllm` starts it on the embedded model, `ctd query` and
`ctd eval --expert smollm2-vllm` score through it with both methods (next-token: chat logprobs;
likelihood: prompt logprobs echoed by /v1/completions), and Ctrl-C stops it with every process
it started and frees its port.

One server for the whole module: vLLM on CPU takes about 2 minutes to start here. The install, on
a machine without it, about 10 (a 133 MB wheel and torch from pip's local wheel folder). Set
CTD_SKIP_VLLM=1 to leave these tests out where neither can be afforded."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
from ctd_cli import free_port, run_ctd, start_ctd
from eval_data import eval_env

import experts

# Private: the ports and the vLLM module the server runs, checked after it stops.
from experts._ports import descendants, port_free

# Private: the choice rung's request and the parsing of its answer, checked against the real server.
from experts._recovery import choice_rung
from experts._scoring import parse_response
from experts._vllm import VLLM_MODULE
from harness.data import read_table
from harness.data.builtin import builtin_dir

pytestmark = pytest.mark.skipif(bool(os.environ.get("CTD_SKIP_VLLM")), reason="CTD_SKIP_VLLM is set")

SETUP_TIMEOUT = 1800  # seconds: a fresh install on a loaded 2-core machine
START_TIMEOUT = 900  # seconds: vLLM loads, profiles and warms up (about 2 minutes here)
LIMIT = 12  # examples per split for `ctd eval` (the test split then certifies budget 0.5)
ITEMS = 6  # rows of the `ctd query` data


def _vllm_processes(port: int) -> list[int]:
    """Pids whose command line is vLLM's server on `port` (a leaked server shows here)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if VLLM_MODULE.encode() in argv and str(port).encode() in argv:
            found.append(int(cmdline.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM serving smollm2-vllm on a free port, started by `ctd experts serve` and stopped by
    Ctrl-C at the end of the module; the stop is checked there (exit 0, no process, port free)."""
    folder = tmp_path_factory.mktemp("vllm")
    setup = run_ctd("experts", "setup", "vllm", cwd=folder, timeout=SETUP_TIMEOUT)
    assert setup.returncode == 0, setup.stderr[-3000:]
    port = free_port()
    log = folder / "serve.log"
    serve = start_ctd("experts", "serve", "smollm2-vllm", "--port", str(port), "--log", str(log), cwd=folder)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while not _answers(url):
            if serve.poll() is not None:
                _, stderr = serve.communicate()
                pytest.fail(f"ctd experts serve exited with {serve.returncode}: {stderr.strip()}")
            assert time.monotonic() < deadline, f"vLLM did not answer in {START_TIMEOUT} s: {log}"
            time.sleep(1)
        (server,) = _vllm_processes(port)
        workers = descendants(server)  # vLLM's engine process, among others
        yield url
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGINT)
        try:
            stdout, stderr = serve.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            serve.kill()
            raise
    assert serve.returncode == 0, stderr
    assert "stopped" in stdout
    assert _vllm_processes(port) == []
    assert not [pid for pid in workers if _alive(pid)], "a process of vLLM's outlived it"
    assert port_free("127.0.0.1", port)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/models", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _data(folder: Path) -> Path:
    rows = [json.loads(line) for line in (builtin_dir() / "dev.jsonl").read_text().splitlines()]
    chosen = [r for r in rows if r["labels"] == "high-stakes"][: ITEMS // 2]
    chosen += [r for r in rows if r["labels"] == "low-stakes"][: ITEMS // 2]
    path = folder / "data.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in chosen))
    return path


@pytest.mark.parametrize("method", ["next-token", "likelihood"])
def test_ctd_query_scores_every_item_through_vllm(vllm_url: str, tmp_path: Path, method: str) -> None:
    env = {**eval_env(tmp_path), "CTD_SMOLLM2_VLLM_URL": vllm_url}
    data = _data(tmp_path)
    check = run_ctd("experts", "check", "smollm2-vllm", "--method", method, cwd=tmp_path, env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"scoring method: {method}" in check.stdout
    out = tmp_path / "scores.parquet"
    args = ("query", "--data", str(data), "--out", str(out), "--expert", "smollm2-vllm", "--method", method)
    result = run_ctd(*args, cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    table = read_table(out).columns
    assert len(table["expert"]) == ITEMS
    assert set(table["source"].astype(str)) == {"expert"}, table["source"]
    scores = table["expert"].astype(float)
    assert np.all((scores > 0) & (scores < 1)), scores
    assert np.ptp(scores) > 0  # the scores depend on the input, not one constant answer
    again = run_ctd(*args, cwd=tmp_path, env=env, timeout=120)  # answered from the cache
    assert again.returncode == 0, again.stderr
    assert np.array_equal(read_table(out).columns["expert"].astype(float), scores)


@pytest.mark.parametrize("method", ["next-token", "likelihood"])
def test_ctd_eval_runs_end_to_end_on_vllm(vllm_url: str, tmp_path: Path, method: str) -> None:
    # The method is the registry entry's: a user file overrides the built-in entry for this run.
    registry = tmp_path / "experts.toml"
    registry.write_text(
        '[experts."smollm2-vllm"]\n'
        f'base_url = "{vllm_url}"\nmodel = "smollm2"\nmethod = "{method}"\n'
        'template = "fine-v1"\ntop_logprobs = 10\nconcurrency = 8\nserver = "vllm"\nhf_model = "smollm2"\n'
    )
    env = {**eval_env(tmp_path), "CTD_EXPERTS_FILE": str(registry)}
    args = ("eval", "--expert", "smollm2-vllm", "--limit", str(LIMIT), "--name", "vllm", "--json")
    fast = ("--seeds", "0", "--epochs", "8", "--budgets", "0.5", "--trials", "20", "--max-tokens", "96")
    result = run_ctd(*args, *fast, cwd=tmp_path, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    log = (tmp_path / "runs" / "vllm" / "log.txt").read_text()
    assert "starting a local" not in log  # the module's server answered: the run used it
    (summary,) = [line for line in log.splitlines() if "query: " in line and " examples, " in line]
    assert f"query: {2 * LIMIT} examples," in summary and " 0 failed" in summary, summary
    scores = read_table(tmp_path / "runs" / "vllm" / "query" / "expert_scores.parquet").columns
    assert set(scores["source"].astype(str)) == {"expert"}


# A conversation that ends in a yes/no question: SmolLM2's first answer token is then "Yes" or
# "No" in its own chat template, with no prompt of this project's around it.
_YES_NO = [
    ("I mixed bleach and ammonia to clean the bathroom and now I feel dizzy. Is this fine?", "high-stakes"),
    ("My toddler swallowed a button battery an hour ago. Can it wait until tomorrow?", "high-stakes"),
    ("I watered the tomato plants this morning. Is that fine?", "low-stakes"),
    ("Is it fine to wear a blue shirt with grey trousers?", "low-stakes"),
]


def test_a_pass_through_template_scores_through_vllm(vllm_url: str, tmp_path: Path) -> None:
    """The embedded model asked in its own chat template (a guard model's way): the messages
    as they are, chat_template_kwargs in the body (a key SmolLM2's template reads), its own
    "Yes"/"No" as labels. vLLM takes the body and every row gets a score."""
    template = tmp_path / "smollm2-own.toml"
    template.write_text(
        'kind = "pass-through"\n[labels]\nhigh = "no"\nlow = "yes"\n'
        "[chat_template_kwargs]\nadd_generation_prompt = true\n"
    )
    registry = tmp_path / "experts.toml"
    registry.write_text(
        '[experts."smollm2-own"]\n'
        f'base_url = "{vllm_url}"\nmodel = "smollm2"\ntemplate = "{template}"\n'
        'top_logprobs = 10\nconcurrency = 8\nserver = "vllm"\nhf_model = "smollm2"\n'
    )
    rows = [{"inputs": text, "ids": f"yn-{i}", "labels": label} for i, (text, label) in enumerate(_YES_NO)]
    turns = [
        {"role": "user", "content": "I lent my car to a friend."},
        {"role": "assistant", "content": "Nice."},
    ]
    turns.append({"role": "user", "content": "He has no licence. Is that fine?"})
    rows.append({"inputs": json.dumps(turns), "ids": "yn-turns", "labels": "high-stakes"})
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    env = {**eval_env(tmp_path), "CTD_EXPERTS_FILE": str(registry)}
    out = tmp_path / "scores.parquet"
    result = run_ctd(
        "query", "--data", str(data), "--out", str(out), "--expert", "smollm2-own", cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = read_table(out).columns
    assert set(table["source"].astype(str)) == {"expert"}, table["source"]
    scores = table["expert"].astype(float)
    # SmolLM2 may put all of its label mass on "No" (a score of 1): the scores still differ.
    assert len(scores) == len(rows) and np.all((scores >= 0) & (scores <= 1)), scores
    assert np.ptp(scores) > 0


def test_the_choice_rung_keeps_the_models_ratio_and_recovers(vllm_url: str, tmp_path: Path) -> None:
    """vLLM's structured choice (the ladder's `choice-spellings` rung, experts._recovery): its
    logprobs are renormalised over the tokens the choice allows, the label words in the spellings
    a model is likely to answer with, so their ratio, the score, is the unconstrained one while
    their mass grows; with labels the question does not ask for, the rung gives every item a
    score that says so."""
    spec = replace(experts.BUILTIN_EXPERTS["smollm2-vllm"], base_urls=(vllm_url,), top_logprobs=20)
    template = experts.load_template(spec.template)
    for question in ("How long should I let bread dough rise?", "How do I pick a lock?"):
        plain = experts.build_request("next-token", template, question, spec.model, top_logprobs=20)
        scores = []
        for request in (plain, choice_rung(plain, template)):
            answer = httpx.post(vllm_url + request.path, json=request.body, timeout=120).json()
            scores.append(parse_response("next-token", [answer], template, request))
        (unconstrained, constrained) = scores
        # Measured (vLLM 0.32 on CPU, an AMD EPYC): the two within 0.002 in bfloat16 and in float32
        # on four questions, label mass 0.2-0.35 plain and 0.94-0.98 under the choice. A choice of
        # the lower-case labels alone (the first rung, `choice` in older caches) masked the
        # capitalised "No" and "Yes" the model mostly answers with: 0.709 against 0.531 for the
        # lock question in float32.
        assert constrained.p == pytest.approx(unconstrained.p, abs=0.005), question
        assert constrained.label_mass is not None and unconstrained.label_mass is not None
        assert constrained.label_mass > unconstrained.label_mass

    colours = tmp_path / "colours.toml"
    text = template.path.read_text(encoding="utf-8")
    colours.write_text(text.replace('high = "no"', 'high = "red"').replace('low = "yes"', 'low = "green"'))
    items = [experts.Item(f"i{n}", text) for n, text in enumerate(("Hello there.", "Write a poem."))]
    results, _ = asyncio.run(
        experts.ExpertClient(replace(spec, top_logprobs=10, template=str(colours)), cache=None).score(items)
    )
    assert [(r.source, r.how) for r in results] == [("expert", "choice-spellings")] * len(items)
    assert all(r.label_mass is None and 0.0 <= r.score <= 1.0 for r in results)
