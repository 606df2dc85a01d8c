"""Extraction benchmark (run by hand, not in CI): `python tests/bench/bench_extract.py`.

Side by side over the same length-bucketed batches, repeated and interleaved:
  ours       `probes.extract` into a fresh store (truncated forward + float16 streaming to disk)
  truncated  a plain transformers forward of a model holding only the first `layer` blocks
  full       a plain transformers forward of the whole model with output_hidden_states=True
Then peak memory (RSS) of extraction in fresh processes for N and 4N examples.

Data: the McKenzie-format files in ../shared/data/mup when present (long texts), else the
built-in data set. Options: --n, --max-tokens, --batch-tokens, --layer, --repeats.
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from probes._extract import _pad, bucket_batches, extract, tokenize
from probes._model import decoder_layers, load_model

MUP = Path(__file__).resolve().parents[3] / "shared" / "data" / "mup" / "dev"


def conversations(n: int) -> tuple[list, str]:
    from harness._datasets import read_dataset

    if MUP.is_dir():
        items = [it for f in sorted(MUP.glob("*.jsonl")) for it in read_dataset(f).items]
        source = str(MUP)
    else:
        from harness._builtin import builtin_dir

        items = [it for f in sorted(builtin_dir().glob("*.jsonl")) for it in read_dataset(f).items]
        source = "built-in"
    rng = np.random.default_rng(0)
    chosen = rng.choice(len(items), size=min(n, len(items)), replace=False)
    return [items[i].conversation for i in chosen], source


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def memory_child(n: int, max_tokens: int, batch_tokens: int) -> None:
    """Runs in a fresh process: peak RSS growth of one extraction of n examples."""
    model = load_model()
    convs, _ = conversations(n)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryDirectory() as root:
        _, stats = extract(
            model,
            convs,
            layer=20,
            max_tokens=max_tokens,
            data_hash=f"mem{n}",
            store_root=root,
            batch_tokens=batch_tokens,
        )
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"n": n, "tokens": stats.tokens, "peak_growth_mib": (after - before) / 1024}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--layer", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-child", type=int, default=0)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.max_tokens, args.batch_tokens)
        return
    torch.set_num_threads(torch.get_num_threads())
    model = load_model()
    convs, source = conversations(args.n)
    ids, truncated = tokenize(model.tokenizer, convs, args.max_tokens)
    lengths = np.array([len(t) for t in ids])
    batches = bucket_batches(lengths, args.batch_tokens, 64)
    padded = sum(len(b) * lengths[list(b)].max() for b in batches)
    tensors = [_pad([ids[i] for i in b], model.tokenizer.pad_token_id, model.device) for b in batches]
    base = model.model.model
    truncated_model = copy.deepcopy(base)  # a plain model with only the first `layer` blocks
    truncated_model.layers = torch.nn.ModuleList(list(decoder_layers(truncated_model))[: args.layer])
    truncated_model.config = copy.deepcopy(base.config)
    truncated_model.config.num_hidden_layers = args.layer

    def ours() -> None:
        with tempfile.TemporaryDirectory() as root:
            extract(
                model,
                convs,
                layer=args.layer,
                max_tokens=args.max_tokens,
                data_hash="bench",
                store_root=root,
                batch_tokens=args.batch_tokens,
            )

    @torch.no_grad()
    def plain_truncated() -> None:
        for input_ids, mask in tensors:
            truncated_model(input_ids=input_ids, attention_mask=mask, use_cache=False)

    @torch.no_grad()
    def plain_full() -> None:
        for input_ids, mask in tensors:
            base(input_ids=input_ids, attention_mask=mask, output_hidden_states=True, use_cache=False)

    plain_truncated()  # warm-up
    times: dict[str, list[float]] = {"ours": [], "truncated": [], "full": []}
    for _ in range(args.repeats):
        times["ours"].append(timed(ours))
        times["truncated"].append(timed(plain_truncated))
        times["full"].append(timed(plain_full))
    tokens = int(lengths.sum())
    best = {k: min(v) for k, v in times.items()}
    print(
        f"data: {source}, {len(convs)} examples, {tokens} tokens ({truncated} truncated to {args.max_tokens})"
    )
    print(f"batches: {len(batches)}, padding {1 - tokens / padded:.1%} of {padded} tokens processed")
    for name, seconds in best.items():
        print(
            f"  {name:10s} {tokens / seconds:8.0f} real tokens/s   (best of {args.repeats}: {seconds:.2f} s)"
        )
    n_layers = model.n_layers
    print(f"ours / plain truncated forward: {best['truncated'] / best['ours']:.3f}x (target >= 0.95)")
    print(
        f"ours / full forward: {best['full'] / best['ours']:.2f}x "
        f"(layers/layer = {n_layers / args.layer:.2f}, layers/(layer+1) = {n_layers / (args.layer + 1):.2f})"
    )
    for n in (args.n, 4 * args.n):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--memory-child",
                str(n),
                "--max-tokens",
                str(args.max_tokens),
                "--batch-tokens",
                str(args.batch_tokens),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        print("memory:", out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
