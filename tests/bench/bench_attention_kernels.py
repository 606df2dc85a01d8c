"""Forward passes of new and repeated input shapes, with and without cuDNN attention (run by hand
on a CUDA machine, not in CI):

    python tests/bench/bench_attention_kernels.py [--data DIR] [--tokenizer DIR] [--fsync DIR,...]

A Llama-3.2-1B-shaped model with random weights (bench_gpu.py's), `probes.layer_activations` to
layer 11 over one conversation and over 32 at a time, timed per pass: the same shape again and
again, then shapes not seen before, then those again; once with torch's default attention kernels
and once with `probes`' own choice (`ATTENTION_KERNELS`, cuDNN left out). cuDNN builds a plan per
new shape; the monitor's micro-batches and a first extraction's batches are nearly all new shapes.
`--fsync` also times 40 appends of 400 bytes, each synced, in each folder (the monitor's decision
log syncs each group of records before answering).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bench"))
sys.path.insert(0, str(ROOT))

from bench_gpu import build_model, read_data  # noqa: E402

from probes import layer_activations, load_model, pad_batch, tokenize  # noqa: E402


def fsync_times(folder: Path) -> None:
    path = folder / f"fsync-probe-{os.getpid()}.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    times = []
    try:
        for _ in range(40):
            os.write(fd, b"x" * 400 + b"\n")
            started = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    times.sort()
    print(f"fdatasync after a 400-byte append in {folder}: median {times[20] * 1e3:.2f} ms, "
          f"max {times[-1] * 1e3:.2f} ms")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "mup")
    parser.add_argument("--tokenizer", type=Path, default=None, help="default: the embedded model's")
    parser.add_argument("--layer", type=int, default=11)
    parser.add_argument("--fsync", default="", help="folders to time synced appends in, comma-separated")
    args = parser.parse_args()
    for folder in filter(None, args.fsync.split(",")):
        fsync_times(Path(folder))
    if not torch.cuda.is_available():
        print("bench_attention_kernels: no CUDA device here; skipped")
        return
    folder = Path(tempfile.mkdtemp(prefix="bench-attention-")) / "llama-1b-random"
    build_model(folder, args.tokenizer, False, "cuda")
    conversations, *_ = read_data(args.data, None)
    loaded = load_model(str(folder))
    ids, _ = tokenize(loaded.tokenizer, conversations, 512)

    def per_pass(batches: list[list[list[int]]]) -> float:
        torch.cuda.synchronize()
        started = time.perf_counter()
        for batch in batches:
            input_ids, mask = pad_batch(batch, loaded.tokenizer.pad_token_id, loaded.device)
            layer_activations(loaded, args.layer, input_ids, mask).float().sum().item()
        torch.cuda.synchronize()
        return (time.perf_counter() - started) / len(batches) * 1e3

    def kernels(name: str):  # layer_activations picks ATTENTION_KERNELS; "default" lifts that
        if name == "default":
            return _all_kernels()
        return contextlib.nullcontext()

    offset = 0
    for name in ("default", "probes"):
        with kernels(name):
            per_pass([[ids[offset]]] * 3)  # warm-up
            same = per_pass([[ids[offset]]] * 30)
            fresh = [[ids[i]] for i in range(offset + 40, offset + 70)]
            new, again = per_pass(fresh), per_pass(fresh)
            wide = [ids[i : i + 32] for i in range(offset + 100, offset + 260, 32)]
            wide_new, wide_again = per_pass(wide), per_pass(wide)
        print(
            f"{name:8s} one conversation: same shape {same:6.2f} ms, new shapes {new:6.2f} ms, "
            f"again {again:6.2f} ms | 32 conversations: new shapes {wide_new:6.2f} ms, "
            f"again {wide_again:6.2f} ms",
            flush=True,
        )
        offset += 300  # shapes the other kernel choice has not seen


@contextlib.contextmanager
def _all_kernels():
    """layer_activations with torch's default choice of attention kernel, cuDNN's included."""
    # Private: the module global layer_activations reads its kernel list from.
    import probes._extract as extract_module

    kept = extract_module.ATTENTION_KERNELS
    extract_module.ATTENTION_KERNELS = [*kept, torch.nn.attention.SDPBackend.CUDNN_ATTENTION]
    try:
        yield
    finally:
        extract_module.ATTENTION_KERNELS = kept


if __name__ == "__main__":
    main()
