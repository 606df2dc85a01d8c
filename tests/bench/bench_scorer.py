"""The monitor's scoring path alone (run by hand, not in CI), on a GPU or the CPU:

    python tests/bench/bench_scorer.py --tokenizer FOLDER [--shape llama-1b] [--batch 32,128]
        [--data DIR] [--cuts cost,budget,0.25]

Writes a random-weight model folder of the given shape (Llama-3.2-1B: 16 layers, width 2048) with
the tokenizer files of FOLDER (e.g. the embedded model's converted folder under ~/.cache/ctd/models),
an untrained bundle over it (tests/monitor_bundle.py; layer 11 for llama-1b), then scores the
built-in test split (45 to 123 tokens), or with --data the McKenzie-format files of DIR
(training/*.jsonl and dev/*.jsonl, as bench_gpu.py reads them: up to 512 tokens, 238 on average),
cycled, in micro-batches:
conversations per second with each micro-batch cut into forward passes by each of --cuts (cost:
by the pass cost fitted on this machine, the monitor's rule; budget: as few passes as the token
budget allows; a number such as 0.25: a pass closes before a conversation shorter than 75% of its
longest), twice each, interleaved, with the passes and padded tokens of each, and the
largest difference from the offline path (`probes.extract` + `probes.predict`). `ctd monitor
serve BUNDLE` serves the same bundle (printed at the end) for an HTTP benchmark
(tests/bench/bench_monitor.py).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

SHAPES = {  # LlamaConfig fields; vocab_size comes from the tokenizer
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2),
}  # fmt: skip
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)


def random_model(target: Path, tokenizer: Path, shape: str) -> Path:
    """A folder with random weights of `shape` and the tokenizer files of `tokenizer`."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    vocab = len(AutoTokenizer.from_pretrained(str(tokenizer)))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, **SHAPES[shape])).to(torch.bfloat16)
    model.save_pretrained(target)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, target / name)
    return target


def main() -> None:
    import monitor_bundle
    from bench_monitor import texts

    # Private: the scorer module, whose forward passes are timed.
    from harness.monitor import _scorer
    from probes import bucket_batches, extract, predict

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-1b")
    parser.add_argument("--batch", default="32,128")
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--data", type=Path, default=None, help="McKenzie-format files (default: built-in)")
    parser.add_argument(
        "--cuts",
        default="cost,budget,0.25",
        help="cost: the fitted cost (the monitor's rule); budget: one "
        "pass as the token budget allows; a number: passes closed at that much padding",
    )
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-scorer-"))
    model = random_model(scratch / "model", args.tokenizer, args.shape)
    monitor_bundle.LAYER = 11 if args.shape == "llama-1b" else 2
    monitor_bundle.MAX_TOKENS = 512
    bundle = monitor_bundle.write_untrained_bundle(scratch / "bundle", model=str(model), expert=True)
    scorer = _scorer.ProbeScorer.load(bundle / "safety", bundle / "dv")
    print(f"model {args.shape} on {scorer.model.device} ({scorer.model.dtype}), layer {scorer.reads.layer}")
    if args.data is None:
        conversations = texts(args.n)
    else:
        from bench_gpu import read_data

        found = read_data(args.data, None)[0]
        conversations = [found[i % len(found)] for i in range(args.n)]
    tokens = [scorer.tokens(c) for c in conversations]
    real = sum(len(t.ids) for t in tokens)
    store, _ = extract(
        scorer.model, conversations[:64], layer=scorer.reads.layer, max_tokens=scorer.reads.max_tokens,
        data_hash="bench-scorer", store_root=scratch / "store",
    )  # fmt: skip
    acts = store.read()
    offline = np.stack(
        [predict(p.cpu(), acts, task=t) for p, t in ((scorer.safety, "safety"), (scorer.dv, "dv"))], 1
    )
    scorer.safety.to(scorer.model.device), scorer.dv.to(scorer.model.device)
    online = np.array(scorer.score(tokens[:64]))
    print(f"max |monitor - offline| over 64 conversations: {np.abs(online - offline).max():.2e}")
    sync = torch.cuda.synchronize if scorer.model.device.type == "cuda" else (lambda: None)
    original = _scorer.forward_passes
    for batch in (int(b) for b in args.batch.split(",")):
        batches = [tokens[i : i + batch] for i in range(0, len(tokens), batch)]
        cost = scorer.fit_pass_cost(batch)
        print(
            f"micro-batch {batch}: a pass costs {cost.per_pass * 1e3:.2f} ms "
            f"+ {cost.per_token * 1e6:.3f} us/token"
        )
        for cut in args.cuts.split(",") * 2:
            scorer.pass_cost = cost if cut == "cost" else None
            if cut in ("cost", "budget"):
                _scorer.forward_passes = original
            else:
                _scorer.forward_passes = lambda lengths, budget, _cost, cap=float(cut): bucket_batches(
                    lengths, budget, max_batch=len(lengths), max_padding=cap
                )
            passes = padded = 0
            for b in batches:
                lengths = np.array([len(t.ids) for t in b])
                for rows in _scorer.forward_passes(lengths, scorer.batch_tokens, scorer.pass_cost):
                    passes, padded = passes + 1, padded + len(rows) * int(lengths[list(rows)].max())
            sync()
            started = time.perf_counter()
            for b in batches:
                scorer.score(b)
            sync()
            rate = len(tokens) / (time.perf_counter() - started)
            rule = {"cost": "fitted cost", "budget": "one pass"}.get(cut) or f"{float(cut):.0%} cap"
            print(
                f"micro-batch {batch:4d}, {rule:11s}: {rate:8.1f} conversations/s "
                f"({passes} passes, {padded:,} padded tokens for {real:,})",
                flush=True,
            )
    _scorer.forward_passes = original
    print(f"bundle: {bundle} (model folder {model})")


if __name__ == "__main__":
    main()
