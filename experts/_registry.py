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
    price_input = 0.15                         # USD per million prompt tokens (default 0)
    price_output = 0.60                        # USD per million generated tokens (default 0)
    batch_discount = 0.5                       # the fraction a batch saves (default 0)

The file is $CTD_EXPERTS_FILE, else ~/.config/ctd/experts.toml.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

from ._config import Price, RateLimit, RetryPolicy, Timeout, check_base_url, redact_url
from ._errors import ConfigError, InvalidSetting
from ._prompts import DEFAULT_TEMPLATE, check_scoring_method, load_template
from ._redact import looks_like_key
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

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _shown(value: object) -> str:
    """A value for an error line, with any URL's credentials redacted."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return repr(redact_url(value)) if isinstance(value, str) else repr(value)


@dataclass(frozen=True, kw_only=True)
class ExpertSpec:
    """Everything needed to query one expert. `base_url_env` names a variable whose value
    (comma-separated URLs) replaces `base_urls`; `api_key_env` names the variable holding the
    key. `hf_model` and `server` say what `ctd experts serve` starts. `served_at` says where
    requests go when that is not the expert's URL: a run's own local server on a port of its own
    (see `request_urls`); the expert's identity, and so the cache key, stays its URL."""

    name: str
    base_urls: tuple[str, ...]
    model: str
    base_url_env: str | None = None
    api_key_env: str | None = None
    method: ScoringMethod = "next-token"
    template: str = DEFAULT_TEMPLATE
    top_logprobs: int = 20
    rate: RateLimit = field(default_factory=RateLimit)
    timeout: Timeout = field(default_factory=Timeout)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    price: Price = field(default_factory=Price)  # not in the cache key: it decides no answer
    server: ServerKind = "external"
    hf_model: str | None = None
    source: str = "built-in"
    served_at: tuple[str, ...] | None = None

    @property
    def effective_down_after(self) -> int:
        """Items failing at the endpoint in a row that end a run: `retry.down_after`, or when it
        is 0 (the default) twice the concurrency, at least 8."""
        return self.retry.down_after or max(8, 2 * self.rate.concurrency)

    def __post_init__(self) -> None:
        if not isinstance(self.base_urls, tuple) or not self.base_urls:
            raise InvalidSetting("base_urls", _shown(self.base_urls), "must be a tuple of one or more URLs")
        for url in self.base_urls:
            check_base_url(url, "base_urls")
        if self.served_at is not None:
            if not isinstance(self.served_at, tuple) or not self.served_at:
                raise InvalidSetting(
                    "served_at", _shown(self.served_at), "must be a tuple of one or more URLs"
                )
            for url in self.served_at:
                check_base_url(url, "served_at")
        for name in ("model", "template"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise InvalidSetting(name, repr(getattr(self, name)), "must be a non-empty string")
        for name in ("base_url_env", "api_key_env"):
            value = getattr(self, name)
            named = isinstance(value, str) and _ENV_NAME.fullmatch(value) and not looks_like_key(value)
            if value is not None and not named:
                # Not echoed: the likeliest mistake here is the key itself in place of its name.
                raise InvalidSetting(
                    name, "'***'", "must name an environment variable (letters, digits, _), not hold a key"
                )
        for name, choices in (("method", SCORING_METHODS), ("server", get_args(ServerKind))):
            if getattr(self, name) not in choices:
                raise InvalidSetting(name, repr(getattr(self, name)), f"must be one of {', '.join(choices)}")
        top = self.top_logprobs
        if not isinstance(top, int) or isinstance(top, bool) or top < 1:
            raise InvalidSetting("top_logprobs", repr(top), "must be a whole number of at least 1")
        if self.hf_model is not None and not isinstance(self.hf_model, str):
            raise InvalidSetting("hf_model", repr(self.hf_model), "must be a string")
        for name, kind in (
            ("rate", RateLimit),
            ("timeout", Timeout),
            ("retry", RetryPolicy),
            ("price", Price),
        ):
            if not isinstance(getattr(self, name), kind):
                raise InvalidSetting(name, repr(getattr(self, name)), f"must be a {kind.__name__}")
        check_scoring_method(self.template, self.method)

    def resolved_urls(self) -> tuple[str, ...]:
        """The base URLs in force: the override variable's, if set (checked like any URL)."""
        if self.base_url_env and os.environ.get(self.base_url_env):
            setting = f"${self.base_url_env}"
            urls = tuple(u.strip() for u in os.environ[self.base_url_env].split(",") if u.strip())
            if not urls:
                raise InvalidSetting(setting, repr(os.environ[self.base_url_env]), "names no URL")
            return tuple(check_base_url(url, setting) for url in urls)
        return self.base_urls

    def request_urls(self) -> tuple[str, ...]:
        """Where requests go: `served_at` when set, else the base URLs in force. Only this moves
        with a run's own server; `endpoint_id` does not, so two runs on two ports share answers."""
        return self.served_at or self.resolved_urls()

    def endpoint_id(self) -> str:
        """Which endpoint answers, for the cache key: the sorted base URLs (never `served_at`:
        the same model behind the same registry entry, wherever a run's own copy listens)."""
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


# The built-in entries are models served on this machine (vLLM or llama.cpp): they keep the
# default Price, 0 dollars. An entry for a hosted API states its price in experts.toml.
def _guard_entry(name: str, hf_model: str, port: int, template: str) -> ExpertSpec:
    """A guard model served by vLLM, asked in the format it was trained on (a pass-through
    template). Its label tokens carry nearly all of the first token's mass: 10 top logprobs also
    catch their case and space variants."""
    return replace(_vllm_entry(name, hf_model, port), template=template, top_logprobs=10)


BUILTIN_EXPERTS: dict[str, ExpertSpec] = {
    spec.name: spec
    for spec in (
        _vllm_entry("gemma-27b", "google/gemma-3-27b-it", 8000),
        _vllm_entry("llama-1b", "meta-llama/Llama-3.2-1B-Instruct", 8001),
        _guard_entry("llama-guard-3-1b", "meta-llama/Llama-Guard-3-1B", 8002, "llama-guard-3"),
        _guard_entry("llama-guard-3-8b", "meta-llama/Llama-Guard-3-8B", 8003, "llama-guard-3"),
        _guard_entry("shieldgemma-2b", "google/shieldgemma-2b", 8004, "shieldgemma-dangerous"),
        _guard_entry(
            "granite-guardian-2b", "ibm-granite/granite-guardian-3.1-2b", 8005, "granite-guardian-harm"
        ),
        ExpertSpec(
            name="smollm2",
            base_urls=("http://127.0.0.1:8089/v1",),
            model="smollm2",
            base_url_env=_env("smollm2") + "_URL",
            # With stakes-v1, SmolLM2-135M calls every input high-stakes (see fine-v1.toml).
            template="fine-v1",
            top_logprobs=10,
            # One request in flight per slot of the local server (`ctd` starts it with as many
            # slots as this): llama.cpp decodes them in one batch. Measured: docs/benchmarks.md.
            rate=RateLimit(concurrency=4),
            server="llama.cpp",
        ),
        ExpertSpec(
            name="smollm2-vllm",
            base_urls=("http://127.0.0.1:8090/v1",),
            model="smollm2",
            base_url_env=_env("smollm2-vllm") + "_URL",
            template="fine-v1",
            top_logprobs=10,
            # vLLM batches whatever is in flight (continuous batching); 8 kept 2 CPU cores busy
            # without queueing requests past their timeout (docs/benchmarks.md, vLLM beside llama.cpp).
            rate=RateLimit(concurrency=8),
            server="vllm",
            # The embedded model (SmolLM2-135M-Instruct): `ctd` serves the Hugging Face folder
            # converted from its GGUF file, which both scoring methods work on, likelihood
            # included (vLLM echoes prompt logprobs; llama.cpp's server does not).
            hf_model="smollm2",
        ),
    )
}

# Where each TOML key goes: the ExpertSpec field, or the field of one of its value objects.
_SPEC_KEYS = {
    "model",
    "base_url_env",
    "api_key_env",
    "method",
    "template",
    "top_logprobs",
    "server",
    "hf_model",
}
_RATE_KEYS = {"concurrency": "concurrency", "rpm": "rpm", "tpm": "tpm"}
_TIMEOUT_KEYS = {"timeout": "read"}
_RETRY_KEYS = {"max_attempts": "max_attempts", "down_after": "down_after"}
_PRICE_KEYS = {"price_input": "input", "price_output": "output", "batch_discount": "batch_discount"}
_KEYS = {"base_url", "base_urls", *_SPEC_KEYS, *_RATE_KEYS, *_TIMEOUT_KEYS, *_RETRY_KEYS, *_PRICE_KEYS}


def experts_file() -> Path:
    return Path(os.environ.get("CTD_EXPERTS_FILE", Path.home() / ".config" / "ctd" / "experts.toml"))


def _line_of(text: str, name: str, key: str | None = None) -> int:
    """The line where an entry (or one of its keys) is written, for error messages."""
    lines = text.splitlines()
    header = re.compile(rf"^\s*\[\s*experts\.\"?{re.escape(name)}\"?\s*\]")
    inline = re.compile(rf"^\s*\"?{re.escape(name)}\"?\s*=")  # `NAME = {{...}}` under [experts]
    start = next((i for i, line in enumerate(lines) if header.match(line)), None)
    if start is None:
        start = next((i for i, line in enumerate(lines) if inline.match(line)), 0)
    if key is None:
        return start + 1
    for i in range(start + 1, len(lines)):
        if lines[i].lstrip().startswith("["):
            break
        if re.match(rf"^\s*{re.escape(key)}\s*=", lines[i]):
            return i + 1
    return start + 1


def _value_object(kind: type[Any], table: dict[str, Any], fields_of_keys: dict[str, str]) -> Any:
    """`kind` built from the keys the table gives (the rest keep their defaults); a refused
    value is reported under its TOML key."""
    try:
        return kind(**{field: table[key] for key, field in fields_of_keys.items() if key in table})
    except InvalidSetting as exc:
        key = next(k for k, f in fields_of_keys.items() if f == exc.setting)
        raise InvalidSetting(key, exc.shown, exc.problem) from None


def _spec_from_table(name: str, table: dict[str, Any], source: str) -> ExpertSpec:
    """The entry [experts.NAME] as an ExpertSpec. Problems are ConfigError naming the key
    (InvalidSetting for a value); the caller adds where the entry was written."""
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise ConfigError(
            f"unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})", setting=unknown[0]
        )
    url_key = "base_urls" if "base_urls" in table else "base_url"
    if url_key not in table or "model" not in table:
        missing = "model" if url_key in table else "base_url"
        raise ConfigError(f"missing {missing!r} (needs base_url and model)")
    urls = table[url_key]
    if url_key == "base_url":
        urls = [urls]
    elif not isinstance(urls, list):
        raise InvalidSetting("base_urls", _shown(urls), "must be a list of URLs")
    rate = _value_object(RateLimit, table, _RATE_KEYS)
    timeout = _value_object(Timeout, table, _TIMEOUT_KEYS)
    retry = _value_object(RetryPolicy, table, _RETRY_KEYS)
    price = _value_object(Price, table, _PRICE_KEYS)
    given = {key: table[key] for key in _SPEC_KEYS if key in table}
    try:
        return ExpertSpec(
            name=name,
            base_urls=tuple(urls),
            rate=rate,
            timeout=timeout,
            retry=retry,
            price=price,
            source=source,
            **given,
        )
    except InvalidSetting as exc:
        key = url_key if exc.setting == "base_urls" else exc.setting
        raise InvalidSetting(key, exc.shown, exc.problem) from None


def load_experts(path: Path | None = None) -> dict[str, ExpertSpec]:
    """Built-in entries, then the user's file (which may override a built-in by name). A problem
    is one ConfigError line naming the file, the line and the key."""
    path = path or experts_file()
    experts = dict(BUILTIN_EXPERTS)
    if not path.exists():
        return experts
    text = _registry_text(path)
    experts.update(_file_specs(text, path, _parsed(text, path)))
    return experts


def _file_specs(
    text: str, path: Path, data: dict[str, Any], leaving_out: str | None = None
) -> dict[str, ExpertSpec]:
    """The entries of the user's file (`data`, parsed from `text`) but `leaving_out`, each
    checked; a problem is one ConfigError line naming the file, the line and the key."""
    specs = {}
    for name, table in data.get("experts", {}).items():
        if name == leaving_out:
            continue
        if not isinstance(table, dict):
            raise ConfigError(f"{path}:{_line_of(text, name)}: experts.{name} must be a table")
        try:
            specs[name] = _spec_from_table(name, _template_beside(table, path), str(path))
        except ConfigError as exc:
            line = _line_of(text, name, exc.setting)
            raise ConfigError(f"{path}:{line}: expert {name!r}: {exc}", setting=exc.setting) from None
    return specs


def _template_beside(table: dict[str, Any], path: Path) -> dict[str, Any]:
    """The entry with a template file named relative to the registry file made whole (it worked
    only from the file's own folder); a template file that is not there is an InvalidSetting, so
    that its line is named now rather than at the first request."""
    template = table.get("template")
    if not isinstance(template, str) or not Path(template).suffix:
        return table  # a built-in template's name
    whole = Path(template).expanduser()
    whole = whole if whole.is_absolute() else path.parent / whole
    if not whole.is_file():
        raise InvalidSetting("template", repr(template), f"no such file ({whole})")
    return {**table, "template": str(whole)}


def _registry_text(path: Path) -> str:
    """The user's file as text; one that is not UTF-8 (TOML's encoding) is one ConfigError line."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (TOML files are UTF-8): save it as UTF-8") from None


def _parsed(text: str, path: Path) -> dict[str, Any]:
    """The file's TOML, holding only an `experts` table of entries; anything else is one
    ConfigError line."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    unknown_sections = sorted(set(data) - {"experts"})
    if unknown_sections:
        raise ConfigError(
            f"{path}: unknown section [{unknown_sections[0]}] (entries go under [experts.NAME])"
        )
    if not isinstance(data.get("experts", {}), dict):
        line = next(
            (i for i, row in enumerate(text.splitlines(), 1) if re.match(r"\s*\[*\s*experts\b", row)), 1
        )
        raise ConfigError(f"{path}:{line}: experts must be a table of entries, each under [experts.NAME]")
    return data


def expert_from_url(
    url: str, model: str, *, method: ScoringMethod = "next-token", api_key_env: str | None = None
) -> ExpertSpec:
    """An unregistered expert given by URL (`--expert-url URL --expert-model NAME`); a URL or
    model that cannot work is InvalidSetting on `base_urls` or `model`."""
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
            f"unknown expert {name!r}; known: {', '.join(sorted(experts))} (add one with `ctd experts add`)",
            setting="name",
        )
    return experts[name]


def _section_header(name: str) -> re.Pattern[str]:
    """The header line of entry `name`: `[experts.NAME]` or `[experts."NAME"]`, indented or
    spaced or not, a comment after it or not."""
    spaced = r"[ \t]*"
    return re.compile(
        rf"{spaced}\[{spaced}experts{spaced}\.{spaced}(?:{re.escape(name)}|\"{re.escape(name)}\"){spaced}\]"
        rf"{spaced}(?:#.*)?"
    )


@contextlib.contextmanager
def _registry_lock(target: Path) -> Iterator[None]:
    """The registry `target` held for one read-modify-write (a lock file beside it; the system
    releases the lock when the process ends)."""
    with open(target.with_name(f".{target.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _replace_text(target: Path, text: str) -> None:
    """`target`'s content replaced by `text` at once, its permissions kept: written to a temporary
    file of its own beside it, then renamed over it."""
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else None
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    # A TOML basic string: quotes and backslashes escaped, control characters as \\uXXXX.
    escaped = "".join(
        "\\" + ch if ch in '"\\' else f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ch == "\x7f" else ch
        for ch in str(value)
    )
    return f'"{escaped}"'


def add_expert(name: str, entry: dict[str, Any], path: Path | None = None) -> Path:
    """Append (or replace) [experts.NAME] in the user's file, keeping everything else as written.
    The entry is checked first, as the file will read it back, and its template must load (a
    template path is written absolute, so that the entry works from any folder); a problem is
    ConfigError naming the key (InvalidSetting for a value) and leaves the file as it was. The
    file is rewritten atomically, under a lock (two adds at once keep both entries), through a
    link to it and with its permissions; what is written must read back as every other entry as
    it was."""
    path = path or experts_file()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise ConfigError(f"expert name {name!r}: use letters, digits, '-', '_' and '.'")
    entry = {key: value for key, value in entry.items() if value is not None}
    template = entry.get("template")
    if isinstance(template, str):
        try:
            loaded = load_template(template)
        except ConfigError as exc:
            raise InvalidSetting("template", repr(template), str(exc)) from None
        if Path(template).suffix:
            entry["template"] = str(loaded.path.resolve())
    body = "\n".join(f"{key} = {_toml_value(value)}" for key, value in entry.items())
    section = f'[experts."{name}"]\n{body}\n'  # quoted: a '.' in the name is not a sub-table
    new_entry = tomllib.loads(section)["experts"][name]
    _spec_from_table(name, new_entry, str(path))
    target = path.resolve()  # a registry kept as a link (dotfiles) stays one
    target.parent.mkdir(parents=True, exist_ok=True)
    with _registry_lock(target):  # two adds at once: each reads what the other wrote
        text = _registry_text(target) if target.exists() else ""
        before = _parsed(text, path).get("experts", {})
        # Every other entry must read as it is, or the file is left as it was: an add that wrote
        # its entry, then failed on another's (and exited 2), left a change behind a refusal.
        _file_specs(text, path, {"experts": before}, leaving_out=name)
        lines = text.splitlines(keepends=True)
        header = _section_header(name)
        start = next((i for i, line in enumerate(lines) if header.fullmatch(line.rstrip("\r\n"))), None)
        if start is not None:  # the section ends at the next header, indented or not
            later = (i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("["))
            end = next(later, len(lines))
            while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
                end -= 1  # comments just above the next header are that entry's
            del lines[start:end]
        kept = "".join(lines).rstrip()
        new_text = (kept + "\n\n" if kept else "") + section
        # What is written must read back as every other entry as it was and this one as given: an
        # entry in a form the header above does not match (an inline table) is refused, not doubled.
        try:
            after = tomllib.loads(new_text).get("experts")
        except tomllib.TOMLDecodeError:  # the entry twice
            after = None
        if after != {**{key: value for key, value in before.items() if key != name}, name: new_entry}:
            raise ConfigError(
                f"{path}:{_line_of(text, name)}: expert {name!r} is written in a form `ctd experts add` "
                "cannot replace (an inline table?): edit or remove it by hand"
            )
        _replace_text(target, new_text)
    return path
