"""Embedded expert speed (run by hand, not in CI): `python tests/bench/bench_expert_speed.py`.

Side by side in one run, on the same prompts (the expert's chat prompts for the same items):
  (a) stage   `ctd query` as a process against llama.cpp's server (the expert stage: client,
              rate limiter, SQLite cache, parsing), at the registry's concurrency
  (b) bare    a bare aiohttp client at the same concurrency, on a server with the same settings
  (c) torch   the plain torch forward pass of the same model (probes' loader, float32) over the
              same rendered prompts, in padded batches, with the LM head on the last token only
Tokens are prompt tokens as the server counts them (each scoring request generates one token),
cached prefix included: (b) and (a) answer the same prompts that (c) evaluates whole. With the
prompt cache (the default; --no-prompt-cache turns it off) the server evaluates only what follows
each slot's cached prefix; the line for (b) also says how many tokens that was. Each side gets a
fresh server, warmed up with one request that is not among the items (the server also keeps whole
prompts in RAM, so a second side on the same server would find every prompt evaluated).
Targets: (a) >= 0.8 x (b) and (b) >= 0.5 x (c).

Data: --data FILE... (McKenzie-format JSONL, e.g. ../shared/data/mup/dev/*.jsonl), else the
built-in set; --n items, chosen at random with seed 0. Server settings: --slots, --threads,
--ubatch (repeat --slots/--threads as lists to compare configurations of (b)).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np

import experts
from experts import build_request, load_template

# Private: the server's default thread count, which the bench reports.
from experts._serve import default_threads
from harness.data import read_dataset
from probes import embedded_gguf

WARM_UP = "Hello! Can you recommend a good book for a long train ride?"
CTD = "import sys; from harness.cli import main; sys.argv = ['ctd', *sys.argv[1:]]; main()"


def items(files: list[Path], n: int) -> tuple[list, str]:
    if not files:
        from harness.data.builtin import builtin_dir

        files, source = sorted(builtin_dir().glob("*.jsonl")), "built-in"
    else:
        source = ", ".join(f.name for f in files)
    every = [item for f in files for item in read_dataset(f).items]
    chosen = np.random.default_rng(0).choice(len(every), size=min(n, len(every)), replace=False)
    return [every[i] for i in sorted(chosen)], source


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(
    spec: experts.ExpertSpec, gguf: Path, slots: int, threads: int, args: argparse.Namespace, work: Path
) -> Iterator[experts.ExpertSpec]:
    """A fresh llama.cpp server for `spec` with these settings; yields the spec pointing at it,
    its concurrency set to the number of slots."""
    port = free_port()
    served = dataclasses.replace(
        spec,
        base_urls=(f"http://127.0.0.1:{port}/v1",),
        rate=dataclasses.replace(spec.rate, concurrency=slots),
    )
    server = experts.LocalServer(served, gguf=gguf, log=work / "server.log", ready_timeout=300)
    server.command[server.command.index("--slots") + 1] = str(slots)
    server.command[server.command.index("--threads") + 1] = str(threads)
    server.command += ["--ubatch", str(args.ubatch)]
    server.command += [] if args.prompt_cache else ["--no-prompt-cache"]
    with server:
        # Warm-up (one-off allocations, the template's prefix in a slot) with a conversation that
        # is not among the items, so that no timed prompt is already in the server's RAM cache.
        warm = build_request(
            "next-token", load_template(spec.template), WARM_UP, spec.model, top_logprobs=spec.top_logprobs
        )
        httpx.post(served.base_urls[0] + warm.path, json=warm.body, timeout=120).raise_for_status()
        yield served


def bare_client(url: str, bodies: list[dict], concurrency: int) -> tuple[int, int, float]:
    """(prompt tokens, of them taken from the server's prompt cache, seconds) of all bodies through
    one aiohttp session, `concurrency` in flight."""
    import aiohttp

    async def run() -> tuple[int, int, float]:
        gate = asyncio.Semaphore(concurrency)
        tokens = cached = 0
        async with aiohttp.ClientSession() as session:

            async def one(body: dict) -> None:
                nonlocal tokens, cached
                async with gate, session.post(url + "/chat/completions", json=body) as answer:
                    answer.raise_for_status()
                    usage = (await answer.json())["usage"]
                    tokens += usage["prompt_tokens"]
                    cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)

            start = time.perf_counter()
            await asyncio.gather(*(one(b) for b in bodies))
            return tokens, cached, time.perf_counter() - start

    return asyncio.run(run())


def stage(
    url: str, chosen: list, spec: experts.ExpertSpec, work: Path, *, method: str | None = None
) -> tuple[float, float]:
    """(process seconds, the stage's own seconds) of `ctd query` over the items, cache empty, as
    `spec` asks them (concurrency, template, top logprobs: the bare client's requests), by
    `method` when given (else the registry's default)."""
    data = work / "items.jsonl"
    with data.open("w") as out:
        for item in chosen:
            conversation = item.conversation
            inputs = conversation if isinstance(conversation, str) else json.dumps(list(conversation))
            out.write(json.dumps({"inputs": inputs, "ids": item.id, "labels": "high-stakes"}) + "\n")
    registry = work / "experts.toml"
    registry.write_text(
        f'[experts.bench]\nbase_url = "{url}"\nmodel = "{spec.model}"\n'
        f'concurrency = {spec.rate.concurrency}\ntemplate = "{spec.template}"\n'
        f"top_logprobs = {spec.top_logprobs}\n" + (f'method = "{method}"\n' if method else "")
    )
    cache = work / f"cache-{time.monotonic_ns()}.sqlite"
    env = {**os.environ, "CTD_EXPERTS_FILE": str(registry)}
    command = [sys.executable, "-c", CTD, "query", "--data", str(data), "--out", str(work / "out.parquet")]
    command += ["--expert", "bench", "--cache", str(cache), "--no-check", "--json"]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"ctd query failed: {done.stderr.strip().splitlines()[-1:]}")
    summary = json.loads(done.stdout)
    assert summary["scored"] == len(chosen), summary
    return wall, float(summary["seconds"])


def torch_forward(conversations: list[list[dict]], batch: int) -> tuple[int, float]:
    """(tokens, seconds) of the embedded model's forward pass over the chat prompts (rendered
    with the model's own chat template, as the server does), sorted by length into padded
    batches; the LM head on the last token only."""
    import torch

    from probes import load_model

    loaded = load_model("smollm2")
    tokenizer, model = loaded.tokenizer, loaded.model
    texts = [
        tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in conversations
    ]
    encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    batches = [[encoded[i] for i in order[k : k + batch]] for k in range(0, len(order), batch)]
    base, head = model.get_decoder(), model.get_output_embeddings()

    def run() -> None:
        with torch.inference_mode():
            for rows in batches:
                width = max(len(r) for r in rows)
                ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
                mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
                hidden = base(input_ids=ids, attention_mask=mask).last_hidden_state
                last = hidden[torch.arange(len(rows)), mask.sum(1) - 1]
                head(last)

    run()  # warm-up
    start = time.perf_counter()
    run()
    return sum(len(e) for e in encoded), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, nargs="*", default=[])
    parser.add_argument("--n", type=int, default=48)
    parser.add_argument(
        "--slots", type=int, nargs="*", default=[experts.BUILTIN_EXPERTS["smollm2"].rate.concurrency]
    )
    parser.add_argument("--threads", type=int, nargs="*", default=[default_threads()])
    parser.add_argument("--ubatch", type=int, default=512)
    parser.add_argument("--torch-batch", type=int, default=16)
    parser.add_argument(
        "--prompt-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the server reuses each slot's cached prompt prefix (ctd's default)",
    )
    args = parser.parse_args()

    chosen, source = items(args.data, args.n)
    spec = experts.BUILTIN_EXPERTS["smollm2"]
    template = load_template(spec.template)
    bodies = [
        build_request(
            "next-token", template, it.conversation, spec.model, top_logprobs=spec.top_logprobs
        ).body
        for it in chosen
    ]
    print(
        f"{len(chosen)} items from {source}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    gguf = embedded_gguf()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        for slots in args.slots:
            for threads in args.threads:
                # A fresh server for each side: the server keeps whole prompts in a RAM cache
                # (8 GiB by default), so a side that ran second on the same server would find
                # every prompt of the first already evaluated.
                with serve(spec, gguf, slots, threads, args, work) as served:
                    tokens, cached, bare_s = bare_client(served.base_urls[0], bodies, slots)
                with serve(spec, gguf, slots, threads, args, work) as served:
                    wall, stage_s = stage(served.base_urls[0], chosen, served, work)
                rows.append((slots, threads, tokens, bare_s, stage_s, wall))
                print(
                    f"slots {slots} threads {threads}: {tokens} prompt tokens, {cached} of them from "
                    f"the prompt cache; (b) bare {tokens / bare_s:.0f} tok/s "
                    f"({(tokens - cached) / bare_s:.0f} evaluated); "
                    f"(a) stage {tokens / stage_s:.0f} tok/s ({tokens / wall:.0f} counting the process), "
                    f"load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    torch_tokens, torch_s = torch_forward([b["messages"] for b in bodies], args.torch_batch)
    print(
        f"(c) torch forward: {torch_tokens} tokens, {torch_tokens / torch_s:.0f} tok/s "
        f"(batch {args.torch_batch})"
    )
    slots, threads, tokens, bare_s, stage_s, wall = max(rows, key=lambda r: r[2] / r[3])
    bare, stage_rate, torch_rate = tokens / bare_s, tokens / stage_s, torch_tokens / torch_s
    print(
        f"best (b): slots {slots} threads {threads}. (a)/(b) = {stage_rate / bare:.2f} (target 0.8), "
        f"(b)/(c) = {bare / torch_rate:.2f} (target 0.5); load average now {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
