"""A local server a run starts is its own: ready only when the process it started answers (a
neighbour answering on the port never counts), moved to a free port when the expert's is taken,
and reached at that port while the expert's identity, and so the cache key, stays its URL. Stand-in
servers that only list models: no model is loaded, each test takes well under a second."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ctd_cli import free_port
from models_server import serving

import experts
from experts import ConfigError, ExpertClient, Item

# Private: the server module and the port holders it looks for, unit-tested.
from experts import _serve as serve
from experts._ports import Holder, descendants, port_holder

SMOLLM2 = experts.BUILTIN_EXPERTS["smollm2"]
MODELS_SERVER = str(Path(__file__).with_name("models_server.py"))
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]  # alive, listens on nothing
needs_proc = pytest.mark.skipif(
    not Path("/proc/net/tcp").exists(), reason="who listens on a port is read from /proc (Linux)"
)


def _spec(port: int) -> experts.ExpertSpec:
    return dataclasses.replace(SMOLLM2, base_urls=(f"http://127.0.0.1:{port}/v1",))


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Children a test starts, killed after it whatever happened."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for child in started:
        child.kill()
        child.wait()


def _waiting_on(
    port: int, command: list[str], children: list[subprocess.Popen[bytes]], tmp_path: Path
) -> serve.LocalServer:
    """A LocalServer for `port` whose child (`command`) is already running."""
    server = serve.LocalServer(
        _spec(port), gguf=tmp_path / "m.gguf", log=tmp_path / "server.log", ready_timeout=5
    )
    log = server.log
    assert log is not None
    with log.open("ab") as output:
        server.process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    children.append(server.process)
    return server


@needs_proc
def test_a_neighbour_answering_on_the_port_is_not_the_child_being_ready(
    children: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    port = free_port()
    with serving(port):  # another run's server, answering GET /models on the port
        server = _waiting_on(port, SLEEPER, children, tmp_path)
        started = time.monotonic()
        with pytest.raises(
            ConfigError, match=f"port {port} on 127.0.0.1 is taken by another process"
        ) as raised:
            server.wait_until_ready()
    assert isinstance(raised.value, serve.PortTaken)
    assert time.monotonic() - started < 3  # seen at once, not after the ready timeout


def test_a_child_that_exits_while_a_neighbour_answers_is_noticed_at_once(
    children: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """A server that could not bind the port (the neighbour's) exits: that is the port taken,
    with the child's exit code, and never the neighbour's answer counted as the child's."""
    port = free_port()
    with serving(port):
        server = _waiting_on(port, [sys.executable, "-c", "raise SystemExit(1)"], children, tmp_path)
        assert server.process is not None
        server.process.wait()
        with pytest.raises(ConfigError, match=r"taken by another process \(the server exited with code 1\)"):
            server.wait_until_ready()


def test_a_child_that_fails_alone_is_one_line_with_its_last_output(
    children: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    crash = [sys.executable, "-c", "print('error: no such model', flush=True); raise SystemExit(3)"]
    server = _waiting_on(free_port(), crash, children, tmp_path)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="exited with code 3: error: no such model") as raised:
        server.wait_until_ready()
    assert not isinstance(raised.value, serve.PortTaken)
    assert time.monotonic() - started < 3


@needs_proc
def test_the_child_listening_itself_is_ready_and_owns_the_port(
    children: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    port = free_port()
    server = _waiting_on(port, [sys.executable, MODELS_SERVER, str(port)], children, tmp_path)
    server.wait_until_ready()
    assert server.process is not None
    assert port_holder(port, server.process.pid) is Holder.OWN
    sibling = subprocess.Popen(SLEEPER)
    children.append(sibling)
    assert port_holder(port, sibling.pid) is Holder.OTHER
    assert port_holder(free_port(), sibling.pid) is Holder.NONE


def test_without_proc_an_alive_child_and_an_answer_count_as_ready(
    children: list[subprocess.Popen[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off Linux who listens cannot be read: the check falls back to the child being alive and
    the port answering (the run's port was free just before the child started)."""
    port = free_port()
    assert port_holder(port, 1, proc=tmp_path) is Holder.UNKNOWN
    monkeypatch.setattr(serve, "port_holder", lambda port, pid: Holder.UNKNOWN)
    with serving(port):
        _waiting_on(port, SLEEPER, children, tmp_path).wait_until_ready()


def _models_server_command(spec: experts.ExpertSpec, *, port: int, **weights: object) -> list[str]:
    return [sys.executable, MODELS_SERVER, str(port)]


def test_a_taken_port_is_one_error_or_a_move_to_a_free_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serve, "server_command", _models_server_command)
    monkeypatch.setattr(serve, "_available", lambda command: None)
    port = free_port()
    with serving(port):
        asked = serve.LocalServer(_spec(port), gguf=tmp_path / "m.gguf", ready_timeout=5)
        with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is taken"):
            asked.start()  # `ctd experts serve`: that port or nothing, and nothing started
        assert asked.process is None
        with serve.LocalServer(
            _spec(port),
            gguf=tmp_path / "m.gguf",
            log=tmp_path / "own.log",
            ready_timeout=5,
            move_if_taken=True,
        ) as own:
            assert own.port != port and own.url == f"http://127.0.0.1:{own.port}/v1"
            assert own.process is not None
            if Path("/proc/net/tcp").exists():
                assert port_holder(own.port, own.process.pid) is Holder.OWN
            assert f"serving on port {own.port}" in (tmp_path / "own.log").read_text()  # said in its log


def test_a_run_on_its_own_port_keeps_the_expert_identity_and_cache_key() -> None:
    """Requests go to where the run's server listens; the key stays the registry's URL, so runs
    on different ports share answers and caches written before stay valid."""
    routed = dataclasses.replace(SMOLLM2, served_at=("http://127.0.0.1:40123/v1",))
    assert routed.request_urls() == ("http://127.0.0.1:40123/v1",)
    assert SMOLLM2.request_urls() == SMOLLM2.resolved_urls() == ("http://127.0.0.1:8089/v1",)
    assert routed.endpoint_id() == SMOLLM2.endpoint_id() == "http://127.0.0.1:8089/v1"
    item = Item("bread", "How long should I let bread dough rise?")
    assert (
        ExpertClient(routed, cache=None).request_for(item)[1]
        == ExpertClient(SMOLLM2, cache=None).request_for(item)[1]
    )
    with pytest.raises(experts.InvalidSetting, match="served_at"):
        dataclasses.replace(SMOLLM2, served_at=("http://u:secret@127.0.0.1:1/v1",))

    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.url.host}:{request.url.port}")
        return httpx.Response(503)

    transport = httpx.MockTransport(answer)
    asyncio.run(
        experts.check_endpoint(routed, transport=transport, patience=experts.RetryPolicy(max_attempts=1))
    )
    asyncio.run(
        ExpertClient(
            dataclasses.replace(routed, retry=experts.RetryPolicy(max_attempts=1)),
            cache=None,
            transport=transport,
        ).score([item])
    )
    assert seen and set(seen) == {"127.0.0.1:40123"}


@needs_proc
def test_a_worker_left_by_a_server_that_died_is_killed_by_stop(
    children: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """The server starts a worker (as vLLM's API server starts its engine), answers, then dies
    by SIGKILL: the orphaned worker is out of its tree, and `stop` still ends it."""
    port = free_port()
    with_worker = (
        "import runpy, subprocess, sys; subprocess.Popen(['sleep', '600']); "
        f"sys.argv = [{MODELS_SERVER!r}, '{port}']; runpy.run_path({MODELS_SERVER!r}, run_name='__main__')"
    )
    server = _waiting_on(port, [sys.executable, "-c", with_worker], children, tmp_path)
    server.wait_until_ready()
    assert server.process is not None
    [worker] = descendants(server.process.pid)
    server.process.kill()
    server.process.wait()
    assert serve._start_time(worker) is not None  # orphaned, alive
    server.stop()
    deadline = time.monotonic() + 5
    while serve._start_time(worker) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert serve._start_time(worker) is None


@needs_proc
def test_a_pid_listed_with_another_start_time_is_never_signalled(
    children: list[subprocess.Popen[bytes]],
) -> None:
    """A pid reused by someone else's process (its start time differs) survives the reaper."""
    other = subprocess.Popen(SLEEPER)
    children.append(other)
    start = serve._start_time(other.pid)
    assert start is not None
    serve._reap({other.pid: start - 1}, grace=0.1)
    with pytest.raises(subprocess.TimeoutExpired):  # a SIGKILL would have ended it by then
        other.wait(timeout=0.5)
