"""llama.cpp's own OpenAI-compatible server (the prebuilt `xllamacpp` wheel) on one GGUF file, in
this process, until SIGINT or SIGTERM:

    python -m experts._llamacpp_server --model FILE.gguf --alias NAME --host H --port P --slots N

xllamacpp runs the server in background threads of the process that creates it, so `ctd` runs
this module as a child process (experts._serve.LocalServer) and stops it with SIGTERM. Parallel
slots decode several requests in one batch (continuous batching), which is how the client's
concurrency turns into throughput on a CPU.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from ._serve import CONTEXT_PER_SLOT, SERVER_MODULE, default_threads

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {SERVER_MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the GGUF file")
    parser.add_argument("--alias", required=True, help="the model name the server answers to")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--slots", type=int, default=1, help="requests decoded together")
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--context", type=int, default=CONTEXT_PER_SLOT, help="tokens per slot")
    parser.add_argument("--batch", type=int, default=2048, help="most tokens per decode call (n_batch)")
    parser.add_argument("--ubatch", type=int, default=512, help="tokens per compute step (n_ubatch)")
    parser.add_argument(
        "--poll", type=int, default=0, help="busy-wait level of the thread pool, 0-100 (0: sleep)"
    )
    parser.add_argument(
        "--prompt-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse a slot's cached prompt prefix (the template's text before the conversation)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.model.is_file():
        print(f"error: --model {args.model}: no such file", file=sys.stderr)
        return 2
    # The wheel's llama.cpp runs its forward pass on OpenMP threads, which spin while they wait by
    # default: with anything else on the cores they collapse (a spinning thread holds the core
    # its peer needs). Sleeping waiters scored 2.5-3x faster under load here (docs/benchmarks.md,
    # the embedded expert). Read by the OpenMP runtime when xllamacpp loads it, so set before the import.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(args.model)
    params.model_alias = {args.alias}  # a set of names: a plain string would become its letters
    params.hostnames = [args.host]
    params.port = args.port
    params.n_parallel = args.slots
    params.n_ctx = args.context * args.slots  # shared by the slots: each gets --context
    # Every expert prompt starts with the same template text, so a slot that keeps its last
    # prompt's KV cache evaluates only the conversation and what follows it: 29% of the built-in
    # set's prompt tokens with fine-v1 (92 per item), 55% with stakes-v1 (195 per item, where the
    # expert stage took 87 s instead of 181 s). The price is rounding: the rest is evaluated in
    # other batch shapes, so an item's score moves by 0.013 on average (at most 0.12) and expert
    # AUROC by under 0.002. Several slots decoding together move scores anyway (two uncached
    # runs: up to 0.057), and answers are cached, so a rerun never asks again.
    params.cache_prompt = args.prompt_cache
    params.n_batch = args.batch
    params.n_ubatch = min(args.ubatch, args.batch)
    for cpu in (params.cpuparams, params.cpuparams_batch):
        cpu.n_threads = args.threads
        cpu.poll = args.poll  # ggml's own pool (builds without OpenMP): the same reasoning
    server = xllamacpp.Server(params)
    # Until here SIGTERM ends the process at once (the default action), even inside the load;
    # from here on it stops the server cleanly.
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda number, frame: stop.set())
    print(f"serving {args.model.name} as {args.alias} at {server.listening_address}", flush=True)
    while not stop.wait(0.5):
        pass
    del server  # its destructor stops the HTTP threads and the decode loop
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
