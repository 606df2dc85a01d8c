"""OpenAI chat messages as the text that the probes and the expert read."""

from __future__ import annotations

import json
from collections.abc import Mapping

__all__ = ["MESSAGE_FIELDS", "ROLE_ALIASES", "chat_message"]

ROLE_ALIASES = {"developer": "system", "function": "tool"}
"""OpenAI's other names for two roles: `developer` is the system message of its newer models,
`function` the legacy name of a tool's answer."""

MESSAGE_FIELDS = frozenset(
    {"role", "content", "name", "tool_calls", "tool_call_id"}
    | {"refusal", "function_call", "audio", "annotations"}
)
"""The fields of an OpenAI chat message, as a client sends it or as the API returns an
assistant's turn (the SDK's `message.to_dict()`, which a client appends to its history)."""


def chat_message(message: Mapping[str, object]) -> dict[str, str]:
    """{"role", "content"} of an OpenAI chat message: its role (ROLE_ALIASES resolved), and as
    content its text, then its refusal, then one line per tool call, `[tool call] NAME(ARGUMENTS)`
    (from `tool_calls`, or the legacy `function_call`). A content is a string or a list of
    content parts whose text (and refusal) parts are joined by newlines, as vLLM joins them for a
    chat template that takes text. The same text in training data and in served requests, so a
    probe sees at serving what it was trained on. `name`, `tool_call_id` and `annotations` (a
    reply's citations, which point into its content) are not read. ValueError, its message
    starting with the field ("content...", "tool_calls[1]..."), for anything else: a part or a
    reply that is not text (an image, audio) is refused rather than dropped, since the monitor
    would not see what was sent."""
    role = message.get("role")
    if not isinstance(role, str):
        raise ValueError("role: must be a string")
    role = ROLE_ALIASES.get(role, role)
    if message.get("audio") is not None:
        raise ValueError("audio: an audio reply is not read; send its transcript as the content")
    annotations = message.get("annotations")
    if annotations is not None and not isinstance(annotations, list):
        raise ValueError("annotations: must be a list")
    texts = _content_texts(message.get("content"))
    refusal = message.get("refusal")
    if refusal is not None:
        if not isinstance(refusal, str):
            raise ValueError("refusal: must be a string")
        texts.append(refusal)
    calls = _call_lines(role, message.get("tool_calls"), message.get("function_call"))
    if not texts and not calls:
        raise ValueError("content: must be a string or a non-empty list of text parts")
    return {"role": role, "content": "\n".join([*texts, *calls])}


def _content_texts(content: object) -> list[str]:
    """The texts of a content: itself when a string, its text and refusal parts when a list;
    none when null (a turn of tool calls or a refusal only)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list) or not content:
        raise ValueError("content: must be a string or a non-empty list of text parts")
    texts: list[str] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            raise ValueError(f'content[{j}]: must be a part such as {{"type": "text", "text": "..."}}')
        if kind not in ("text", "refusal"):
            raise ValueError(f"content[{j}]: a part of type {kind!r}; only text parts are read")
        if not isinstance(part.get(kind), str):
            raise ValueError(f"content[{j}].{kind}: must be a string")
        texts.append(part[kind])
    return texts


def _call_lines(role: str, tool_calls: object, function_call: object) -> list[str]:
    """`[tool call] NAME(ARGUMENTS)` for each of an assistant's OpenAI `tool_calls`, or for its
    legacy `function_call` (ARGUMENTS the JSON text as sent; given as an object, its JSON)."""
    if tool_calls is None and function_call is None:
        return []
    if role != "assistant":
        field = "tool_calls" if tool_calls is not None else "function_call"
        raise ValueError(f"{field}: only an assistant message makes tool calls")
    functions: list[tuple[str, dict]] = []
    if tool_calls is not None:
        if not isinstance(tool_calls, list) or not tool_calls:
            raise ValueError("tool_calls: must be a non-empty list of calls")
        for j, call in enumerate(tool_calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or call.get("type", "function") != "function":
                example = '{"type": "function", "function": {"name": ...}}'
                raise ValueError(f"tool_calls[{j}]: must be a call such as {example}")
            functions.append((f"tool_calls[{j}].function", function))
    if function_call is not None:
        if not isinstance(function_call, dict):
            raise ValueError('function_call: must be a call such as {"name": ..., "arguments": "..."}')
        functions.append(("function_call", function_call))
    lines: list[str] = []
    for where, function in functions:
        name, arguments = function.get("name"), function.get("arguments", "")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.name: must be a non-empty string")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        if not isinstance(arguments, str):
            raise ValueError(f"{where}.arguments: must be JSON text (a string)")
        lines.append(f"[tool call] {name}({arguments})")
    return lines
