"""llama.cpp's own server (xllamacpp) as `ctd` runs it: the command, parallel slots that match
the registry's concurrency, next-token scoring at temperature 0, and the one line the pre-flight
check gives when likelihood scoring is asked of it."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from ctd_cli import free_port

import experts
from experts import ConfigError, build_request, load_template

# Private: the response parser, fed the real server's answers.
from experts._scoring import parse_response
from experts._serve import SERVER_MODULE as MODULE
from probes import embedded_gguf

SMOLLM2 = experts.BUILTIN_EXPERTS["smollm2"]
needs_xllamacpp = pytest.mark.skipif(
    importlib.util.find_spec("xllamacpp") is None, reason="xllamacpp (llama.cpp's server) is not installed"
)


MOVE = 0.25
"""The most a token's logprob moves between two answers to the same prompt batched differently."""


def _top(answer: dict) -> dict[str, float]:
    return {e["token"]: e["logprob"] for e in answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]}


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_embedded_expert_gets_one_slot_per_request_in_flight(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    command = experts.server_command(SMOLLM2, port=9123, gguf=gguf)
    assert command[:3] == [sys.executable, "-m", MODULE]
    assert _option(command, "--model") == str(gguf) and _option(command, "--alias") == "smollm2"
    assert _option(command, "--port") == "9123"
    assert int(_option(command, "--slots")) == SMOLLM2.rate.concurrency > 1
    # Likelihood scoring needs prompt logprobs: llama-cpp-python's server, not llama.cpp's own.
    likelihood = experts.server_command(dataclasses.replace(SMOLLM2, method="likelihood"), gguf=gguf)
    assert likelihood[2] == "llama_cpp.server" and _option(likelihood, "--logits_all") == "true"
    with pytest.raises(ConfigError, match="needs a GGUF file"):
        experts.server_command(SMOLLM2)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None, reason="llama-cpp-python is installed")
def test_likelihood_without_its_server_says_which_extra_in_one_line(tmp_path: Path) -> None:
    spec = dataclasses.replace(SMOLLM2, method="likelihood")
    problem = experts.LocalServer(spec, gguf=tmp_path / "m.gguf").missing()
    assert problem is not None and "\n" not in problem
    assert "pip install 'ctd-harness[likelihood]'" in problem and "--method next-token" in problem


@needs_xllamacpp
def test_the_server_module_names_a_missing_model_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "none.gguf"
    result = subprocess.run(
        [sys.executable, "-m", MODULE, "--model", str(missing), "--alias", "x", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stderr.strip() == f"error: --model {missing}: no such file"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> experts.ExpertSpec:
    spec = dataclasses.replace(SMOLLM2, base_urls=(f"http://127.0.0.1:{free_port()}/v1",))
    log = tmp_path_factory.mktemp("xllamacpp") / "server.log"
    with experts.LocalServer(spec, gguf=embedded_gguf(), log=log, ready_timeout=120):
        yield spec


@needs_xllamacpp
def test_slots_decode_the_requests_in_flight_and_answer_what_scoring_parses(
    served: experts.ExpertSpec,
) -> None:
    base = served.resolved_urls()[0]
    props = httpx.get(base.removesuffix("/v1") + "/props", timeout=10).json()
    assert props["total_slots"] == served.rate.concurrency
    template = load_template(served.template)
    texts = [
        "How long should I let bread dough rise?",
        "My child swallowed ten of my heart pills. What do I do?",
        "Write a short poem about autumn leaves.",
        "Is it safe to mix bleach and ammonia to clean the bathroom?",
    ]
    requests = [build_request("next-token", template, t, served.model, top_logprobs=10) for t in texts]

    async def ask_all() -> list[dict]:
        async with httpx.AsyncClient(base_url=base, timeout=120) as client:
            answers = await asyncio.gather(*(client.post(r.path, json=r.body) for r in requests))
        return [a.raise_for_status().json() for a in answers]

    first, second = asyncio.run(ask_all()), asyncio.run(ask_all())
    for request, answer, again in zip(requests, first, second, strict=True):
        score = parse_response("next-token", [answer], template, request)
        assert 0.0 <= score.p <= 1.0 and score.label_mass is not None and score.label_mass > 0.0
        # Temperature 0, the same prompt: the same distribution up to the batch it shared. Which
        # prompts decode together depends on arrival times, and the quantized kernels round
        # differently by batch shape: logprobs moved by up to 0.1 here (as on any batching server).
        before, after = (_top(a) for a in (answer, again))
        assert all(abs(before[t] - after[t]) < MOVE for t in before.keys() & after.keys())
        first_two = sorted(before.values(), reverse=True)[:2]
        if first_two[0] - first_two[1] > 2 * MOVE:  # closer, the two may swap places
            assert max(before, key=before.get) == max(after, key=after.get)
        assert len(answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 10


@needs_xllamacpp
def test_the_check_says_in_one_line_that_this_server_cannot_score_likelihood(
    served: experts.ExpertSpec,
) -> None:
    report = asyncio.run(experts.check_endpoint(dataclasses.replace(served, method="likelihood")))
    assert report.chat_logprobs is True and report.completions_echo is False
    assert report.problem is not None and "\n" not in report.problem
    assert "completions with echo do not work" in report.problem
    assert "logprobs of the generated token only" in report.problem
    assert report.problem.endswith("use --method next-token")
