"""The monitor's scorer in a process of its own (harness/monitor/_engine.py, issue 25), on the
embedded model and a bundle of untrained probes:

- it decides as the scorer in threads does: the same scores (to the forward pass's float tolerance),
  the same cut flag, the same refusal of a conversation the chat template rejects; and it stops with
  the monitor, exit code 0;
- a scorer process that dies makes every later check a 503 that says so, and /healthz 503, instead
  of a hang;
- a server killed with SIGKILL leaves no scorer process behind (it would hold the GPU's memory).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest
from ctd_cli import free_port
from monitor_bundle import write_untrained_bundle
from monitor_run import serve, stop

from harness import InputError
from harness.monitor import Monitor

# The forward pass batched with padding or alone (tests/harness/test_monitor_scorer.py says why).
TOLERANCE = 1e-4
HUGE = [{"role": ("user", "assistant")[i % 2], "content": f"message {i}"} for i in range(400)]
REJECTED = [{"role": "user", "content": None}]  # the template cannot render it
CONVERSATIONS = ["a short question", HUGE, "is this fine?", REJECTED, [{"role": "user", "content": "hi"}]]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_untrained_bundle(tmp_path_factory.mktemp("engine") / "bundle")


async def _outcomes(monitor: Monitor) -> list[object]:
    return list(await asyncio.gather(*(monitor.check(c) for c in CONVERSATIONS), return_exceptions=True))


def _scorer_pid(server: int) -> int:
    """The server's scorer process (multiprocessing's resource tracker is its other child)."""
    (child,) = [
        p for p in psutil.Process(server).children() if "resource_tracker" not in " ".join(p.cmdline())
    ]
    return child.pid


def test_a_scorer_process_decides_as_the_threads_do_and_stops_with_the_monitor(bundle: Path) -> None:
    async def main() -> tuple[list[object], list[object], int | None, str]:
        threads = await Monitor.load(bundle, expert=False, scorer_process=False)
        try:
            by_threads = await _outcomes(threads)
        finally:
            await threads.aclose()
        process = await Monitor.load(bundle, expert=False, scorer_process=True)
        child = process.scorer._process  # type: ignore[union-attr]
        try:
            by_process = await _outcomes(process)
            where = process.scorer.where
        finally:
            await process.aclose()
        return by_threads, by_process, child.exitcode, where

    by_threads, by_process, exitcode, where = asyncio.run(main())
    assert "its own" in where and exitcode == 0
    for ours, theirs in zip(by_threads, by_process, strict=True):
        if isinstance(ours, BaseException):
            assert isinstance(ours, InputError) and isinstance(theirs, InputError), (ours, theirs)
            assert str(ours) == str(theirs) and "chat template" in str(ours)
            continue
        assert not isinstance(theirs, BaseException), theirs
        assert ours.truncated == theirs.truncated  # type: ignore[attr-defined]
        assert abs(ours.probe - theirs.probe) < TOLERANCE and abs(ours.dv - theirs.dv) < TOLERANCE  # type: ignore[attr-defined]
    assert by_threads[1].truncated and not by_threads[0].truncated  # type: ignore[attr-defined]


def test_a_dead_scorer_process_is_a_503_that_says_so(bundle: Path, tmp_path: Path) -> None:
    port = free_port()
    server = serve(bundle, port, "--no-expert", "--scorer-process", cwd=tmp_path, env={})
    url = f"http://127.0.0.1:{port}"
    try:
        assert httpx.post(f"{url}/v1/check", json={"input": "hello"}, timeout=60).status_code == 200
        os.kill(_scorer_pid(server.pid), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (health := httpx.get(f"{url}/healthz", timeout=10)).status_code == 200:
            assert time.monotonic() < deadline, "/healthz never noticed"
            time.sleep(0.2)
        answer = httpx.post(f"{url}/v1/check", json={"input": "hello again"}, timeout=30)
    finally:
        stop(server)
    _, stderr = server.communicate()
    assert health.status_code == 503 and "scorer process ended" in health.json()["scorer"], health.text
    assert answer.status_code == 503 and answer.headers["retry-after"], answer.text
    assert re.fullmatch(
        r"the scorer process ended \(exit code -9\); restart the monitor", answer.json()["error"]
    )
    assert "scoring in a process of its own" in stderr and stderr.count("scorer process ended") == 1, stderr


def test_a_killed_server_leaves_no_scorer_process(bundle: Path, tmp_path: Path) -> None:
    port = free_port()
    server = serve(bundle, port, "--no-expert", "--scorer-process", cwd=tmp_path, env={})
    try:
        child = psutil.Process(_scorer_pid(server.pid))
        server.kill()  # SIGKILL: no shutdown code runs in the server
        server.wait(30)
        child.wait(30)  # psutil.TimeoutExpired if it outlived its server
    finally:
        stop(server)
