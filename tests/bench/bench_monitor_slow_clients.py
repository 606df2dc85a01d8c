"""Slow clients against `ctd monitor serve` (run by hand, not in CI; 127.0.0.1 only):

    python tests/bench/bench_monitor_slow_clients.py [--baseline SRC] [--clients 300]

The server runs with an open-file limit of 256 (the issue saw 1,100 slow clients exhaust 1,024)
on a bundle of untrained probes over the embedded model (tests/monitor_bundle.py). `--clients`
connections open and stay silent or send half a request head; then /healthz and one check are
timed (10 s timeout each), the slow connections the server has closed are counted, and SIGTERM
is timed to exit (a body stalled mid-request is left open). With `--baseline SRC` (a source tree
such as `git archive main | tar -x -C SRC`) the same is run against that code first, side by side.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # first: tests/experts/ must not shadow experts
from ctd_cli import CTD, free_port
from monitor_bundle import write_untrained_bundle

FILE_LIMIT = 256
REPOSITORY = Path(__file__).resolve().parents[2]


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))


def _timed(call: object) -> str:
    started = time.monotonic()
    try:
        outcome = str(call().status_code)  # type: ignore[operator]
    except httpx.HTTPError as error:
        outcome = type(error).__name__
    return f"{outcome} after {time.monotonic() - started:.2f} s"


def measure(source: Path, bundle: Path, clients: int, options: list[str], scratch: Path) -> dict[str, str]:
    port = free_port()
    output = (scratch / f"server-{port}.txt").open("w")
    server = subprocess.Popen(
        [sys.executable, "-c", CTD, "monitor", "serve", str(bundle), "--no-expert", "--port", str(port),
         "--log", str(scratch / f"decisions-{port}.jsonl"), *options],
        cwd=scratch, env={**os.environ, "PYTHONPATH": str(source)}, stdout=output, stderr=subprocess.STDOUT,
        preexec_fn=_limited,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if server.poll() is not None:
                output.flush()
                raise SystemExit(f"the server exited: {Path(output.name).read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        slow = []
        for i in range(clients):
            client = socket.create_connection(("127.0.0.1", port), timeout=10)
            if i % 2:
                client.sendall(b"POST /v1/check HTTP/1.1\r\nhost: x\r\ncontent-le")
            slow.append(client)
        row = {
            "healthz": _timed(lambda: httpx.get(f"{url}/healthz", timeout=10)),
            "check": _timed(lambda: httpx.post(f"{url}/v1/check", json={"input": "hi"}, timeout=10)),
        }
        closed = 0
        for client in slow:
            client.settimeout(0.01)
            try:
                data = client.recv(100)
                closed += data == b"" or data.startswith(b"HTTP/1.1 503")
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed += 1
        row["closed by the server"] = f"{closed} of {clients}"
        stalled = socket.create_connection(("127.0.0.1", port), timeout=10)
        stalled.sendall(b"POST /v1/check HTTP/1.1\r\nhost: x\r\ncontent-length: 50\r\n\r\n{")
        time.sleep(0.5)
        started = time.monotonic()
        server.terminate()
        try:
            server.wait(60)
            row["SIGTERM to exit"] = f"{time.monotonic() - started:.1f} s"
        except subprocess.TimeoutExpired:
            row["SIGTERM to exit"] = "over 60 s (killed)"
        for client in [*slow, stalled]:
            client.close()
        return row
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
        output.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="Another source tree to measure first.")
    parser.add_argument("--clients", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        bundle = write_untrained_bundle(scratch / "bundle")
        runs = [("this code (--max-connections 60)", REPOSITORY, ["--max-connections", "60"])]
        if args.baseline is not None:
            runs.insert(0, (f"baseline {args.baseline}", args.baseline, []))
        for name, source, options in runs:
            row = measure(source, bundle, args.clients, options, scratch)
            print(f"{name}: " + "; ".join(f"{key} {value}" for key, value in row.items()), flush=True)


if __name__ == "__main__":
    main()
