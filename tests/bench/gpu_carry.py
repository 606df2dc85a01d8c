"""What a lent GPU machine needs to run `bench_gpu.py`, prepared here (run by hand, not in CI):

    python tests/bench/gpu_carry.py [--data ../shared/data/mup] [--py-spy]

The device machines (see the device tool's README and KINDS.md) have Python 3.12 with torch,
transformers, accelerate and most of this project's needs, no network, and nothing of this
project. This writes, in the checkout's root (both ignored through .git/info/exclude):

  .whl/      this project as a wheel, and a cp312 manylinux wheel of every package of its runtime
             closure (as installed here, same versions) that the machines' image lacks
             (DEVICE_PACKAGES, read from KINDS.md on 2026-11-17); with --py-spy, py-spy too
  .devdata/  mup/ (the McKenzie-format files of --data) and tok/ (the embedded model's tokenizer)

and prints the command to give the device tool (carry [".whl", ".devdata"]). The wheel is this
checkout's code as it is now: run this again after a change. Everything must fit
the 64 MiB a call may carry, working tree included: the sizes are printed, and over it is an error.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "ctd-harness"
CARRY_LIMIT = 64 * 2**20  # bytes a device call may carry, the working tree included

# The 'cuda' image's Python packages (KINDS.md, "Python packages already there", 2026-11-17).
DEVICE_PACKAGES = frozenset(
    """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
    jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl
    meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
    narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
    nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
    nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
    nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
    onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
    packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
    propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
    pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
    python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
    scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
    sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels
    sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
    tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
    torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
    urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split()  # noqa: SIM905
)
# Runtime needs the benches never reach on the device: the embedded expert's llama.cpp server (a
# stand-in expert answers there) and the GGUF reader (the model is built from a config).
NOT_CARRIED = frozenset({"xllamacpp", "gguf"})
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
RUN = (
    "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "
    "/tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH; unset "
    "PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; python3 tests/bench/bench_gpu.py "
    "--data .devdata/mup --tokenizer .devdata/tok --max-seconds 8 --max-batch 128 --out $OUT/result.json"
)


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def missing_closure() -> dict[str, str]:
    """name -> version installed here, for every package this project needs at run time (its
    requirements, theirs, and so on, markers evaluated for Python 3.12 on Linux x86-64) that the
    device lacks. What the device has is not walked into: its own needs are met there."""
    target = default_environment() | {"python_version": "3.12", "python_full_version": "3.12.3"}
    target |= {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
    wanted: dict[str, str] = {}
    todo = [Requirement(r) for r in metadata.requires(PROJECT) or ()]
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate(target | {"extra": ""}):
            continue
        name = normalise(requirement.name)
        if name in wanted or name in DEVICE_PACKAGES or name in NOT_CARRIED:
            continue
        wanted[name] = metadata.version(requirement.name)
        todo += [Requirement(r) for r in metadata.requires(requirement.name) or ()]
    return wanted


def download(name: str, version: str, into: Path) -> None:
    platforms = [option for platform in PLATFORMS for option in ("--platform", platform)]
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(into)]
    done = subprocess.run([*command, f"{name}=={version}"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name}=={version}: no cp312 manylinux wheel ({done.stderr.strip()[-300:]})")


def exclude(*paths: str) -> None:
    excludes = ROOT / ".git" / "info" / "exclude"
    lines = excludes.read_text().splitlines() if excludes.exists() else []
    excludes.write_text("\n".join([*lines, *(p for p in paths if p not in lines)]) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "mup")
    parser.add_argument("--py-spy", action="store_true", help="carry py-spy too (profiles there)")
    args = parser.parse_args()
    if not (args.data / "training").is_dir() or not (args.data / "dev").is_dir():
        raise SystemExit(f"--data {args.data}: no training/ and dev/ folders of McKenzie-format files")
    exclude("/.whl/", "/.devdata/")
    wheels, data = ROOT / ".whl", ROOT / ".devdata"
    for folder in (wheels, data):
        shutil.rmtree(folder, ignore_errors=True)
    wheels.mkdir()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)], check=True
    )
    needed = missing_closure() | ({"py-spy": metadata.version("py-spy")} if args.py_spy else {})
    for name, version in sorted(needed.items()):
        download(name, version, wheels)
    shutil.copytree(args.data, data / "mup", ignore=shutil.ignore_patterns("*.md", "LICENSE"))
    sys.path.insert(0, str(ROOT))
    from probes import load_model

    load_model().tokenizer.save_pretrained(data / "tok")

    tree = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    sizes = {
        "working tree": sum(
            (ROOT / p.decode()).stat().st_size for p in tree if p and (ROOT / p.decode()).is_file()
        ),
        ".whl": sum(p.stat().st_size for p in wheels.iterdir()),
        ".devdata": sum(p.stat().st_size for p in data.rglob("*") if p.is_file()),
    }
    for what, size in sizes.items():
        print(f"{what:>12}: {size / 2**20:6.1f} MiB")
    print(f"{'wheels':>12}: {', '.join(sorted(p.name for p in wheels.iterdir()))}")
    if sum(sizes.values()) > CARRY_LIMIT:
        raise SystemExit(
            f"{sum(sizes.values()) / 2**20:.1f} MiB: over the {CARRY_LIMIT / 2**20:.0f} MiB a call carries"
        )
    print(f'\ndevice run, carry [".whl", ".devdata"], kind nvidia-h200:\n{RUN}')


if __name__ == "__main__":
    main()
