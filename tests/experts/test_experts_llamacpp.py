"""A real server: llama.cpp serving SmolLM2-135M-Instruct on loopback, scored end to end: its own
server (xllamacpp) for next-token scoring, llama-cpp-python's (the optional [likelihood] extra)
for likelihood scoring."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest
from ctd_cli import free_port, llama_servers_on, start_ctd

import experts
from experts import ExpertClient, Item, ScoreCache

# Private: the llama.cpp server module the local server starts.
from experts._serve import SERVER_MODULE as MODULE
from probes import embedded_gguf

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("xllamacpp") is None,
    reason="xllamacpp (llama.cpp's server) is not installed (see the README's install command)",
)
NO_LIKELIHOOD_SERVER = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="likelihood scoring needs llama-cpp-python's server: pip install -e '.[likelihood]' "
    "(the fault server's tests cover likelihood scoring without it)",
)

EXAMPLES = [
    Item("bread", "How long should I let bread dough rise?"),
    Item("dose", [{"role": "user", "content": "My child swallowed ten of my heart pills. What do I do?"}]),
    Item("poem", "Write a short poem about autumn leaves."),
]


@pytest.fixture(scope="module", params=["next-token", pytest.param("likelihood", marks=NO_LIKELIHOOD_SERVER)])
def smollm2(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> experts.ExpertSpec:
    """The embedded expert on the server `ctd` starts for the method: llama.cpp's own for
    next-token scoring, llama-cpp-python's for likelihood scoring."""
    port = free_port()
    spec = dataclasses.replace(
        experts.BUILTIN_EXPERTS["smollm2"], base_urls=(f"http://127.0.0.1:{port}/v1",), method=request.param
    )
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with experts.LocalServer(spec, gguf=embedded_gguf(), log=log, ready_timeout=120):
        report = asyncio.run(experts.check_endpoint(spec))
        assert report.ok, report.problem
        if request.param == "next-token":
            assert report.chat_logprobs and report.completions_echo is False  # no prompt logprobs
        else:
            assert report.completions_echo
        yield spec


def test_llamacpp_scores_real_examples(smollm2: experts.ExpertSpec, tmp_path: Path) -> None:
    spec, method = smollm2, smollm2.method
    cache = ScoreCache(tmp_path / "cache.db")
    results, stats = asyncio.run(ExpertClient(spec, cache=cache).score(EXAMPLES))
    assert [r.id for r in results] == [item.id for item in EXAMPLES]
    assert stats.scored == len(EXAMPLES) and stats.failed == 0
    for result in results:
        # A next-token score is exactly 0 or 1 when only one label is in the top logprobs.
        assert result.source == "expert" and 0.0 <= result.score <= 1.0
        if method == "next-token":
            assert result.label_mass is not None and 0.0 < result.label_mass <= 1.0 + 1e-9
    # The same request again is served from the cache, with the same scores.
    again, stats = asyncio.run(ExpertClient(spec, cache=cache).score(EXAMPLES))
    assert stats.cached == len(EXAMPLES)
    assert [r.score for r in again] == [r.score for r in results]
    assert cache.integrity_check() == "ok"


def test_the_local_server_evaluates_the_template_prefix_once(smollm2: experts.ExpertSpec) -> None:
    """Every expert prompt starts with the template's text: llama.cpp's server keeps it in the
    slot's KV cache and evaluates only what follows (about 30% of the built-in set's prompt tokens
    with fine-v1, 55% with stakes-v1). Started with --no-prompt-cache, the second answer reports
    no cached tokens."""
    if smollm2.method != "next-token":
        pytest.skip("llama-cpp-python's server, started for likelihood scoring, is not ours to configure")
    template = experts.load_template(smollm2.template)
    usages = []
    for item in EXAMPLES[:2]:  # one at a time: the second goes to the slot sharing most of its prefix
        request = experts.build_request(
            "next-token", template, item.conversation, smollm2.model, top_logprobs=smollm2.top_logprobs
        )
        answer = httpx.post(smollm2.base_urls[0] + request.path, json=request.body, timeout=60)
        answer.raise_for_status()
        usages.append(answer.json()["usage"])
    reused = usages[1]["prompt_tokens_details"]["cached_tokens"]
    # A floor: the system text's own tokens (the chat template's markers around it add more).
    system_tokens = httpx.post(
        smollm2.base_urls[0].removesuffix("/v1") + "/tokenize", json={"content": template.system}, timeout=60
    ).json()["tokens"]
    assert len(system_tokens) <= reused < usages[1]["prompt_tokens"], (len(system_tokens), usages)


@pytest.mark.parametrize("when", ["loading", "serving"])
def test_sigterm_stops_the_server_it_started(when: str, tmp_path: Path) -> None:
    """`kill PID` on `ctd experts serve` (what a scheduler or a shell's kill sends) stops the
    llama.cpp child too, whether it is still loading the model or already serving."""
    port = free_port()
    process = start_ctd("experts", "serve", "smollm2", "--port", str(port), cwd=tmp_path)
    assert process.stdout is not None
    wanted = MODULE if when == "loading" else "serving smollm2"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        assert line, process.communicate()
        if wanted in line:
            break
    if when == "loading":
        while not llama_servers_on(port) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert llama_servers_on(port), "the server never started"
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode in (0, 130)
    assert llama_servers_on(port) == []
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_the_recovery_ladder_against_the_real_server(tmp_path: Path) -> None:
    """Labels the model is not asked for ("red"/"green" under a yes-or-no question): its own
    answers hold neither, and llama.cpp's server takes every rung's request (20 top logprobs, the
    labels named). Measured: "bread" and "poem" get a score from `named-labels`, "dose" none."""
    template = tmp_path / "colours.toml"
    text = (Path(experts.__file__).parent / "prompts" / "fine-v1.toml").read_text(encoding="utf-8")
    template.write_text(text.replace('high = "no"', 'high = "red"').replace('low = "yes"', 'low = "green"'))
    port = free_port()
    spec = dataclasses.replace(
        experts.BUILTIN_EXPERTS["smollm2"], base_urls=(f"http://127.0.0.1:{port}/v1",), template=str(template)
    )
    with experts.LocalServer(spec, gguf=embedded_gguf(), log=tmp_path / "server.log", ready_timeout=120):
        cache = ScoreCache(tmp_path / "cache.db")
        results, stats = asyncio.run(ExpertClient(spec, cache=cache).score(EXAMPLES))
    recovered = [r for r in results if r.source == "expert"]
    assert recovered and all(r.how in ("wider-top-k", "named-labels") for r in recovered)
    for _, (failure,) in (cache.lookup_item(r.id) for r in results if r.source == "failed"):
        assert failure.reason == "no-label-mass" and failure.attempts == 1
        assert "wider-top-k: no-label-mass; named-labels: no-label-mass" in failure.message  # none refused
    # The tokens of the item's own request and of each rung it sent are counted.
    assert stats.completion_tokens == sum(2 if r.how == "wider-top-k" else 3 for r in recovered)
