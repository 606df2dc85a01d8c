"""The expert stage against vLLM and against llama.cpp's server, side by side (run by hand, not in
CI): `python tests/bench/bench_vllm_vs_llamacpp.py [--n 64] [--concurrency 4 8]`.

Same items (the built-in set, or --data FILE..., chosen at random with seed 0), same model (the
embedded SmolLM2-135M-Instruct: the GGUF on llama.cpp, the Hugging Face folder converted from it
on vLLM, bfloat16), same template and top logprobs, same concurrency: `ctd query` as a process
(client, rate limiter, SQLite cache, parsing) with an empty cache, through each server started as
`ctd` starts it (`experts.LocalServer`, the registry's settings; llama.cpp gets one slot per
request in flight, as `ctd` gives it). Each server is warmed up with one request that is not
among the items. vLLM also answers likelihood scoring (two /v1/completions requests per item,
prompt logprobs echoed), which llama.cpp's own server cannot: that row has no llama.cpp twin.
Prints items/s of the stage (and counting the process), with the load average beside it.
Needs vLLM installed (`ctd experts setup vllm`) and xllamacpp.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

import experts
from experts import build_request, load_template
from harness.data import read_dataset
from harness.expert import ResolvedExpert

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_expert_speed import stage

WARM_UP = "Hello! Can you recommend a good book for a long train ride?"
CTD = "import sys; from harness.cli import main; sys.argv = ['ctd', *sys.argv[1:]]; main()"
SIDES = {"llama.cpp": "smollm2", "vLLM": "smollm2-vllm"}  # registry entries on the same model


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, nargs="*", default=[])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[4, 8])
    args = parser.parse_args()

    chosen, source = items(args.data, args.n)
    print(
        f"{len(chosen)} items from {source}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        for side, name in SIDES.items():
            for concurrency in args.concurrency:
                spec = experts.BUILTIN_EXPERTS[name]
                served = dataclasses.replace(
                    spec,
                    base_urls=(f"http://127.0.0.1:{free_port()}/v1",),
                    rate=dataclasses.replace(spec.rate, concurrency=concurrency),
                )
                started = time.perf_counter()
                resolved = ResolvedExpert(served, named=f"expert {name}")
                with resolved.local_server(log=work / f"{name}.log") as server:
                    up = time.perf_counter() - started
                    warm = build_request(
                        "next-token", load_template(spec.template), WARM_UP, spec.model, top_logprobs=10
                    )
                    httpx.post(server.url + warm.path, json=warm.body, timeout=300).raise_for_status()
                    methods = ["next-token", "likelihood"] if side == "vLLM" else ["next-token"]
                    for method in methods:
                        wall, seconds = stage(served.base_urls[0], chosen, served, work, method=method)
                        print(
                            f"{side:9} {method:10} concurrency {concurrency:2}: "
                            f"{len(chosen) / seconds:5.2f} items/s stage, {len(chosen) / wall:5.2f} "
                            f"counting the process (server up in {up:.0f} s); "
                            f"load average {os.getloadavg()[0]:.1f}",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
