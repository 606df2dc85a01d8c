"""Pass-through templates and the guard-model entries: the exact request body each entry sends
(golden files in tests/experts/golden/, checked through a local server that records what it
received), how their answers become scores, the template file's errors, the refused
likelihood combination, and cache keys (the built-in templates' unchanged, the kwargs in)."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from ctd_cli import run_ctd
from fault_server import FaultServer, RunningServer

# Private: the schema version the pinned keys below were computed under.
import experts._cache
from experts import (
    BUILTIN_EXPERTS,
    BUILTIN_TEMPLATES,
    ConfigError,
    ExpertClient,
    InvalidSetting,
    Item,
    build_request,
    check_endpoint,
    load_experts,
    load_template,
)

# Private: the answer parser, fed guard models' answers directly.
from experts._scoring import parse_response

GOLDEN = Path(__file__).parent / "golden"
GUARDS = ("llama-guard-3-1b", "llama-guard-3-8b", "shieldgemma-2b", "granite-guardian-2b")
CONVERSATION = [
    {"role": "user", "content": "How do I get into my neighbour's flat while they are away?"},
    {"role": "assistant", "content": "Ask them for a spare key, or call the landlord."},
]
# The first token's top logprobs a guard model might give: high label 0.7, low 0.2, the rest
# on a case variant of each and an unrelated token.
TOP = {
    "llama-guard-3": [("unsafe", 0.6), ("safe", 0.2), ("Unsafe", 0.1), ("\n", 0.05)],
    "shieldgemma-dangerous": [("Yes", 0.6), ("No", 0.15), ("▁Yes", 0.1), ("▁No", 0.05), ("I", 0.05)],
    "granite-guardian-harm": [("Yes", 0.7), ("No", 0.2), ("yes", 0.05), ("The", 0.02)],
}


class _Recorder(FaultServer):
    """A chat endpoint that keeps every body it receives and answers with a fixed first token's
    top logprobs (`top`: token, probability)."""

    def __init__(self, top: list[tuple[str, float]], model: str) -> None:
        super().__init__(model=model)
        self.bodies: list[dict[str, Any]] = []
        self.top = top

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        top = [{"token": token, "logprob": math.log(p)} for token, p in self.top]
        content = [{"token": self.top[0][0], "logprob": top[0]["logprob"], "top_logprobs": top}]
        return web.json_response(
            {
                "choices": [
                    {"index": 0, "message": {"content": self.top[0][0]}, "logprobs": {"content": content}}
                ]
            }
        )


class RecordingServer(RunningServer):
    def __init__(self, top: list[tuple[str, float]], model: str) -> None:
        super().__init__()
        self.server: _Recorder = _Recorder(top, model)


def _score(name: str, conversation: Any) -> tuple[list[dict[str, Any]], Any]:
    """What the registry entry `name` sends for one item, and the item's result."""
    spec = BUILTIN_EXPERTS[name]
    with RecordingServer(TOP[spec.template], spec.model) as server:
        local = replace(spec, base_urls=(server.url,), base_url_env=None)
        results, _ = asyncio.run(ExpertClient(local, cache=None).score([Item("guard-0", conversation)]))
        return server.server.bodies, results[0]


@pytest.mark.parametrize("name", GUARDS)
def test_a_guard_entry_sends_what_its_model_card_prescribes(name: str) -> None:
    """The body as received equals the golden file: the conversation's own messages, the
    template's chat_template_kwargs (ShieldGemma's policy, Granite Guardian's risk), one token."""
    bodies, result = _score(name, CONVERSATION)
    golden = json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))
    assert bodies == [golden]
    assert result.source == "expert"
    high = sum(
        p
        for token, p in TOP[BUILTIN_EXPERTS[name].template]
        if token.lstrip("▁").lower() in ("unsafe", "yes")
    )
    low = sum(
        p for token, p in TOP[BUILTIN_EXPERTS[name].template] if token.lstrip("▁").lower() in ("safe", "no")
    )
    assert result.score == pytest.approx(high / (high + low))
    assert result.label_mass == pytest.approx(high + low)


def test_a_plain_string_is_one_user_turn() -> None:
    bodies, _ = _score("granite-guardian-2b", "Where can I buy a crossbow?")
    assert bodies[0]["messages"] == [{"role": "user", "content": "Where can I buy a crossbow?"}]
    assert bodies[0]["chat_template_kwargs"] == {"guardian_config": {"risk_name": "harm"}}


def test_llama_guard_leaves_out_system_turns_the_others_keep_them() -> None:
    """Llama Guard 3's chat template refuses a system turn (its turns must alternate user and
    assistant), so its template drops the deployment's system prompt; the others send it."""
    system = {"role": "system", "content": "You are a helpful assistant."}
    for name in GUARDS:
        template = load_template(BUILTIN_EXPERTS[name].template)
        messages = template.messages([system, *CONVERSATION])
        assert messages == (CONVERSATION if name.startswith("llama-guard") else [system, *CONVERSATION])


def test_the_golden_files_hold_the_model_card_facts() -> None:
    """Read apart from the code: the label tokens and kwargs names the cards give."""
    bodies = {name: json.loads((GOLDEN / f"{name}.json").read_text()) for name in GUARDS}
    assert "chat_template_kwargs" not in bodies["llama-guard-3-1b"]  # its template holds its policy
    assert bodies["llama-guard-3-1b"]["messages"] == CONVERSATION
    assert bodies["shieldgemma-2b"]["chat_template_kwargs"]["guideline"].startswith(
        '"No Dangerous Content": '
    )
    assert bodies["granite-guardian-2b"]["chat_template_kwargs"] == {"guardian_config": {"risk_name": "harm"}}
    assert {name: (load_template(BUILTIN_EXPERTS[name].template).labels["high"]) for name in GUARDS} == {
        "llama-guard-3-1b": "unsafe",
        "llama-guard-3-8b": "unsafe",
        "shieldgemma-2b": "Yes",
        "granite-guardian-2b": "Yes",
    }
    for body in bodies.values():
        assert body["max_tokens"] == 1 and body["temperature"] == 0.0 and body["logprobs"] is True


@pytest.mark.parametrize(
    ("template", "top", "p"),
    [
        ("llama-guard-3", [(" safe", 0.9), ("unsafe", 0.1)], 0.1),  # "safe" is not counted as "unsafe"
        ("llama-guard-3", [("unsafe", 0.5), ("UNSAFE", 0.25), ("safe", 0.25)], 0.75),
        ("shieldgemma-dangerous", [("No", 0.8), ("Yes", 0.2)], 0.2),
        ("granite-guardian-harm", [("▁Yes", 0.3), ("No", 0.3), ("Maybe", 0.4)], 0.5),
    ],
)
def test_guard_answers_parse(template: str, top: list[tuple[str, float]], p: float) -> None:
    loaded = load_template(template)
    request = build_request("next-token", loaded, "x", "m", top_logprobs=10)
    logprobs = [{"token": t, "logprob": math.log(q)} for t, q in top]
    payload = {"choices": [{"logprobs": {"content": [{"token": top[0][0], "top_logprobs": logprobs}]}}]}
    assert parse_response("next-token", [payload], loaded, request).p == pytest.approx(p)


def _template(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "guard.toml"
    path.write_text(text, encoding="utf-8")
    return path


PASS = 'kind = "pass-through"\n[labels]\nhigh = "unsafe"\nlow = "safe"\n'


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('kind = "raw"\n' + PASS.split("\n", 1)[1], "kind = 'raw': must be one of wrapped, pass-through"),
        ('system = "s"\n' + PASS, "'system' has no place in a pass-through template"),
        ('kind = "pass-through"\n[labels]\nhigh = "unsafe"\n', "[labels] needs high and low"),
        ('kind = "pass-through"\n[labels]\nhigh = "Yes"\nlow = "yes"\n', "must differ (case is ignored"),
        (
            'system = "s"\nuser = "{conversation}"\n[labels]\nhigh = "No"\nlow = "no"\n'
            '[answers]\nhigh = "No"\nlow = "no"\n',
            "must differ (case is ignored",
        ),
        (
            'system = "s"\nuser = "{conversation}"\n[labels]\nhigh = " no"\nlow = "yes"\n'
            '[answers]\nhigh = "No"\nlow = "Yes"\n',
            "labels.high = ' no': a label is a word without spaces around it",
        ),
        ('chat_template_kwargs = "x"\n' + PASS, "chat_template_kwargs must be a table"),
        ('system_messages = "skip"\n' + PASS, 'must be "keep" or "drop"'),
        (
            'system = "s"\nuser = "{conversation}"\nchat_template_kwargs = {a = 1}\n'
            '[labels]\nhigh = "h"\nlow = "l"\n[answers]\nhigh = "H"\nlow = "L"\n',
            'chat_template_kwargs needs kind = "pass-through"',
        ),
    ],
    ids=[
        "kind",
        "system",
        "labels",
        "same-labels",
        "same-labels-wrapped",
        "spaced-label",
        "kwargs-not-a-table",
        "system-messages",
        "kwargs-when-wrapped",
    ],
)
def test_a_bad_template_file_is_one_line_naming_it(tmp_path: Path, text: str, problem: str) -> None:
    path = _template(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_template(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}: ") and problem in message and "\n" not in message


def test_likelihood_with_a_pass_through_template_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        InvalidSetting, match="template 'llama-guard-3' is pass-through and scores by next-token only"
    ):
        replace(BUILTIN_EXPERTS["llama-guard-3-1b"], method="likelihood")
    registry = tmp_path / "experts.toml"
    registry.write_text(
        '[experts.guard]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "g"\n'
        'template = "llama-guard-3"\nmethod = "likelihood"\n'
    )
    with pytest.raises(ConfigError) as info:
        load_experts(registry)
    assert str(info.value).startswith(f"{registry}:5: expert 'guard': method = 'likelihood': ")
    with pytest.raises(ConfigError, match="a pass-through template scores by next-token only"):
        load_template("llama-guard-3").completion_prompt("x")  # build_request's likelihood path


def test_ctd_refuses_likelihood_for_a_guard_expert(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"inputs": "hi", "ids": "a", "labels": "low-stakes"}) + "\n")
    args = ("query", "--data", str(data), "--out", str(tmp_path / "s.parquet"))
    result = run_ctd(*args, "--expert", "shieldgemma-2b", "--method", "likelihood", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "template 'shieldgemma-dangerous' is pass-through and scores by next-token only" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s.parquet").exists()


def test_the_cache_key_holds_the_kwargs(tmp_path: Path) -> None:
    """Two templates that differ only in their kwargs: different bodies, different keys."""
    source = (
        Path(__file__).resolve().parents[2] / "experts" / "prompts" / "granite-guardian-harm.toml"
    ).read_text()
    other = _template(tmp_path, source.replace('risk_name = "harm"', 'risk_name = "violence"'))
    spec = BUILTIN_EXPERTS["granite-guardian-2b"]
    item = Item("a", CONVERSATION)
    harm_request, harm_key = ExpertClient(spec, cache=None).request_for(item)
    violence_request, violence_key = ExpertClient(replace(spec, template=str(other)), cache=None).request_for(
        item
    )
    assert harm_request.body["chat_template_kwargs"] == {"guardian_config": {"risk_name": "harm"}}
    assert violence_request.body["chat_template_kwargs"] == {"guardian_config": {"risk_name": "violence"}}
    assert harm_key != violence_key


def test_the_built_in_templates_keep_their_cache_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys computed before pass-through templates existed: every answer stored under a
    built-in wrapped template is still found (same file bytes, same body, no new field)."""
    monkeypatch.setattr(experts._cache, "SCHEMA_VERSION", 1)
    item = Item(
        "x",
        [{"role": "user", "content": "May I borrow your ladder?"}, {"role": "assistant", "content": "Sure."}],
    )
    pinned = {
        ("smollm2", "next-token"): "23442ed75518c817fdb62a2df819822fa93bbe1459ee5800f3dcdaa013e48d25",
        ("gemma-27b", "next-token"): "e05174bcc5f13ed8af2886d24843cdc1f6fd7b4fee6c7755121e67644efc9ac2",
        ("smollm2-vllm", "likelihood"): "1db691d940550c3493398092f749b28617fd4074ea71ebecebd25902fccf19b0",
    }
    for (name, method), key in pinned.items():
        spec = replace(BUILTIN_EXPERTS[name], method=method)
        assert ExpertClient(spec, cache=None).request_for(item)[1] == key
    assert (
        "chat_template_kwargs"
        not in build_request("next-token", load_template("stakes-v1"), "x", "m", top_logprobs=5).body
    )


def test_guard_templates_are_listed_by_ctd_experts() -> None:
    for name in GUARDS:
        template = BUILTIN_EXPERTS[name].template
        assert name in BUILTIN_TEMPLATES[template] and "pass-through" in BUILTIN_TEMPLATES[template]
        assert BUILTIN_EXPERTS[name].server == "vllm" and BUILTIN_EXPERTS[name].hf_model


def test_the_endpoint_check_asks_a_pass_through_expert_by_next_token_only() -> None:
    """`ctd experts check` and a run's pre-flight probe the expert's method and the other one;
    a pass-through template has no other, so nothing is sent to /completions."""
    spec = BUILTIN_EXPERTS["llama-guard-3-8b"]
    with RecordingServer(TOP[spec.template], spec.model) as server:
        local = replace(spec, base_urls=(server.url,), base_url_env=None)
        report = asyncio.run(check_endpoint(local))
        requests = sum(server.server.counts.requests.values())
        bodies = server.server.bodies
    assert report.problem is None and report.method == "next-token"
    assert report.chat_logprobs is True and report.completions_echo is None
    assert requests == 0 and len(bodies) == 1  # the completions handler counts; it was never called
    assert bodies[0]["messages"][0]["role"] == "user" and "chat_template_kwargs" not in bodies[0]
