"""What one training step of each probe asks of torch (run by hand, not in CI):

    python tests/bench/bench_train_steps.py [--examples 640] [--mean-tokens 20] [--dim 32] [--epochs 2]

On a GPU a probe's step is bound by kernel launches, not by arithmetic (the second GPU session's
profile: 1.79 s of wall time against 0.49 s of device time for a short attention fit), so what
moves training time there is the number of operators a step dispatches. This counts them with
torch.profiler for a short fit of each architecture on `default_device()`, on a small random split
(`bench_probes_gpu.split`), twice side by side: as `train_probe` runs, and with torch's NaN fill of
new memory kept on (the deterministic-mode default `train_probe` turns off). Per training step it
prints the operators, the `aten::fill_` calls, on CUDA the `cudaLaunchKernel` calls, and the wall
milliseconds of the unprofiled fit (best of three); the weights must be bit-identical both ways.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_probes_gpu import split

# Private: the deterministic-mode context, swapped for one that keeps torch's fill.
import probes._train as train_module
from probes import ARCHS, ProbeConfig, default_device, train_probe


@contextlib.contextmanager
def with_the_fill() -> Iterator[None]:
    """Deterministic algorithms as torch defaults them: new memory filled with NaN."""
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def fit(acts, y, config: ProbeConfig) -> dict[str, torch.Tensor]:
    result = train_probe(acts, y, task="safety", config=config, seed=0)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {k: v.detach().cpu() for k, v in result.probe.state_dict().items()}


def measure(acts, y, config: ProbeConfig, steps: int, cuda: bool) -> tuple[dict, dict[str, float]]:
    fit(acts, y, config)  # warm-up: allocator, kernels, the resident upload
    walls = []
    for _ in range(3):  # best of three: other work on the machine only ever adds
        started = time.perf_counter()
        weights = fit(acts, y, config)
        walls.append(time.perf_counter() - started)
    wall = min(walls)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        fit(acts, y, config)
    counts = {e.key: e.count for e in prof.key_averages()}
    return weights, {
        "ops": sum(c for k, c in counts.items() if k.startswith("aten::")) / steps,
        "fills": counts.get("aten::fill_", 0) / steps,
        "launches": counts.get("cudaLaunchKernel", 0) / steps,
        "ms": 1000 * wall / steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=640)
    parser.add_argument("--mean-tokens", type=int, default=20)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    device = default_device()
    cuda = device.type == "cuda"
    acts, y = split(args.examples, args.mean_tokens, args.dim)
    print(f"device {device}; {len(acts)} examples, {int(acts.length.sum())} tokens, d={acts.dim}")
    for arch in ARCHS:
        config = ProbeConfig(arch=arch, epochs=args.epochs, patience=args.epochs)
        n_train = round(len(acts) * (1 - config.val_fraction))
        steps = args.epochs * math.ceil(n_train / config.batch_size)  # the held-out passes ride along
        skipped, as_run = measure(acts, y, config, steps, cuda)
        real = train_module._deterministic_algorithms
        train_module._deterministic_algorithms = with_the_fill
        try:
            filled, with_fill = measure(acts, y, config, steps, cuda)
        finally:
            train_module._deterministic_algorithms = real
        same = all(torch.equal(skipped[k], filled[k]) for k in skipped)
        for label, row in (("fill kept", with_fill), ("as run", as_run)):
            print(
                f"{arch:9s} {label:9s}: {row['ops']:6.1f} ops, {row['fills']:5.1f} fills, "
                f"{row['launches']:5.1f} launches, {row['ms']:6.3f} ms per step"
            )
        print(f"{arch:9s} weights bit-identical: {same}")
        if not same:
            raise SystemExit(f"{arch}: the NaN fill changed the weights: something reads unwritten memory")


if __name__ == "__main__":
    main()
