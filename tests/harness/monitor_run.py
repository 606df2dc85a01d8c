"""What the `ctd monitor` tests share: the conversations and labels of the tagged test split, a
`ctd monitor serve` process started and stopped, and a replay of conversations through it."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from ctd_cli import start_ctd


def conversations_of(data: Path) -> tuple[list[str], list[object]]:
    rows = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()]
    convs = [json.loads(r["inputs"]) if r["inputs"].startswith("[") else r["inputs"] for r in rows]
    return [r["ids"] for r in rows], convs


def labels_of(data: Path) -> list[int]:
    rows = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()]
    return [int(r["labels"] == "high-stakes") for r in rows]


# These servers get whole splits at once and must answer every check: no load shedding here
# (tests/harness/test_monitor_queue.py tests it).
NO_SHEDDING = ("--max-queue-ms", "600000", "--max-pending", "100000")


def serve(bundle: Path, port: int, *extra: str, cwd: Path, env: dict) -> subprocess.Popen[str]:
    args = ("monitor", "serve", str(bundle), "--port", str(port), *NO_SHEDDING, *extra)
    process = start_ctd(*args, cwd=cwd, env=env)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    process.kill()
    pytest.fail("the monitor did not start")


def stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


async def replay(port: int, conversations: list[object], concurrency: int) -> list[httpx.Response]:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:

        async def one(conversation: object) -> httpx.Response:
            body = {"input": conversation} if isinstance(conversation, str) else {"messages": conversation}
            async with gate:
                return await client.post("/v1/check", json=body)

        return list(await asyncio.gather(*(one(c) for c in conversations)))


def fill(path: Path) -> None:
    """Write to `path` until its disk is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"x" * 1024):
            pass
    except OSError as error:
        assert error.errno == errno.ENOSPC
    finally:
        os.close(fd)
