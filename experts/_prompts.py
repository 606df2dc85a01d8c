"""Versioned prompt templates and the rendering of inputs into prompts."""

from __future__ import annotations

import functools
import hashlib
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ._errors import ConfigError

__all__ = [
    "BUILTIN_TEMPLATES",
    "DEFAULT_TEMPLATE",
    "Conversation",
    "PromptTemplate",
    "describe_template",
    "load_template",
    "render_conversation",
]

Conversation = str | Sequence[Mapping[str, str]]
"""An input: a plain string (one user turn) or a list of {"role": ..., "content": ...} messages."""

_BUILTIN = Path(__file__).parent / "prompts"

DEFAULT_TEMPLATE = "stakes-v1"
"""The template of an expert whose entry names none: it asks the task itself, for a capable model."""

# What each built-in template asks and which experts it suits, for `ctd experts` (kept here, not
# in the files: a file's bytes are part of every cache key that uses it).
BUILTIN_TEMPLATES: dict[str, str] = {
    "stakes-v1": (
        "asks whether the interaction is high-stakes or low-stakes, defining both: the task itself, "
        "for instruct models that follow a definition (the built-in gemma-27b and llama-1b, the "
        "paper's two experts, use it)"
    ),
    "fine-v1": (
        'asks "Is everything fine here? Answer yes or no." ("no" counting as high-stakes): for very '
        "small models that answer high to nearly every stakes-v1 prompt, such as SmolLM2-135M (the "
        "built-in smollm2 and smollm2-vllm use it)"
    ),
}


@dataclass(frozen=True)
class PromptTemplate:
    """A prompt file: system and user text with a {conversation} slot, the label words for
    next-token scoring and the two answers for likelihood scoring. `sha256` hashes the file's
    bytes, so any edit is a new template as far as the cache is concerned."""

    name: str
    system: str
    user: str
    labels: dict[str, str]
    answers: dict[str, str]
    sha256: str
    path: Path

    def messages(self, conversation: Conversation) -> list[dict[str, str]]:
        """Chat messages for next-token scoring."""
        return [
            {"role": "system", "content": self.system},
            {
                "role": "user",
                "content": self.user.replace("{conversation}", render_conversation(conversation)),
            },
        ]

    def completion_prompt(self, conversation: Conversation) -> str:
        """Plain-text prompt for likelihood scoring; the answer starts on a fresh line so that
        it begins on a token boundary."""
        user = self.user.replace("{conversation}", render_conversation(conversation))
        return f"{self.system}\n\n{user}\n\nAnswer:\n"


def render_conversation(conversation: Conversation) -> str:
    """A plain string as it is; messages as "[role]" headers over their exact content."""
    if isinstance(conversation, str):
        return conversation
    blocks = []
    for i, message in enumerate(conversation):
        if not isinstance(message, Mapping):
            raise ValueError(f"message {i} must be a mapping with 'role' and 'content', got {message!r}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise ValueError(f"message {i} needs string 'role' and 'content', got {dict(message)!r}")
        blocks.append(f"[{role}]\n{content}")
    return "\n\n".join(blocks)


@functools.cache
def load_template(name_or_path: str) -> PromptTemplate:
    """A built-in template by name (experts/prompts/NAME.toml) or a template file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = _BUILTIN / f"{name_or_path}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in _BUILTIN.glob("*.toml")))
        raise ConfigError(f"prompt template {name_or_path!r} not found (built-in: {known}, or a .toml path)")
    raw = path.read_bytes()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        template = PromptTemplate(
            name=str(data.get("name", path.stem)),
            system=str(data["system"]),
            user=str(data["user"]),
            labels={"high": str(data["labels"]["high"]), "low": str(data["labels"]["low"])},
            answers={"high": str(data["answers"]["high"]), "low": str(data["answers"]["low"])},
            sha256=hashlib.sha256(raw).hexdigest(),
            path=path,
        )
    except KeyError as exc:
        raise ConfigError(
            f"{path}: missing key {exc.args[0]!r} (a template has system, user, labels, answers)"
        ) from None
    if "{conversation}" not in template.user:
        raise ConfigError(f"{path}: 'user' has no {{conversation}} slot")
    return template


def describe_template(name_or_path: str) -> str:
    """What a template asks and which experts it suits, in words: a built-in's description, or
    for a file, that it is one."""
    if name_or_path in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[name_or_path]
    return f"a template file ({name_or_path})"
