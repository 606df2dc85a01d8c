"""The monitor's scorer in a process of its own (harness/monitor/_engine.py, issue 25), on the
embedded model and a bundle of untrained probes:

- it decides as the scorer in threads does: the same scores (to the forward pass's float tolerance),
  the same cut flag, the same refusal of a conversation the chat template rejects; and it stops with
  the monitor, exit code 0;
- a scorer process that dies makes the checks a 503 that says so, and /healthz 503, instead of a
  hang, while another process loads the model; then checks are scored again; one that keeps dying
  or cannot be started again stays gone, and says the monitor must be restarted;
- a server killed with SIGKILL, even while its scorer process loads the model, leaves no scorer
  process behind (it would hold the GPU's memory).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
from ctd_cli import free_port, start_ctd
from monitor_bundle import write_untrained_bundle
from monitor_run import serve, stop

from harness import InputError
from harness.monitor import Monitor

# Private: the scorer process's exit code for a lost GPU, and what the monitor says of it.
from harness.monitor._engine import DEVICE_LOST, scorer_ended

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
    (child,) = _children(server)
    return child.pid


def test_a_scorer_process_decides_as_the_threads_do_and_stops_with_the_monitor(bundle: Path) -> None:
    async def main() -> tuple[list[object], list[object], int | None, str]:
        threads = await Monitor.load(bundle, expert=False, scorer_process=False)
        try:
            by_threads = await _outcomes(threads)
        finally:
            await threads.aclose()
        process = await Monitor.load(bundle, expert=False, scorer_process=True)
        child = process.scorer._current._process  # type: ignore[union-attr]
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


def test_a_dead_scorer_process_is_a_503_that_says_so_until_it_is_back(bundle: Path, tmp_path: Path) -> None:
    """A check waiting on the process when it dies answers 503, and so do the checks while another
    process loads the model; then checks are scored again, by the same server."""
    port = free_port()
    server = serve(bundle, port, "--no-expert", "--scorer-process", cwd=tmp_path, env={})
    url = f"http://127.0.0.1:{port}"
    try:
        before = httpx.post(f"{url}/v1/check", json={"input": "hello"}, timeout=60)
        assert before.status_code == 200, before.text
        scorer = _scorer_pid(server.pid)
        os.kill(scorer, signal.SIGSTOP)  # the next check waits on it for sure
        with ThreadPoolExecutor(1) as waiting:
            pending = waiting.submit(httpx.post, f"{url}/v1/check", json={"input": "waits"}, timeout=60)
            time.sleep(1.0)
            assert not pending.done()
            os.kill(scorer, signal.SIGKILL)
            waited = pending.result()
        health = httpx.get(f"{url}/healthz", timeout=10)
        during = httpx.post(f"{url}/v1/check", json={"input": "hello again"}, timeout=30)
        deadline = time.monotonic() + 120
        while httpx.get(f"{url}/healthz", timeout=10).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        after = httpx.post(f"{url}/v1/check", json={"input": "hello"}, timeout=60)
        (again,) = _children(server.pid)
    finally:
        stop(server)
    _, stderr = server.communicate()
    ended = r"the scorer process ended \(exit code -9\); restarting it"
    for answer in (waited, during):
        assert answer.status_code == 503 and int(answer.headers["retry-after"]) >= 1, answer.text
        assert re.fullmatch(ended, answer.json()["error"]), answer.text
    assert health.status_code == 503 and re.fullmatch(ended, health.json()["scorer"]), health.text
    assert after.status_code == 200, after.text
    assert again.pid != scorer
    assert after.json()["probe"] == before.json()["probe"], (before.text, after.text)
    assert stderr.count("scorer process ended") == 1 and stderr.count("scorer process is back") == 1, stderr


def test_a_scorer_process_that_keeps_dying_or_cannot_start_is_given_up(bundle: Path) -> None:
    """Past its restarts (here one) in the window, or when a new process fails to load or is not
    ready in time (stopped while it loads, as a wedged GPU would hold it: it is killed and
    reaped), the scorer stays gone and says that the monitor must be restarted."""

    async def main() -> tuple[str | None, str | None, list[str | None], str]:
        monitor = await Monitor.load(bundle, expert=False, scorer_process=True)
        scorer = monitor.scorer
        try:
            # Private: the restart budget, the running process and how a new one is started.
            scorer._restarts = 1  # type: ignore[union-attr]
            first = scorer._current  # type: ignore[union-attr]
            os.kill(first._process.pid, signal.SIGKILL)
            while scorer._current is first:  # until another process is ready
                await asyncio.sleep(0.1)
            back = scorer.gone
            os.kill(scorer._current._process.pid, signal.SIGKILL)  # type: ignore[union-attr]
            while scorer.gone is None:
                await asyncio.sleep(0.1)
            kept_dying = scorer.gone
            refused = "(no refusal)"
            try:
                await monitor.check("hello")
            except Exception as error:
                refused = str(error)
        finally:
            await monitor.aclose()

        async def cannot_start() -> object:
            raise RuntimeError("CUDA out of memory")

        failed: list[str | None] = []
        for start in (cannot_start, None):  # None: the real start, its process stopped as it loads
            failing = await Monitor.load(bundle, expert=False, scorer_process=True)
            try:
                failing.scorer._start = start or failing.scorer._start  # type: ignore[union-attr]
                failing.scorer._start_timeout = 3.0  # type: ignore[union-attr]
                known = {child.pid for child in _children(os.getpid())}
                os.kill(failing.scorer._current._process.pid, signal.SIGKILL)  # type: ignore[union-attr]
                stopped = None
                while start is None and stopped is None:  # a wedged GPU: never ready
                    new = [child for child in _children(os.getpid()) if child.pid not in known]
                    if new:
                        (stopped,) = new
                        stopped.suspend()
                    await asyncio.sleep(0.01)
                while "restart the monitor" not in (failing.scorer.gone or ""):
                    await asyncio.sleep(0.1)
                failed.append(failing.scorer.gone)
                deadline = time.monotonic() + 10
                while stopped is not None and psutil.pid_exists(stopped.pid) and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)  # killed, and reaped off the event loop
                assert stopped is None or not psutil.pid_exists(stopped.pid)
            finally:
                await failing.aclose()
        return back, kept_dying, failed, refused

    back, kept_dying, failed, refused = asyncio.run(asyncio.wait_for(main(), 180))
    assert back is None
    assert kept_dying == "the scorer process ended (exit code -9), 2 times in 10 minutes; restart the monitor"
    assert refused == kept_dying
    assert failed == [
        "the scorer process ended (exit code -9) and could not be started again (CUDA out of memory); "
        "restart the monitor",
        "the scorer process ended (exit code -9) and was not ready again within 3 s; restart the monitor",
    ]


def test_a_server_killed_while_its_scorer_loads_leaves_none(tmp_path: Path, bundle: Path) -> None:
    """SIGKILL to the server before its scorer process has even loaded the model: the process sees
    its parent go and exits at once (it would hold the GPU's memory)."""
    port = free_port()
    server = start_ctd(
        "monitor", "serve", str(bundle), "--no-expert", "--scorer-process", "--port", str(port), cwd=tmp_path
    )
    try:
        deadline = time.monotonic() + 60
        while not _children(server.pid):
            assert server.poll() is None and time.monotonic() < deadline, "no scorer process started"
            time.sleep(0.05)
        child = psutil.Process(_scorer_pid(server.pid))
        server.kill()  # SIGKILL: no shutdown code runs in the server
        server.wait(30)
        # At once, not once the model has loaded and its "ready" finds the pipe closed (seconds).
        _gone(child, within=3)
    finally:
        if server.poll() is None:
            server.kill()
        _, stderr = server.communicate()
    assert "ready:" not in stderr, "killed after the model loaded: not the case this tests"


def _children(server: int) -> list[psutil.Process]:
    """The server's child processes but multiprocessing's resource tracker."""
    out = []
    for child in psutil.Process(server).children():
        try:
            if "resource_tracker" not in " ".join(child.cmdline()):
                out.append(child)
        except psutil.NoSuchProcess:
            continue
    return out


def _gone(process: psutil.Process, *, within: float) -> None:
    """Wait until `process` has exited: no longer there, or a zombie (its reaper is init's business)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.1)
    pytest.fail(f"the scorer process {process.pid} outlived its server by {within} s")


_LOST_GPU = """
import queue, sys
# Private: the scorer process's forward thread, run here with a stand-in for a failing GPU.
from harness.monitor._scorer_process import _forward_loop
from harness.monitor._scorer import Tokens

class FailingGPU:
    def score(self, batch):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def device_answers(self):
        return sys.argv[1] == "answers"

batches = queue.Queue()
for number in (1, 2):
    batches.put((number, ([Tokens((1, 2), False)], 0.0)))
batches.put(None)
_forward_loop(FailingGPU(), batches, lambda reply: print(reply[:2], flush=True))
"""


@pytest.mark.parametrize("device", ["answers", "lost"])
def test_a_failed_pass_ends_the_scorer_process_only_when_the_gpu_no_longer_answers(device: str) -> None:
    """A CPU cannot lose a CUDA context, so the failing pass and the check after it are stood in
    for: a pass that fails on a GPU that still answers fails its batch alone; one after which it
    does not answer fails its batch, then ends the process with DEVICE_LOST, which the monitor
    says in its own words, and a `RestartingScorer` starts another (as after a SIGKILL, above)."""
    done = subprocess.run(
        [sys.executable, "-c", _LOST_GPU, device], capture_output=True, text=True, timeout=120
    )
    replies = done.stdout.splitlines()
    if device == "answers":
        assert (done.returncode, replies) == (0, ["(1, 'failed')", "(2, 'failed')"]), done.stderr
    else:
        assert (done.returncode, replies) == (DEVICE_LOST, ["(1, 'failed')"]), done.stderr
        assert "the GPU no longer answers in this process; ending it" in done.stderr
        assert scorer_ended(done.returncode) == (
            "the scorer process ended (exit code 3: its GPU stopped answering after a failed pass)"
        )


def test_the_device_check_passes_on_the_cpu() -> None:
    import torch

    from probes import device_answers

    assert device_answers({torch.device("cpu")})
