"""`ctd query --batch-out`, a real `vllm run-batch` on the embedded model (the registry entry
smollm2-vllm), `ctd query --batch-in`, and a rerun that finds every answer in the cache.

One batch run, next-token scoring (vLLM on CPU takes about 2 minutes to start its engine here).
vLLM 0.32's runner takes /v1/chat/completions only: a file with a likelihood line
(/v1/completions) fails as a whole, at its validation, so likelihood batches go to a provider's
Batch API. Set CTD_SKIP_VLLM=1 to leave it out; it is skipped where vLLM is not installed
(`ctd experts setup vllm`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from ctd_cli import run_ctd
from eval_data import eval_env

import experts
from experts import VllmSettings

# Private: the run-batch command line (no `ctd` command runs it: a batch runs where the GPUs are).
from experts._vllm import VLLM_BATCH_MODULE, vllm_batch_command, vllm_command, vllm_missing
from harness.data import read_table
from harness.data.builtin import builtin_dir

ITEMS = 24
BATCH_TIMEOUT = 900  # seconds: the engine's start (about 2 minutes) and the batch, on 2 loaded cores
SPEC = experts.BUILTIN_EXPERTS["smollm2-vllm"]


def test_the_batch_command_gives_the_engine_what_the_server_gets() -> None:
    settings = VllmSettings(max_model_len=2048)
    served = vllm_command(
        "/m", served_name="s", host="h", port=1, max_logprobs=20, settings=settings, device="cpu"
    )
    batch = vllm_batch_command(
        "/m", served_name="s", requests=Path("in.jsonl"), results=Path("out.jsonl"), max_logprobs=20,
        settings=settings, device="cpu",
    )  # fmt: skip
    assert batch[1:7] == ["-m", VLLM_BATCH_MODULE, "-i", "in.jsonl", "-o", "out.jsonl"]
    assert batch[7:] == [arg for arg in served[3:] if arg not in ("--host", "h", "--port", "1")]
    assert "--enforce-eager" in batch and "--max-logprobs" in batch


def _data(folder: Path) -> Path:
    rows = [json.loads(line) for line in (builtin_dir() / "dev.jsonl").read_text().splitlines()]
    chosen = [r for r in rows if r["labels"] == "high-stakes"][: ITEMS // 2]
    chosen += [r for r in rows if r["labels"] == "low-stakes"][: ITEMS // 2]
    path = folder / "data.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in chosen))
    return path


@pytest.mark.skipif(bool(os.environ.get("CTD_SKIP_VLLM")), reason="CTD_SKIP_VLLM is set")
@pytest.mark.skipif(vllm_missing() is not None, reason=str(vllm_missing()))
def test_a_vllm_run_batch_round_trip_leaves_nothing_to_pay(tmp_path: Path) -> None:
    from probes import embedded_gguf, gguf_as_folder

    env = eval_env(tmp_path)
    data = _data(tmp_path)
    query = ("query", "--data", str(data), "--expert", "smollm2-vllm", "--method", "next-token")
    made = run_ctd(*query, "--batch-out", "requests.jsonl", "--json", cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["lines"] == ITEMS
    requests = tmp_path / "requests.jsonl"
    with requests.open("a") as more:  # a line of another batch, to be counted and ignored
        more.write(
            json.dumps({**json.loads(requests.read_text().splitlines()[0]), "custom_id": "other"}) + "\n"
        )

    command = vllm_batch_command(
        str(gguf_as_folder(embedded_gguf())),
        served_name=SPEC.model,
        requests=requests,
        results=tmp_path / "results.jsonl",
        max_logprobs=max(20, SPEC.top_logprobs),
        settings=VllmSettings(),
        device="cpu",
    )
    with (tmp_path / "vllm.log").open("w") as log:
        cpu = {**os.environ, **VllmSettings().environment("cpu")}
        ran = subprocess.run(
            command, env=cpu, stdout=log, stderr=subprocess.STDOUT, timeout=BATCH_TIMEOUT, check=False
        )
    assert ran.returncode == 0, (tmp_path / "vllm.log").read_text()[-3000:]

    committed = run_ctd(
        *query, "--batch-in", "results.jsonl", "--out", "batch.parquet", "--json", cwd=tmp_path, env=env
    )
    assert committed.returncode == 0, committed.stderr
    report = json.loads(committed.stdout)
    assert (report["committed"], report["failed"], report["missing"], report["unmatched"]) == (ITEMS, 0, 0, 1)
    # The rerun needs no server: nothing listens at the entry's URL, and --no-check asks nothing
    # before the cache answers every item.
    rerun = run_ctd(*query, "--no-check", "--out", "rerun.parquet", "--json", cwd=tmp_path, env=env)
    assert rerun.returncode == 0, rerun.stderr
    assert (json.loads(rerun.stdout)["cached"], json.loads(rerun.stdout)["scored"]) == (ITEMS, 0)
    table = read_table(tmp_path / "rerun.parquet").columns
    scores = table["expert"].astype(float)
    assert set(table["source"].astype(str)) == {"cache"}
    assert np.all((scores > 0) & (scores < 1)) and np.ptp(scores) > 0, scores
    assert np.array_equal(scores, read_table(tmp_path / "batch.parquet").columns["expert"].astype(float))
