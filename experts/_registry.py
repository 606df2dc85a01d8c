"""Expert registry: built-in entries and the user's own, kept in an editable TOML file.

    [experts.my-judge]
    base_url = "http://10.0.0.5:8000/v1"      # or base_urls = [...] for replicas
    model = "Qwen/Qwen2.5-7B-Instruct"         # served model name
    api_key_env = "MY_JUDGE_KEY"               # the variable's name, never the key
    method = "next-token"                      # or "likelihood"
    template = "stakes-v1"
    concurrency = 32
    rpm = 600
    tpm = 500000

The file is $CTD_EXPERTS_FILE, else ~/.config/ctd/experts.toml.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ._config import RateLimit, RetryPolicy, Timeout
from ._errors import ConfigError
from ._scoring import SCORING_METHODS, ScoringMethod

__all__ = [
    "BUILTIN_EXPERTS",
    "ExpertSpec",
    "add_expert",
    "expert_from_url",
    "experts_file",
    "load_experts",
    "resolve_expert",
]

ServerKind = Literal["vllm", "llama.cpp", "external"]


@dataclass(frozen=True, kw_only=True)
class ExpertSpec:
    """Everything needed to query one expert. `base_url_env` names a variable whose value
    (comma-separated URLs) replaces `base_urls`; `api_key_env` names the variable holding the
    key. `hf_model` and `server` say what `ctd experts serve` starts."""

    name: str
    base_urls: tuple[str, ...]
    model: str
    base_url_env: str | None = None
    api_key_env: str | None = None
    method: ScoringMethod = "next-token"
    template: str = "stakes-v1"
    top_logprobs: int = 20
    rate: RateLimit = field(default_factory=RateLimit)
    timeout: Timeout = field(default_factory=Timeout)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    server: ServerKind = "external"
    hf_model: str | None = None
    source: str = "built-in"

    def resolved_urls(self) -> tuple[str, ...]:
        """The base URLs in force: the override variable's, if set."""
        if self.base_url_env and os.environ.get(self.base_url_env):
            return tuple(u.strip() for u in os.environ[self.base_url_env].split(",") if u.strip())
        return self.base_urls

    def endpoint_id(self) -> str:
        """Which endpoint answers, for the cache key: the sorted base URLs and nothing else."""
        return ",".join(sorted(url.rstrip("/") for url in self.resolved_urls()))


def _env(name: str) -> str:
    return "CTD_" + re.sub(r"[^A-Za-z0-9]+", "_", name).upper()


def _vllm_entry(name: str, hf_model: str, port: int) -> ExpertSpec:
    """A model served by vLLM on this machine under its Hugging Face id."""
    return ExpertSpec(
        name=name,
        base_urls=(f"http://127.0.0.1:{port}/v1",),
        model=hf_model,
        base_url_env=_env(name) + "_URL",
        api_key_env=_env(name) + "_API_KEY",
        rate=RateLimit(concurrency=64),
        server="vllm",
        hf_model=hf_model,
    )


BUILTIN_EXPERTS: dict[str, ExpertSpec] = {
    spec.name: spec
    for spec in (
        _vllm_entry("gemma-27b", "google/gemma-3-27b-it", 8000),
        _vllm_entry("llama-1b", "meta-llama/Llama-3.2-1B-Instruct", 8001),
        ExpertSpec(
            name="smollm2",
            base_urls=("http://127.0.0.1:8089/v1",),
            model="smollm2",
            base_url_env=_env("smollm2") + "_URL",
            top_logprobs=10,
            rate=RateLimit(concurrency=2),  # a CPU llama.cpp server answers one at a time
            server="llama.cpp",
        ),
    )
}

_KEYS = {
    "base_url",
    "base_urls",
    "base_url_env",
    "model",
    "api_key_env",
    "method",
    "template",
    "top_logprobs",
    "concurrency",
    "rpm",
    "tpm",
    "timeout",
    "max_attempts",
    "down_after",
    "server",
    "hf_model",
}


def experts_file() -> Path:
    return Path(os.environ.get("CTD_EXPERTS_FILE", Path.home() / ".config" / "ctd" / "experts.toml"))


def _line_of(text: str, name: str, key: str | None = None) -> int:
    """The line where an entry (or one of its keys) is written, for error messages."""
    lines = text.splitlines()
    header = re.compile(rf"^\s*\[\s*experts\.\"?{re.escape(name)}\"?\s*\]")
    start = next((i for i, line in enumerate(lines) if header.match(line)), 0)
    if key is None:
        return start + 1
    for i in range(start + 1, len(lines)):
        if lines[i].lstrip().startswith("["):
            break
        if re.match(rf"^\s*{re.escape(key)}\s*=", lines[i]):
            return i + 1
    return start + 1


def _spec_from_table(name: str, table: dict[str, Any], where: str, text: str) -> ExpertSpec:
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        line = _line_of(text, name, unknown[0])
        raise ConfigError(
            f"{where}:{line}: expert {name!r}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})"
        )
    try:
        urls = table.get("base_urls") or [table["base_url"]]
        model = table["model"]
    except KeyError as exc:
        raise ConfigError(
            f"{where}:{_line_of(text, name)}: expert {name!r}: missing {exc.args[0]!r} "
            "(needs base_url and model)"
        ) from None
    method = table.get("method", "next-token")
    if method not in SCORING_METHODS:
        raise ConfigError(
            f"{where}:{_line_of(text, name, 'method')}: expert {name!r}: method {method!r} is not one of "
            f"{', '.join(SCORING_METHODS)}"
        )
    try:
        return ExpertSpec(
            name=name,
            base_urls=tuple(str(u) for u in urls),
            model=str(model),
            base_url_env=table.get("base_url_env"),
            api_key_env=table.get("api_key_env"),
            method=method,
            template=str(table.get("template", "stakes-v1")),
            top_logprobs=int(table.get("top_logprobs", 20)),
            rate=RateLimit(
                concurrency=int(table.get("concurrency", 16)), rpm=table.get("rpm"), tpm=table.get("tpm")
            ),
            timeout=Timeout(read=float(table.get("timeout", 120.0))),
            retry=RetryPolicy(
                max_attempts=int(table.get("max_attempts", 6)), down_after=int(table.get("down_after", 0))
            ),
            server=table.get("server", "external"),
            hf_model=table.get("hf_model"),
            source=where,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}:{_line_of(text, name)}: expert {name!r}: {exc}") from None


def load_experts(path: Path | None = None) -> dict[str, ExpertSpec]:
    """Built-in entries, then the user's file (which may override a built-in by name)."""
    path = path or experts_file()
    experts = dict(BUILTIN_EXPERTS)
    if not path.exists():
        return experts
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    unknown_sections = sorted(set(data) - {"experts"})
    if unknown_sections:
        raise ConfigError(
            f"{path}: unknown section [{unknown_sections[0]}] (entries go under [experts.NAME])"
        )
    for name, table in data.get("experts", {}).items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}:{_line_of(text, name)}: experts.{name} must be a table")
        experts[name] = _spec_from_table(name, table, str(path), text)
    return experts


def expert_from_url(
    url: str, model: str, *, method: ScoringMethod = "next-token", api_key_env: str | None = None
) -> ExpertSpec:
    """An unregistered expert given by URL (`--expert-url URL --expert-model NAME`)."""
    return ExpertSpec(
        name=f"url:{model}",
        base_urls=(url,),
        model=model,
        method=method,
        api_key_env=api_key_env,
        source="command line",
    )


def resolve_expert(name: str, path: Path | None = None) -> ExpertSpec:
    experts = load_experts(path)
    if name not in experts:
        raise ConfigError(
            f"unknown expert {name!r}; known: {', '.join(sorted(experts))} (add one with `ctd experts add`)"
        )
    return experts[name]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def add_expert(name: str, entry: dict[str, Any], path: Path | None = None) -> Path:
    """Append (or replace) [experts.NAME] in the user's file, keeping everything else as written.
    The entry is checked first; the file is rewritten atomically."""
    path = path or experts_file()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise ConfigError(f"expert name {name!r}: use letters, digits, '-', '_' and '.'")
    body = "\n".join(f"{key} = {_toml_value(value)}" for key, value in entry.items() if value is not None)
    section = f'[experts."{name}"]\n{body}\n'  # quoted: a '.' in the name is not a sub-table
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    # Drop an existing section of that name (up to the next section header).
    pattern = re.compile(rf"(?ms)^\[experts\.\"?{re.escape(name)}\"?\]\n.*?(?=^\[|\Z)")
    text = pattern.sub("", text).rstrip()
    new_text = (text + "\n\n" if text else "") + section
    _spec_from_table(name, tomllib.loads(section)["experts"][name], str(path), new_text)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(new_text, encoding="utf-8")
    os.replace(tmp, path)
    return path
