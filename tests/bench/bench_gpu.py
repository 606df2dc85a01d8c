"""GPU benchmark of the probe stage and the monitor (run by hand on a CUDA machine, not in CI):

    python tests/bench/bench_gpu.py [--data DIR] [--tokenizer DIR] [--parts extract,train,monitor,eval]

The paper's setting: a Llama-3.2-1B-shaped model (16 layers, hidden 2048, GQA 32/8, MLP 8192,
vocabulary 128256) with random weights in bfloat16 (a config, no download), the embedded model's
tokenizer, and the McKenzie-format files of DIR (training/*.jsonl and dev/*.jsonl: 3,115
conversations, 741,525 tokens at 512 tokens each at most). Without CUDA it says so and stops,
unless --tiny (a 2-layer model of width 64 on a few rows: a smoke test of this script on a CPU).

Parts, each printed as it ends, with the GPU's mean use over the part (NVML, sampled every 50 ms):
  extract  `probes.extract` into a fresh store against a bare bf16 forward loop of the first
           `layer` blocks over the same padded batches, interleaved, best of --repeats; tokens/s,
           the ratio, and model FLOP utilisation against --peak-tflops
  train    `probes.train_probe` of each of --archs x --seeds on the store (safety labels); seconds
  monitor  `ctd monitor serve` of a bundle over the model (the attention probe trained above, as
           both probes), expert disabled; requests/s and latency at --clients closed-loop clients
           (spread over --load-processes processes), with the server's and the busiest client
           process's CPU share: a share near 1.0 says which side bounds the number
  eval     `ctd eval` of the same files (attention, 3 seeds) with a local fault-free stand-in
           expert (tests/fault_server.py); wall time and the share of it the GPU was busy
A JSON line with every number ends the output (and --out FILE gets it).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))  # first: tests/experts/ must not shadow the experts package

from bench_monitor import children_cpu_seconds, load_spread, process_cpu_seconds  # noqa: E402
from bench_monitor import serve as monitor_serve  # noqa: E402
from ctd_cli import CTD, free_port  # noqa: E402

MAX_TOKENS = 512
ARCHS = "attention,softmax,mean,mlp"


class GpuUse:
    """Samples the GPU's utilisation every 50 ms in a thread; `mean(since)` and `busy(since)` over
    the samples taken after `since` (time.monotonic())."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
            threading.Thread(target=self._run, daemon=True).start()
        except Exception:  # no NVML (CPU smoke test): no samples
            self._nvml = None

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
            self.samples.append((time.monotonic(), int(util)))

    def _since(self, since: float) -> np.ndarray:
        return np.array([u for t, u in self.samples if t >= since], dtype=float)

    def mean(self, since: float) -> float | None:
        values = self._since(since)
        return float(values.mean()) if len(values) else None

    def busy(self, since: float) -> float | None:
        values = self._since(since)
        return float((values > 0).mean()) if len(values) else None


def build_model(folder: Path, tokenizer_dir: Path | None, tiny: bool, device: str) -> None:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    shape = (
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)
        if tiny else
        dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
             num_key_value_heads=8)
    )  # fmt: skip
    config = LlamaConfig(
        **shape, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: 1.2B parameters on a CPU take a while
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    if tokenizer_dir is None:
        from probes import load_model

        load_model().tokenizer.save_pretrained(folder)
    else:
        AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(folder)


def read_data(data: Path, limit: int | None) -> tuple[list, np.ndarray, list[Path], list[Path]]:
    from harness.data import read_dataset

    train = sorted((data / "training").glob("*.jsonl"))
    dev = sorted((data / "dev").glob("*.jsonl"))
    conversations, labels = [], []
    for path in [*train, *dev]:
        dataset = read_dataset(path)
        rows = list(zip(dataset.items, dataset.labels, strict=True))[:limit]
        conversations += [item.conversation for item, _ in rows]
        labels += [label for _, label in rows]
    return conversations, np.array(labels, dtype=np.float64), train, dev


def part_extract(args, folder: Path, conversations: list, store_root: Path, gpu: GpuUse) -> dict:
    from probes import bucket_batches, extract, load_model, pad_batch, resolve_layer, tokenize

    # Private: the decoder layers, timed without the rest of the model.
    from probes._model import decoder_layers

    loaded = load_model(str(folder))
    layer = resolve_layer(None, loaded.n_layers, loaded.model.config)
    started = time.perf_counter()
    ids, truncated = tokenize(loaded.tokenizer, conversations, MAX_TOKENS)
    tokenize_seconds = time.perf_counter() - started
    lengths = np.array([len(t) for t in ids], dtype=np.int64)
    batches = bucket_batches(lengths, args.batch_tokens, 64)
    tensors = [pad_batch([ids[i] for i in b], loaded.tokenizer.pad_token_id, loaded.device) for b in batches]
    base = getattr(loaded.model, loaded.model.base_model_prefix)
    bare = copy.copy(base)  # the same weights, only the first `layer` blocks
    bare._modules = dict(base._modules)  # its own module table: `base` keeps all its blocks
    bare.layers = torch.nn.ModuleList(list(decoder_layers(base))[:layer])
    bare.config = copy.deepcopy(base.config)
    bare.config.num_hidden_layers = layer

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    @torch.no_grad()
    def bare_loop() -> None:
        for input_ids, mask in tensors:
            bare(input_ids=input_ids, attention_mask=mask, use_cache=False)
        sync()

    def ours(store: Path) -> None:
        extract(
            loaded, conversations, layer=layer, max_tokens=MAX_TOKENS, data_hash=f"bench-{time.time_ns()}",
            store_root=store, batch_tokens=args.batch_tokens,
        )  # fmt: skip
        sync()

    bare_loop()  # warm-up: kernels, allocator
    times: dict[str, list[float]] = {"ours": [], "bare": []}
    since = time.monotonic()
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(dir=store_root) as store:
            started = time.perf_counter()
            ours(Path(store))
            times["ours"].append(time.perf_counter() - started)
        started = time.perf_counter()
        bare_loop()
        times["bare"].append(time.perf_counter() - started)
        print(f"  extract repeat {repeat}: ours {times['ours'][-1]:.2f} s, bare {times['bare'][-1]:.2f} s")
    if args.profile:  # where one extraction's wall time goes, by Python function
        with tempfile.TemporaryDirectory(dir=store_root) as store:
            _profiled(lambda: ours(Path(store)), "extract")
    tokens = int(lengths.sum())
    per_layer = sum(p.numel() for p in decoder_layers(base)[0].parameters())
    result = {
        "examples": len(ids),
        "tokens": tokens,
        "truncated": truncated,
        "batches": len(batches),
        "layer": layer,
        "ours_tokens_per_s": tokens / min(times["ours"]),
        "bare_tokens_per_s": tokens / min(times["bare"]),
        "gpu_mean_use": gpu.mean(since),
        "tokenize_seconds": tokenize_seconds,
    }
    result["ratio"] = result["ours_tokens_per_s"] / result["bare_tokens_per_s"]
    for name in ("ours", "bare"):  # forward FLOPs per token: 2 x the parameters of the blocks run
        result[f"{name}_mfu"] = (
            2 * per_layer * layer * result[f"{name}_tokens_per_s"] / 1e12 / args.peak_tflops
        )
    store, _ = extract(
        loaded, conversations, layer=layer, max_tokens=MAX_TOKENS, data_hash="bench-kept",
        store_root=store_root, batch_tokens=args.batch_tokens,
    )  # fmt: skip
    result["store"] = str(store.folder)
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return result


def part_train(args, store_folder: Path, labels: np.ndarray, gpu: GpuUse) -> tuple[dict, tuple]:

    from probes import ActivationStore, ProbeConfig, StoreKey, predict, train_probe

    store = ActivationStore(store_folder, StoreKey(**json.loads((store_folder / "key.json").read_text())))
    acts = store.read()
    results: dict[str, dict] = {}
    since = time.monotonic()
    started_all = time.perf_counter()
    kept = None
    for arch in args.archs.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            config = ProbeConfig(arch=arch, **({"epochs": args.epochs} if args.epochs else {}))
            started = time.perf_counter()
            trained = train_probe(acts, labels, task="safety", config=config, seed=seed)
            seconds = time.perf_counter() - started
            results[f"{arch}/{seed}"] = {"seconds": seconds, "epochs": len(trained.history)}
            print(f"  train {arch} seed {seed}: {seconds:.2f} s, {len(trained.history)} epochs", flush=True)
            if arch == "attention" and kept is None:
                kept = (trained.probe, config, seed)
    total = time.perf_counter() - started_all
    if args.profile:  # one short fit of each architecture: Python functions and torch operators
        for arch in args.archs.split(","):
            short = ProbeConfig(arch=arch, epochs=3, patience=3)

            def fit(config: ProbeConfig = short) -> None:
                train_probe(acts, labels, task="safety", config=config, seed=0)

            _profiled(fit, f"train {arch}")
            _torch_profiled(fit, f"train {arch}")
    summary = {"total_seconds": total, "runs": results, "gpu_mean_use": gpu.mean(since)}
    if "train" in args.parts and torch.cuda.is_available():
        # The same probe trained on the CPU: the GPU's scores must match to float tolerance.
        config = ProbeConfig(arch="mean", **({"epochs": args.epochs} if args.epochs else {}))
        on_gpu = train_probe(acts, labels, task="safety", config=config, seed=0)
        on_cpu = train_probe(acts, labels, task="safety", config=config, seed=0, device="cpu")
        gap = np.abs(predict(on_gpu.probe, acts, task="safety") - predict(on_cpu.probe, acts, task="safety"))
        summary["mean_probe_gpu_vs_cpu_max_abs_diff"] = float(gap.max())
    return summary, (store, kept)


def _profiled(work, label: str, top: int = 22) -> None:
    """cProfile of `work()`: the functions with the most cumulative time."""
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.runcall(work)
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(top)
    lines = [line for line in out.getvalue().splitlines() if line.strip()][-top - 1 :]
    print(f"  profile {label}: {time.perf_counter() - started:.2f} s under cProfile", flush=True)
    print("\n".join("    " + line[:150] for line in lines), flush=True)


def _torch_profiled(work, label: str, top: int = 14) -> None:
    """torch.profiler of `work()`: operators by self CPU time, and the device time they add up to."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    started = time.perf_counter()
    with profile(activities=activities) as prof:
        work()
        torch.cuda.synchronize() if torch.cuda.is_available() else None
    wall = time.perf_counter() - started
    events = prof.key_averages()
    device_us = sum(getattr(e, "self_device_time_total", 0) or 0 for e in events)
    busy = device_us / 1e6
    print(f"  torch profile {label}: wall {wall:.2f} s (profiled), device busy {busy:.3f} s", flush=True)
    table = events.table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=40)
    print("\n".join("    " + line[:170] for line in table.splitlines()), flush=True)


def write_bundle(folder: Path, model_folder: Path, store, kept) -> Path:
    """A bundle serving `kept` (the trained attention probe) as both probes, budget mode at 0.5."""
    from harness.run import BundleLayout
    from probes import ProbeArtifact, save_probe

    sys.path.insert(0, str(ROOT / "tests"))
    from monitor_bundle import seal, stand_in_record

    probe, config, seed = kept
    key = store.key
    layout = BundleLayout(folder)
    for stem, task in ((layout.safety_probe, "safety"), (layout.dv_probe, "dv")):
        artifact = ProbeArtifact(
            task=task, config=config, dim=store.plan().dim, model=str(model_folder), model_identity=key.model,
            layer=key.layer, max_tokens=key.max_tokens, template="", template_hash=key.template, seed=seed,
        )  # fmt: skip
        save_probe(stem, probe.cpu(), artifact)
    record = stand_in_record(run=str(folder.parent), arch=config.arch, seed=seed)  # budget mode, 0.5
    layout.record.write_text(json.dumps(record))
    seal(folder)
    return folder


def part_monitor(args, bundle: Path, conversations: list, gpu: GpuUse) -> dict:
    rows = []
    no_shedding = ["--no-expert", "--max-queue-ms", "600000", "--max-pending", "100000"]
    processes = args.load_processes
    # spawn, not fork: this process holds a CUDA context and the GPU sampler's thread.
    pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"))
    configs = [
        (Path(d) if d else None, int(b), int(t), scorer)
        for d in args.log_dirs.split(",")
        for b in args.max_batch.split(",")
        for t in args.monitor_batch_tokens.split(",")
        for scorer in args.scorers.split(",")
    ]
    for log_dir, max_batch, batch_tokens, scorer in configs:
        port = free_port()
        options = ["--max-batch", str(max_batch), "--batch-tokens", str(batch_tokens), f"--scorer-{scorer}"]
        process = monitor_serve(bundle, port, [*no_shedding, *options], log_dir)
        try:
            load_spread(
                pool, processes, port, conversations[: 64 * processes], 16 * processes, args.max_seconds
            )  # warm-up
            levels = [int(c) for c in args.clients.split(",")]
            for level, clients in enumerate(levels):
                n = max(clients * 16, 64)
                texts = [conversations[i % len(conversations)] for i in range(n)]
                last = level == len(levels) - 1
                name = f"monitor-{max_batch}-{batch_tokens}-{scorer}"
                spy = _spy(args, process.pid, name) if last else None
                server_cpu = process_cpu_seconds(process.pid)  # idle until the load starts
                scorer_cpu = children_cpu_seconds(process.pid)
                batches = _forward_counts(port)
                row = load_spread(pool, processes, port, texts, clients, args.max_seconds)
                if spy is not None:  # its profile: this level's second of start-up and its load
                    spy.send_signal(signal.SIGINT)
                    spy.wait(60)
                passes, items = (
                    after - before for after, before in zip(_forward_counts(port), batches, strict=True)
                )
                row.update(
                    max_batch=max_batch, batch_tokens=batch_tokens, gpu_mean_use=gpu.mean(row["started"]),
                    log_dir=str(log_dir), mean_micro_batch=items / max(passes, 1), profiled=spy is not None,
                    server_cpu=(process_cpu_seconds(process.pid) - server_cpu) / row["elapsed"],
                    scorer=scorer,
                    scorer_cpu=(children_cpu_seconds(process.pid) - scorer_cpu) / row["elapsed"],
                )  # fmt: skip
                rows.append(row)
                print(
                    f"  monitor scorer {scorer}, log in {log_dir or 'tmp'}, max-batch {max_batch} "
                    f"batch-tokens {batch_tokens} "
                    f"clients {clients:3d}: {row['rps']:7.1f} req/s, p50 {row['p50_ms']:7.1f} ms, "
                    f"p99 {row['p99_ms']:7.1f} ms, micro-batches of {row['mean_micro_batch']:.1f}, "
                    f"GPU {row['gpu_mean_use']}, CPU server {row['server_cpu']:.2f} "
                    f"scorer process {row['scorer_cpu']:.2f} "
                    f"busiest of {row['processes']} client processes {row['client_cpu']:.2f}"
                    + (" (under py-spy)" if row["profiled"] else ""),
                    flush=True,
                )
        finally:
            process.terminate()
            process.wait(30)
    pool.shutdown()
    return {"levels": rows}


def _forward_counts(port: int) -> tuple[float, float]:
    """The monitor's /metrics counters of micro-batches run and conversations in them."""
    import httpx

    counts = {"ctd_monitor_forward_batches_total": 0.0, "ctd_monitor_forward_items_total": 0.0}
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text.splitlines():
        name, _, value = line.partition(" ")
        if name in counts:
            counts[name] = float(value)
    return counts["ctd_monitor_forward_batches_total"], counts["ctd_monitor_forward_items_total"]


def _spy(args, pid: int, name: str) -> subprocess.Popen | None:
    """With --spy DIR: py-spy sampling process `pid` until it is sent SIGINT, every thread's stack
    (waiting too) or with --spy-gil only the thread holding the GIL; None without --spy."""
    if args.spy is None:
        return None
    args.spy.mkdir(parents=True, exist_ok=True)
    out = ["-f", "raw", "-o", str(args.spy / f"{name}.txt")]
    mode = ["--gil", "-r", "200"] if args.spy_gil else ["--idle", "-r", "100"]
    spy = ["py-spy", "record", "-p", str(pid), *mode, "--threads", "--subprocesses", *out]
    return subprocess.Popen(spy, stdout=subprocess.DEVNULL)


def part_eval(args, folder: Path, train: list[Path], dev: list[Path], gpu: GpuUse) -> dict:
    from fault_server import RunningServer

    runs = Path(tempfile.mkdtemp(prefix="runs-gpu-"))
    dev_spec = ",".join(f"{p.stem.split('_')[0]}:{p}" for p in dev)

    def eval_command(expert_url: str, runs: Path, limit: int | None) -> list[str]:
        # A few rows certify only large budgets: the smoke test asks for one.
        rows = ["--limit", str(limit), "--budgets", "0.9"] if limit else []
        return [
            sys.executable, "-c", CTD, "eval", "--name", "gpu", "--runs-dir", str(runs),
            "--model", str(folder),
            "--data", f"train={train[0]}", "--data", f"dev={dev_spec}", "--expert", expert_url,
            "--expert-model", "fault-model", "--serve", "never", *rows, "--json",
        ]  # fmt: skip

    with RunningServer() as expert:
        # An installed project has its modules' bytecode (pip compiles it at install); here the
        # eval's own modules (calibration, scipy, the report's matplotlib) would be compiled by
        # the timed run. A short eval on a few rows, with its own runs, store and expert cache
        # (nothing of it reused), imports them first.
        scratch = Path(tempfile.mkdtemp(prefix="warm-gpu-"))
        warm_env = {**_env(), "CTD_CACHE": str(scratch / "cache.sqlite"), "CTD_STORE": str(scratch / "store")}
        started = time.perf_counter()
        warm = subprocess.run(
            eval_command(expert.url, scratch / "runs", 64), capture_output=True, text=True, env=warm_env
        )
        print(f"  eval warm-up (64 rows a file, bytecode): exit {warm.returncode}, "
              f"{time.perf_counter() - started:.1f} s", flush=True)  # fmt: skip
        if warm.returncode != 0:
            print(warm.stderr[-2000:], flush=True)
        command = eval_command(expert.url, runs, args.limit)
        since = time.monotonic()
        started = time.perf_counter()
        if args.spy is not None and args.spy_eval:  # the same run under py-spy, which runs it
            command = ["py-spy", "record", "--idle", "--threads", "-r", "50", "-f", "raw",
                       "-o", str(args.spy / "eval.txt"), "--", *command]  # fmt: skip
            args.spy.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(command, capture_output=True, text=True, env=_env())
        wall = time.perf_counter() - started
    if done.returncode != 0:
        print(done.stderr[-3000:])
    log = runs / "gpu" / "log.txt"
    return {
        "returncode": done.returncode,
        "wall_seconds": wall,
        "gpu_mean_use": gpu.mean(since),
        "gpu_busy_share": gpu.busy(since),
        "log_tail": log.read_text().splitlines()[-40:] if log.is_file() else [],
    }


def _env() -> dict[str, str]:
    """This environment with the project first on PYTHONPATH (and what was there kept)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "mup")
    parser.add_argument("--tokenizer", type=Path, default=None, help="default: the embedded model's")
    parser.add_argument("--parts", default="extract,train,monitor,eval")
    parser.add_argument("--archs", default=ARCHS)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=None, help="default: ProbeConfig's")
    parser.add_argument("--clients", default="1,8,32,128")
    parser.add_argument("--max-batch", default="32,128", help="the monitor's --max-batch values to try")
    parser.add_argument("--max-seconds", type=float, default=20.0, help="per monitor level")
    parser.add_argument(
        "--monitor-batch-tokens", default="8192", help="the monitor's --batch-tokens values to try"
    )
    parser.add_argument(
        "--scorers",
        default="process,threads",
        help="the monitor's scorer placements to try (--scorer-process, --scorer-threads)",
    )
    parser.add_argument(
        "--spy",
        type=Path,
        default=None,
        help="folder for py-spy profiles of the monitor's last --clients level",
    )
    parser.add_argument("--spy-gil", action="store_true", help="profile only the thread holding the GIL")
    parser.add_argument("--spy-eval", action="store_true", help="and run `ctd eval` under py-spy too")
    parser.add_argument(
        "--load-processes", type=int, default=8, help="processes the monitor's clients are spread over"
    )
    parser.add_argument(
        "--log-dirs", default="", help="folders for the monitor's decision log, comma-separated (''=tmp)"
    )
    parser.add_argument("--batch-tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100/H200 SXM)")
    parser.add_argument("--limit", type=int, default=None, help="rows per file (default: all)")
    parser.add_argument("--tiny", action="store_true", help="a tiny model: a CPU smoke test of this script")
    parser.add_argument("--profile", action="store_true", help="profiles of one extraction and short fits")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.tiny:
        print("bench_gpu: no CUDA device here; skipped (use --tiny for a CPU smoke test)")
        return
    device = "cuda" if torch.cuda.is_available() else "cpu"
    parts = set(args.parts.split(","))
    gpu = GpuUse()
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    # An installed project has its bytecode (pip compiles it). The GPU machines' image has none
    # for its packages and sets PYTHONDONTWRITEBYTECODE=1, so every process started here would
    # compile torch and transformers from source, seconds a user never pays: those processes
    # write theirs, in a cache of their own where the packages have none (a cache hides the
    # packages' own bytecode, so it is not set where they have it).
    writes_none = os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    packages_compiled = Path(importlib.util.cache_from_source(torch.__file__)).is_file()
    if writes_none and not packages_compiled and "PYTHONPYCACHEPREFIX" not in os.environ:
        os.environ["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    folder = work / "llama-1b-random"
    started = time.perf_counter()
    build_model(folder, args.tokenizer, args.tiny, device)
    conversations, labels, train, dev = read_data(args.data, args.limit)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, model built in {time.perf_counter() - started:.1f} s")
    result: dict = {"device": name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    if parts & {"extract", "train", "monitor"}:
        result["extract"] = part_extract(args, folder, conversations, work, gpu)
        e = result["extract"]
        print(
            f"extract: ours {e['ours_tokens_per_s']:.0f} tokens/s, "
            f"bare {e['bare_tokens_per_s']:.0f} tokens/s, ratio {e['ratio']:.2f}, "
            f"MFU ours {e['ours_mfu']:.1%} bare {e['bare_mfu']:.1%}, GPU {e['gpu_mean_use']}",
            flush=True,
        )
    bundle = None
    if parts & {"train", "monitor"}:
        result["train"], (store, kept) = part_train(args, Path(result["extract"]["store"]), labels, gpu)
        if kept is not None:
            bundle = write_bundle(work / "bundle", folder, store, kept)
        print(
            f"train: {result['train']['total_seconds']:.1f} s in all, GPU {result['train']['gpu_mean_use']}"
        )
    if "monitor" in parts and bundle is not None:
        result["monitor"] = part_monitor(args, bundle, conversations, gpu)
    if "eval" in parts:
        result["eval"] = part_eval(args, folder, train, dev, gpu)
        ev = result["eval"]
        print(f"eval: exit {ev['returncode']}, {ev['wall_seconds']:.1f} s, GPU busy {ev['gpu_busy_share']}")
    line = json.dumps(result)
    print(line)
    if args.out:
        args.out.write_text(line)


if __name__ == "__main__":
    main()
