"""Extraction benchmark (run by hand, not in CI): `python tests/bench/bench_extract.py`.

Side by side over the same length-bucketed batches, repeated and interleaved:
  ours       `probes.extract` into a fresh store (truncated forward + float16 streaming to disk)
  truncated  a plain transformers forward of a model holding only the first `layer` blocks
  full       a plain transformers forward of the whole model with output_hidden_states=True
Then peak memory (RSS) of extraction in fresh processes for N and 4N examples.

Data: the McKenzie-format files in ../shared/data/mup when present (long texts), else the
built-in data set (--data DIR: another folder of such files). Options: --n, --max-tokens,
--batch-tokens, --layer, --repeats; --random-llama-1b with --peak-tflops on a GPU (--tokenizer DIR
where the embedded model is not at hand); --skip-memory.
On CUDA every timing starts and ends with torch.cuda.synchronize(), so queued kernels and copies
count to the loop that queued them.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from probes import load_model

# Private: the extraction's inner steps, timed one by one.
from probes._extract import _pad, bucket_batches, extract, tokenize

# Private: the decoder layers, timed without the rest of the model.
from probes._model import decoder_layers

MUP = Path(__file__).resolve().parents[3] / "shared" / "data" / "mup" / "dev"


def conversations(n: int, data: Path = MUP) -> tuple[list, str]:
    from harness.data import read_dataset

    if data.is_dir():
        items = [it for f in sorted(data.glob("*.jsonl")) for it in read_dataset(f).items]
        source = str(data)
    else:
        from harness.data.builtin import builtin_dir

        items = [it for f in sorted(builtin_dir().glob("*.jsonl")) for it in read_dataset(f).items]
        source = "built-in"
    rng = np.random.default_rng(0)
    chosen = rng.choice(len(items), size=min(n, len(items)), replace=False)
    return [items[i].conversation for i in chosen], source


def timed(fn) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def llama_1b_folder(tokenizer: str | None = None) -> str:
    """A folder with Llama-3.2-1B's architecture (16 layers, hidden 2048, GQA 32/8 heads, MLP
    8192, vocabulary 128256) and random weights, plus the embedded model's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = Path(tempfile.mkdtemp(prefix="llama-1b-random-"))
    config = LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    if tokenizer:  # a saved copy of SmolLM2's, e.g. on a GPU machine without the embedded model
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(tokenizer).save_pretrained(folder)
    else:
        load_model().tokenizer.save_pretrained(folder)  # SmolLM2's: its ids all fall inside the vocabulary
    return str(folder)


def memory_child(n: int, max_tokens: int, batch_tokens: int) -> None:
    """Runs in a fresh process: peak RSS growth of one extraction of n examples."""
    import threading

    import psutil

    model = load_model()
    convs, _ = conversations(n)
    process = psutil.Process()

    def anonymous() -> int:
        # Resident memory minus file-backed pages: the store's memory map is written through the
        # page cache, whose pages count as resident but are the kernel's to drop, not our heap.
        info = process.memory_info()
        return info.rss - info.shared

    before = anonymous()
    peak = [before]
    done = threading.Event()

    def sample() -> None:  # every 5 ms
        while not done.wait(0.005):
            peak[0] = max(peak[0], anonymous())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
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
    done.set()
    sampler.join()
    print(
        json.dumps({"n": n, "tokens": stats.tokens, "peak_growth_mib": round((peak[0] - before) / 2**20, 1)})
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--layer", type=int, default=20)
    parser.add_argument("--model", default="smollm2", help="what load_model accepts")
    parser.add_argument(
        "--random-llama-1b",
        action="store_true",
        help="a Llama-3.2-1B-sized model with random weights built from its config (use --layer 11)",
    )
    parser.add_argument("--tokenizer", default=None, help="--random-llama-1b: a tokenizer folder")
    parser.add_argument("--data", type=Path, default=MUP, help="a folder of McKenzie-format .jsonl files")
    parser.add_argument("--skip-memory", action="store_true", help="no peak-memory runs at the end")
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="the GPU's dense bf16 peak, e.g. 989")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-child", type=int, default=0)
    parser.add_argument("--memory-only", action="store_true")
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.max_tokens, args.batch_tokens)
        return
    if args.memory_only:
        memory_runs(args)
        return
    model = load_model(llama_1b_folder(args.tokenizer) if args.random_llama_1b else args.model)
    convs, source = conversations(args.n, args.data)
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
    if args.peak_tflops and torch.cuda.is_available():
        # Forward FLOPs per token of the blocks run: 2 x their parameters (attention scores aside).
        per_layer = sum(p.numel() for p in decoder_layers(model.model)[0].parameters())
        flops = 2 * per_layer * args.layer * tokens / best["ours"]
        share = flops / 1e12 / args.peak_tflops
        print(f"{flops / 1e12:.1f} TFLOP/s: {share:.1%} of the {args.peak_tflops} TFLOP/s peak")
    print(
        f"ours / full forward: {best['full'] / best['ours']:.2f}x "
        f"(layers/layer = {n_layers / args.layer:.2f}, layers/(layer+1) = {n_layers / (args.layer + 1):.2f})"
    )
    if not args.skip_memory:
        memory_runs(args)


def memory_runs(args: argparse.Namespace) -> None:
    """Peak anonymous memory of an extraction in a fresh process, for N and 4N examples."""
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
