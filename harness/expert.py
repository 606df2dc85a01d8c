"""The expert of a run or a command, resolved once.

`resolve_expert` turns `--expert NAME` (a registered entry), or a base URL (`--expert URL` or
`--expert-url URL`, with `--expert-model NAME`), into a frozen `ResolvedExpert`: the spec, and the
expert as error lines name it. The URL rule (a clean base URL, no credentials in it, and a served
model name beside it) is written once, in `check_expert_url`, which `RunConfig` also calls so that
no configuration holds a URL that cannot work. Every command (`ctd eval`, `ctd query`,
`ctd experts check|serve`, `ctd cache explain`), the query stage and the monitor bundle read the
resolved expert from here, never the raw option.

A run's query stage writes the expert it asked into the run folder (`QueryLayout.expert`,
query/expert.json) with `ResolvedExpert.write`, keeping the fields of `EXPERT_FIELDS`: where and
how to ask, never a key (`api_key_env` names a variable). `ctd monitor calibrate` reads it back
with `read_expert`, so the bundle deploys the expert the run queried even after the registry
changed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import experts
from experts import ConfigError, ExpertSpec, InvalidSetting

from ._errors import InputError
from ._signals import run_stoppable

if TYPE_CHECKING:  # the endpoint check's module brings the HTTP client: not for --help
    from experts import EndpointCheck

__all__ = [
    "EXPERT_FIELDS",
    "ResolvedExpert",
    "check_expert",
    "check_expert_url",
    "expert_record",
    "is_url",
    "pick_expert",
    "read_expert",
    "resolve_expert",
    "spec_from_record",
]

# What a written expert keeps (the run folder's query/expert.json and a bundle's expert entry):
# where and how to ask, never a key (api_key_env names a variable).
EXPERT_FIELDS = ("name", "base_urls", "model", "method", "template", "top_logprobs", "api_key_env")
_EMBEDDED = "smollm2"  # probes.EMBEDDED_MODEL, spelled here so that the registry check costs no import


def is_url(value: str) -> bool:
    """An --expert value that is a base URL rather than a registered name."""
    return value.startswith(("http://", "https://"))


def check_expert_url(url: str, *, option: str, model: str | None) -> None:
    """The URL rule, the one place it is written: `url` (given as `option`) is a clean base URL
    with no credentials in it (it is written to config.toml, run.json and the report), and
    `model` names the model served there. One InputError line otherwise, the URL redacted."""
    try:
        experts.check_base_url(url, option)
    except InvalidSetting as error:
        raise InputError(f"{option} {error.shown}: {error.problem}") from None
    if not model:
        raise InputError(f"{option} {url}: a URL needs --expert-model (the served model name)")


def check_expert(spec: ExpertSpec) -> EndpointCheck:
    """Can the endpoint score (reachable, model served, logprobs or echo)? Nothing is cached.
    A stop signal ends it as KeyboardInterrupt."""
    return run_stoppable(experts.check_endpoint(spec))


@dataclass(frozen=True)
class ResolvedExpert:
    """An expert resolved from the options that named it: `spec`, and `named`, the expert as an
    error line names it ("--expert X", "the default expert smollm2", "expert X")."""

    spec: ExpertSpec
    named: str

    def check(self) -> EndpointCheck:
        """The endpoint check of `check_expert`."""
        return check_expert(self.spec)

    def preflight(self, *, serve: bool) -> bool:
        """A run's one endpoint check, before any expensive work. True when the expert is a local
        server (llama.cpp or vLLM) that `serve` allows the run to start for the query stage: none
        answers at its URL, or what answers there lists other models (another program on its
        port: the run's own server then moves to a free port). Its weights are then found or
        fetched, and its package checked. Any other problem (a server of its model that cannot
        score, one that refuses the key) is one InputError starting with `named`."""
        report = check_expert(self.spec)
        if report.ok:
            return False
        another_program = bool(report.served_models) and not report.model_served
        if serve and self.spec.server != "external" and (not report.reachable or another_program):
            self.local_server()
            return True
        raise InputError(f"{self.named}: {report.problem}")

    def local_server(
        self,
        *,
        port: int | None = None,
        log: Path | None = None,
        move_if_taken: bool = False,
        vllm: experts.VllmSettings | None = None,
        prepare: bool = True,
    ) -> experts.LocalServer:
        """The local server for the expert (not started). A llama.cpp entry serves the embedded
        model's GGUF, found (or fetched once) by the same function that gives the probe stage its
        weights; a vLLM entry whose hf_model is the embedded model serves the Hugging Face folder
        converted from that GGUF (the probe stage's own). InputError, starting with `named`,
        when the weights or the server's package are missing. `move_if_taken`: a run's own
        server, which serves on a free port when the expert's is taken; `vllm`: a vLLM server's
        resources (default: the device's); `prepare=False`: the command only (a dry run), the
        GGUF not converted for vLLM."""
        spec = self.spec
        gguf = folder = None
        if spec.server == "llama.cpp" or (spec.server == "vllm" and spec.hf_model == _EMBEDDED):
            # Imported here: only a local expert on the embedded model needs it (probes is heavy).
            from probes import ProbeError, embedded_gguf

            try:
                gguf = embedded_gguf()
                if spec.server == "vllm":
                    gguf, folder = None, _embedded_folder(gguf, convert=prepare)
            except ProbeError as error:
                raise InputError(f"{self.named}: {error}") from None
        try:
            server = experts.LocalServer(
                spec, port=port, gguf=gguf, folder=folder, vllm=vllm, log=log, move_if_taken=move_if_taken
            )
        except ConfigError as error:
            raise InputError(f"{self.named}: {error}") from None
        if server.missing():
            raise InputError(f"{self.named}: {server.missing()}")
        return server

    def write(self, path: Path) -> Path:
        """The expert as `expert_record` gives it, written atomically to `path` (JSON)."""
        from .data import write_json  # pyarrow: not for a command line's --help

        return write_json(path, expert_record(self.spec))


def _embedded_folder(gguf: Path, *, convert: bool = True) -> Path:
    """The embedded model as a Hugging Face folder (float weights, tokenizer, chat template), made
    once from its GGUF by the probe stage's conversion and shared with it (a minute, once)."""
    from probes import gguf_as_folder

    return gguf_as_folder(gguf, convert=convert)


def resolve_expert(
    expert: str | None,
    url: str | None = None,
    model: str | None = None,
    method: experts.ScoringMethod | None = None,
    *,
    named: str | None = None,
) -> ResolvedExpert:
    """The expert of every command: `--expert NAME` (registered), or a base URL given as
    `--expert URL` or `--expert-url URL`, with `--expert-model NAME`; `method` overrides the
    entry's scoring method. Registry errors become one line; a URL that cannot work is named by
    its option, redacted. `named` is how error lines name the expert (default: the option and
    its value as given)."""
    if (expert is None) == (url is None):
        raise InputError("give --expert NAME (or a base URL with --expert-model NAME), or --expert-url URL")
    option, target = ("--expert-url", url) if url is not None else ("--expert", expert)
    assert target is not None
    try:
        if url is not None or is_url(target):
            check_expert_url(target, option=option, model=model)
            assert model is not None
            spec = experts.expert_from_url(target, model)
        else:
            spec = experts.resolve_expert(target)
    except InvalidSetting as exc:
        if exc.setting == "model" and model is not None:
            raise InputError(f"--expert-model {exc.shown}: {exc.problem}") from None
        raise InputError(str(exc)) from None
    except ConfigError as exc:
        if exc.setting == "name":  # an unknown name: the option it was given with says where
            raise InputError(f"{option}: {exc}") from None
        raise InputError(str(exc)) from None
    spec = replace(spec, method=method) if method else spec
    return ResolvedExpert(spec, named or f"{option} {target}")


def pick_expert(
    expert: str | None,
    url: str | None = None,
    model: str | None = None,
    method: experts.ScoringMethod | None = None,
) -> ExpertSpec:
    """The spec of `resolve_expert`, for a notebook that needs no error naming."""
    return resolve_expert(expert, url, model, method).spec


def expert_record(spec: ExpertSpec) -> dict[str, Any]:
    """The fields of `EXPERT_FIELDS`, base_urls as registered: a $VAR override is not resolved
    into it (the variable, like the key's, is read where the expert is asked)."""
    record = {key: getattr(spec, key) for key in EXPERT_FIELDS}
    record["base_urls"] = list(spec.base_urls)
    return record


def spec_from_record(record: dict[str, Any], *, source: str) -> ExpertSpec:
    """A spec from a written expert record (`expert_record`'s fields); InvalidSetting or
    TypeError when a field cannot work or is not one of them."""
    entry = dict(record)
    if isinstance(entry.get("base_urls"), list):
        entry["base_urls"] = tuple(entry["base_urls"])  # JSON has no tuples
    return ExpertSpec(**entry, source=source)


def read_expert(path: Path) -> ExpertSpec | None:
    """The expert a run's query stage wrote to `path` (None when no such file: a run made before
    the query stage wrote it). A file that cannot be read back is one InputError naming it."""
    if not path.is_file():
        return None
    from .data import read_json  # pyarrow: not for a command line's --help

    record = read_json(path)
    if set(record) != set(EXPERT_FIELDS):
        raise InputError(f"{path}: expected the keys {', '.join(EXPERT_FIELDS)}")
    try:
        return spec_from_record(record, source=str(path))
    except (InvalidSetting, TypeError) as error:
        raise InputError(f"{path}: {error}") from None
