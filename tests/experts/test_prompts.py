"""Prompt templates: rendering a conversation, loading a template and its errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from experts import (
    BUILTIN_EXPERTS,
    BUILTIN_TEMPLATES,
    DEFAULT_TEMPLATE,
    ConfigError,
    describe_template,
    load_template,
)

# Private: conversation rendering, unit-tested.
from experts._prompts import render_conversation

STAKES_V1 = Path(__file__).resolve().parents[2] / "experts" / "prompts" / "stakes-v1.toml"


def test_render_string_is_unchanged() -> None:
    text = "  Keep {braces}, trailing spaces  \nand newlines\n"
    assert render_conversation(text) == text


def test_render_messages_with_roles_and_exact_content() -> None:
    messages = [
        {"role": "user", "content": "How do I {format} this?\n  indented"},
        {"role": "assistant", "content": "Like so: {conversation} "},
        {"role": "tool", "content": ""},
    ]
    expected = (
        "[user]\nHow do I {format} this?\n  indented\n\n[assistant]\nLike so: {conversation} \n\n[tool]\n"
    )
    assert render_conversation(messages) == expected
    template = load_template("stakes-v1")
    chat = template.messages(messages)
    assert [m["role"] for m in chat] == ["system", "user"]
    assert chat[0]["content"] == template.system
    assert chat[1]["content"] == template.user.replace("{conversation}", expected)
    prompt = template.completion_prompt(messages)
    assert expected in prompt
    assert prompt.endswith("\n\nAnswer:\n")


@pytest.mark.parametrize(
    "messages",
    [
        [{"content": "no role"}],
        [{"role": "user"}],
        [{"role": "user", "content": 3}],
        [{"role": None, "content": "x"}],
        [{"role": "user", "content": "fine"}, {"role": "user", "content": ["a", "list"]}],
    ],
)
def test_render_bad_messages_raise_value_error(messages: Any) -> None:
    with pytest.raises(ValueError, match="message"):
        render_conversation(messages)


def test_render_non_mapping_message_raises_value_error() -> None:
    with pytest.raises(ValueError):
        render_conversation([{"role": "user", "content": "ok"}, "not a message"])  # type: ignore[list-item]


def test_builtin_template_loads() -> None:
    template = load_template("stakes-v1")
    assert template.name == "stakes-v1"
    assert template.labels == {"high": "high", "low": "low"}
    assert template.answers == {
        "high": "This interaction is high-stakes.",
        "low": "This interaction is low-stakes.",
    }
    assert "{conversation}" in template.user
    assert re.fullmatch(r"[0-9a-f]{64}", template.sha256)
    assert load_template(str(STAKES_V1)).sha256 == template.sha256


def test_the_embedded_expert_asks_whether_everything_is_fine() -> None:
    """SmolLM2-135M's template: "no" (not fine) is the high-stakes answer, one token each."""
    template = load_template(BUILTIN_EXPERTS["smollm2"].template)
    assert template.name == "fine-v1"
    assert template.labels == {"high": "no", "low": "yes"}
    assert template.user.endswith("Is everything fine here? Answer yes or no.")
    # The same model on vLLM asks the same question; every other entry, a capable model, stakes-v1,
    # or a guard model its own pass-through template.
    assert BUILTIN_EXPERTS["smollm2-vllm"].template == "fine-v1"
    others = {spec.template for spec in BUILTIN_EXPERTS.values() if spec.model != "smollm2"}
    assert {t for t in others if load_template(t).kind == "wrapped"} == {"stakes-v1"}


def test_template_hash_follows_the_file_bytes(tmp_path: Path) -> None:
    copy = tmp_path / "copy.toml"
    copy.write_text(STAKES_V1.read_text(encoding="utf-8").replace("careful reviewer", "careful judge"))
    changed = load_template(str(copy))
    assert changed.sha256 != load_template("stakes-v1").sha256
    assert "careful judge" in changed.system


def test_load_template_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_template(str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="stakes-v1"):
        load_template("no-such-template")


@pytest.mark.parametrize("drop", ["system", "user", "labels", "answers"])
def test_load_template_missing_key(tmp_path: Path, drop: str) -> None:
    data = {
        "system": 'system = "s"',
        "user": 'user = "u {conversation}"',
        "labels": '[labels]\nhigh = "high"\nlow = "low"',
        "answers": '[answers]\nhigh = "H"\nlow = "L"',
    }
    del data[drop]
    path = tmp_path / f"no-{drop}.toml"
    path.write_text("\n".join(data.values()) + "\n")
    with pytest.raises(ConfigError, match=rf"missing key '{drop}'") as info:
        load_template(str(path))
    assert str(path) in str(info.value)


def test_load_template_without_conversation_slot(tmp_path: Path) -> None:
    path = tmp_path / "noslot.toml"
    path.write_text(STAKES_V1.read_text(encoding="utf-8").replace("{conversation}", "{convo}"))
    with pytest.raises(ConfigError, match="conversation") as info:
        load_template(str(path))
    assert str(path) in str(info.value)


def test_load_template_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('system = "s"\nuser = \n')
    with pytest.raises(ConfigError, match="line 2") as info:
        load_template(str(path))
    assert str(path) in str(info.value)


def test_every_builtin_template_is_described_and_every_description_loads() -> None:
    """`ctd experts add` and `show` say what a built-in template asks: each file in
    experts/prompts/ has its description, and each description names a template that loads."""
    files = {path.stem for path in STAKES_V1.parent.glob("*.toml")}
    assert set(BUILTIN_TEMPLATES) == files
    for name, about in BUILTIN_TEMPLATES.items():
        assert load_template(name).name == name and about
        assert describe_template(name) == about
    assert DEFAULT_TEMPLATE in BUILTIN_TEMPLATES
    assert describe_template(str(STAKES_V1)) == f"a template file ({STAKES_V1})"
