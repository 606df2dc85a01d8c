"""Benchmark of probe training on a GPU (run by hand, not in CI):

    python tests/bench/bench_probes_gpu.py [--examples 3100] [--mean-tokens 239] [--dim 2048]

A Llama-3.2-1B-shaped split (d = 2,048, 3,100 examples, about 741K tokens; random float16 tokens
shifted along one direction by the label) trained with the default `ProbeConfig` for each of the
four architectures and three seeds on `default_device()`, then scored. Target: the 12 trainings
under 30 s in all. Also one attention seed with the streamed path (resident=False), for comparison.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from probes import ARCHS, ProbeConfig, Ragged, default_device, predict, train_probe


def split(examples: int, mean_tokens: int, dim: int, seed: int = 0) -> tuple[Ragged, np.ndarray]:
    rng = np.random.default_rng(seed)
    length = rng.integers(1, 2 * mean_tokens, examples).astype(np.int64)
    y = rng.integers(0, 2, examples).astype(np.float64)
    direction = torch.nn.functional.normalize(
        torch.randn(dim, generator=torch.Generator().manual_seed(seed)), dim=0
    )
    shift = np.repeat(0.05 * (2 * y - 1), length)  # (tokens,)
    values = np.empty((int(length.sum()), dim), dtype=np.float16)
    generator = torch.Generator().manual_seed(seed)
    for a in range(0, len(values), 1 << 16):  # on the host in chunks: a few seconds
        b = min(a + (1 << 16), len(values))
        chunk = (
            torch.randn((b - a, dim), generator=generator)
            + torch.from_numpy(shift[a:b]).float()[:, None] * direction
        )
        values[a:b] = chunk.half().numpy()
    return Ragged((values,), np.zeros(examples, dtype=np.int64), np.cumsum(length) - length, length), y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=3100)
    parser.add_argument("--mean-tokens", type=int, default=239)
    parser.add_argument("--dim", type=int, default=2048)
    args = parser.parse_args()
    device = default_device()
    acts, y = split(args.examples, args.mean_tokens, args.dim)
    print(
        f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}); "
        f"{len(acts)} examples, {int(acts.length.sum())} tokens, d={acts.dim}"
    )
    total = 0.0
    for arch in ARCHS:
        for seed in (0, 1, 2):
            started = time.perf_counter()
            result = train_probe(acts, y, task="safety", config=ProbeConfig(arch=arch), seed=seed)
            if device.type == "cuda":
                torch.cuda.synchronize()
            took = time.perf_counter() - started
            total += took
            scored = time.perf_counter()
            scores = predict(result.probe, acts, task="safety")
            print(
                f"{arch:9s} seed {seed}: train {took:6.2f} s ({len(result.history)} epochs, "
                f"{took / len(result.history):.3f} s/epoch, best val {result.best_val_loss:.4f}), "
                f"predict {time.perf_counter() - scored:5.2f} s, mean score {scores.mean():.4f}",
                flush=True,
            )
    print(f"4 architectures x 3 seeds: {total:.1f} s (target: under 30 s)")
    started = time.perf_counter()
    result = train_probe(acts, y, task="safety", config=ProbeConfig(epochs=3), seed=0, resident=False)
    print(f"attention, streamed: {(time.perf_counter() - started) / len(result.history):.3f} s/epoch")
    started = time.perf_counter()
    result = train_probe(acts, y, task="safety", config=ProbeConfig(epochs=3), seed=0, resident=True)
    print(f"attention, resident: {(time.perf_counter() - started) / len(result.history):.3f} s/epoch")


if __name__ == "__main__":
    main()
