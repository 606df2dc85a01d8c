"""Versioned prompt templates and the rendering of inputs into prompts."""

from __future__ import annotations

import functools
import hashlib
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from ._errors import ConfigError, InvalidSetting

__all__ = [
    "BUILTIN_TEMPLATES",
    "DEFAULT_TEMPLATE",
    "TEMPLATE_KINDS",
    "Conversation",
    "PromptTemplate",
    "TemplateKind",
    "check_scoring_method",
    "describe_template",
    "load_template",
    "render_conversation",
]

Conversation = str | Sequence[Mapping[str, str]]
"""An input: a plain string (one user turn) or a list of {"role": ..., "content": ...} messages."""


_BUILTIN = Path(__file__).parent / "prompts"

TemplateKind = Literal["wrapped", "pass-through"]
"""wrapped: this project's system + user prompt around the rendered conversation (the files
without a `kind`); pass-through: the conversation's own messages, for a model trained on its own
chat template (a guard model), with optional `chat_template_kwargs` sent in the request."""
TEMPLATE_KINDS: tuple[str, ...] = get_args(TemplateKind)

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
    "llama-guard-3": (
        "asks Llama Guard 3 in its own chat template (its hazard categories), the conversation "
        'sent as it is (pass-through): P(first token "unsafe") against "safe" (the built-in '
        "llama-guard-3-1b and llama-guard-3-8b use it)"
    ),
    "shieldgemma-dangerous": (
        "asks ShieldGemma in its own chat template whether the conversation (sent as it is: "
        "pass-through) violates a dangerous-content policy, given as its `guideline`: "
        'P("Yes") against "No" (the built-in shieldgemma-2b uses it)'
    ),
    "granite-guardian-harm": (
        "asks Granite Guardian in its own chat template whether the conversation (sent as it "
        'is: pass-through) carries the risk "harm", given as guardian_config\'s risk_name: '
        'P("Yes") against "No" (the built-in granite-guardian-2b uses it)'
    ),
}


@dataclass(frozen=True)
class PromptTemplate:
    """A prompt file: system and user text with a {conversation} slot, the label words for
    next-token scoring and the two answers for likelihood scoring. `sha256` hashes the file's
    bytes, so any edit is a new template as far as the cache is concerned. A pass-through
    template has no system, user or answers: the conversation goes as it is, with
    `chat_template_kwargs` (None: none sent) for the model's chat template."""

    name: str
    system: str
    user: str
    labels: dict[str, str]
    answers: dict[str, str]
    sha256: str
    path: Path
    kind: TemplateKind = "wrapped"
    chat_template_kwargs: dict[str, Any] | None = field(default=None)
    drop_system: bool = False  # pass-through: leave out the conversation's system messages

    def messages(self, conversation: Conversation) -> list[dict[str, str]]:
        """Chat messages for next-token scoring: a pass-through template's are the
        conversation's own (a plain string is one user turn)."""
        if self.kind == "pass-through":
            own = _own_messages(conversation)
            return [m for m in own if m["role"] != "system"] if self.drop_system else own
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
        if self.kind == "pass-through":
            raise ConfigError(f"{self.path}: a pass-through template {_NEXT_TOKEN_ONLY}", setting="method")
        user = self.user.replace("{conversation}", render_conversation(conversation))
        return f"{self.system}\n\n{user}\n\nAnswer:\n"


# Why likelihood is refused: it appends each answer to a plain-text prompt sent to
# /completions, which applies no chat template; a guard model is asked through its own chat
# template, which only the server renders, so there is no plain-text prompt to append to.
_NEXT_TOKEN_ONLY = (
    "scores by next-token only (the model answers in its own chat template, whose rendering "
    'only the server knows); use method = "next-token"'
)


def _checked_messages(conversation: Sequence[Mapping[str, str]]) -> list[tuple[str, str]]:
    """(role, content) of each message; ValueError naming the first that is not one."""
    checked = []
    for i, message in enumerate(conversation):
        if not isinstance(message, Mapping):
            raise ValueError(f"message {i} must be a mapping with 'role' and 'content', got {message!r}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise ValueError(f"message {i} needs string 'role' and 'content', got {dict(message)!r}")
        checked.append((role, content))
    return checked


def _own_messages(conversation: Conversation) -> list[dict[str, str]]:
    """The conversation as chat messages, role and content as given; a plain string is one
    user turn."""
    if isinstance(conversation, str):
        return [{"role": "user", "content": conversation}]
    return [{"role": role, "content": content} for role, content in _checked_messages(conversation)]


def render_conversation(conversation: Conversation) -> str:
    """A plain string as it is; messages as "[role]" headers over their exact content."""
    if isinstance(conversation, str):
        return conversation
    return "\n\n".join(f"[{role}]\n{content}" for role, content in _checked_messages(conversation))


def load_template(name_or_path: str) -> PromptTemplate:
    """A built-in template by name (experts/prompts/NAME.toml) or a template file by path. Read
    once per version of the file (its size and modification time): a file edited since is read
    again, in a notebook's long-lived process too."""
    path = Path(name_or_path)
    if not path.suffix:
        path = _BUILTIN / f"{name_or_path}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in _BUILTIN.glob("*.toml")))
        raise ConfigError(f"prompt template {name_or_path!r} not found (built-in: {known}, or a .toml path)")
    version = path.stat()
    return _read_template(path, version.st_size, version.st_mtime_ns)


@functools.cache
def _read_template(path: Path, size: int, mtime_ns: int) -> PromptTemplate:
    """`load_template` of the file at `path` as it is at (`size`, `mtime_ns`)."""
    raw = path.read_bytes()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    kind = data.get("kind", "wrapped")
    if kind not in TEMPLATE_KINDS:
        raise ConfigError(f"{path}: kind = {kind!r}: must be one of {', '.join(TEMPLATE_KINDS)}")
    if kind == "pass-through":
        return _pass_through(path, raw, data)
    if "chat_template_kwargs" in data:
        raise ConfigError(f'{path}: chat_template_kwargs needs kind = "pass-through"')
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
    _check_labels(path, template.labels)
    return template


def _check_labels(path: Path, labels: dict[str, str]) -> None:
    """Two labels the next-token parse can tell apart: non-empty, without surrounding whitespace
    (it strips a token's, never a label's), and different when case is ignored (as it is there)."""
    for name in ("high", "low"):
        if not labels[name].strip() or labels[name] != labels[name].strip():
            raise ConfigError(
                f"{path}: labels.{name} = {labels[name]!r}: a label is a word without spaces around it "
                "(a token's leading space is ignored when answers are read)"
            )
    if labels["high"].lower() == labels["low"].lower():
        raise ConfigError(
            f"{path}: labels.high and labels.low must differ (case is ignored when answers are read)"
        )


def _pass_through(path: Path, raw: bytes, data: dict[str, Any]) -> PromptTemplate:
    """A pass-through template file: name, kind, labels, and chat_template_kwargs (a table)."""
    unknown = sorted(set(data) - {"name", "kind", "labels", "chat_template_kwargs", "system_messages"})
    if unknown:
        raise ConfigError(
            f"{path}: {unknown[0]!r} has no place in a pass-through template (it has name, kind, "
            "labels, chat_template_kwargs and system_messages: the conversation is sent as it is)"
        )
    # A guard model's chat template may refuse a system turn (Llama Guard 3's requires turns
    # that alternate user and assistant): "drop" leaves the deployment's system prompt out.
    system_messages = data.get("system_messages", "keep")
    if system_messages not in ("keep", "drop"):
        raise ConfigError(f'{path}: system_messages = {system_messages!r}: must be "keep" or "drop"')
    labels = data.get("labels")
    if not isinstance(labels, dict) or not all(isinstance(labels.get(k), str) for k in ("high", "low")):
        raise ConfigError(f"{path}: [labels] needs high and low, the model's own answer tokens")
    _check_labels(path, labels)
    kwargs = data.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ConfigError(
            f"{path}: chat_template_kwargs must be a table (keys for the model's chat template)"
        )
    return PromptTemplate(
        name=str(data.get("name", path.stem)),
        system="",
        user="",
        labels={"high": labels["high"], "low": labels["low"]},
        answers={},
        sha256=hashlib.sha256(raw).hexdigest(),
        path=path,
        kind="pass-through",
        chat_template_kwargs=kwargs,
        drop_system=system_messages == "drop",
    )


def check_scoring_method(name_or_path: str, method: str) -> None:
    """InvalidSetting on `method` when the template cannot be scored by it (a pass-through
    template by likelihood). A template that does not load is left to where it is loaded."""
    if method != "likelihood":
        return
    try:
        template = load_template(name_or_path)
    except ConfigError:
        return
    if template.kind == "pass-through":
        raise InvalidSetting(
            "method", repr(method), f"template {name_or_path!r} is pass-through and {_NEXT_TOKEN_ONLY}"
        )


def describe_template(name_or_path: str) -> str:
    """What a template asks and which experts it suits, in words: a built-in's description, or
    for a file, that it is one."""
    if name_or_path in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[name_or_path]
    return f"a template file ({name_or_path})"
