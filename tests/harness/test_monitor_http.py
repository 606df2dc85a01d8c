"""`ctd monitor serve` under ordinary abuse, on a real bundle (untrained probes over the embedded
model, see tests/monitor_bundle.py) served by the real command in a subprocess:

- slow clients (idle, or trickling a request head) are closed after --head-timeout and beyond
  --max-connections, while normal requests are still answered within seconds;
- malformed bodies over HTTP (a 10,000-digit integer, deep nesting, a lone surrogate) are 4xx;
- a bearer token from an environment variable guards the POSTs and never shows in any output;
- /healthz shows the bundle's name, never its absolute path; SIGTERM stops the server in bounded time;
- once it accepts connections it says so in one "ready: listening on URL" line, and that URL answers;
- every bad option and every start-up failure is one line and exit code 2, before the model loads.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ctd_cli import CTD, assert_one_line_error, free_port, run_ctd, start_ctd
from monitor_bundle import seal, write_untrained_bundle
from monitor_run import stop

from harness.monitor import MAX_HEAD_BYTES

TOKEN = "t0ken-for-tests-8f3a"  # given to the server through the environment
TOKEN_ENV = {"CTD_TEST_MONITOR_TOKEN": TOKEN}
HEAD_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 4.0  # far beyond the pipelined test's trickle of 1.25 head timeouts, on a loaded machine too
MAX_CONNECTIONS = 64  # with the accept burst (128) and the reserve (64): exactly FILE_LIMIT
FILE_LIMIT = 256
SLOW_CLIENTS = 300
ANSWER_WITHIN_S = 5.0  # a normal request under the slow clients


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_untrained_bundle(tmp_path_factory.mktemp("http") / "demo-bundle")


def _wait_ready(process: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    process.kill()
    pytest.fail("the monitor did not start")


def _stop(process: subprocess.Popen) -> tuple[str, str]:
    process.terminate()
    try:
        return process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.communicate(timeout=10)


def _few_file_descriptors() -> None:
    """In the server before exec: an open-file limit that SLOW_CLIENTS unguarded connections
    would exhaust (the issue saw 1,100 slow clients exhaust a limit of 1,024)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))


@pytest.fixture(scope="module")
def served(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The bundle served with a token, a 1 s head timeout, a cap of 64 connections and an
    open-file limit of 256."""
    port = free_port()
    folder = tmp_path_factory.mktemp("log")
    log = folder / "decisions.jsonl"
    output = (folder / "server-output.txt").open("w")  # a file, not a pipe: nothing blocks on it
    process = subprocess.Popen(
        [sys.executable, "-c", CTD, "monitor", "serve", str(bundle), "--no-expert", "--port", str(port),
         "--log", str(log), "--auth-token-env", "CTD_TEST_MONITOR_TOKEN",
         "--head-timeout", str(HEAD_TIMEOUT_S), "--body-timeout", str(BODY_TIMEOUT_S),
         "--max-connections", str(MAX_CONNECTIONS)],
        cwd=bundle.parent, env={**os.environ, **TOKEN_ENV}, stdout=output, stderr=subprocess.STDOUT,
        preexec_fn=_few_file_descriptors,
    )  # fmt: skip
    _wait_ready(process, port)
    outputs: dict = {"url": f"http://127.0.0.1:{port}", "port": port, "log": log}
    try:
        yield outputs
    finally:
        _stop(process)
        output.close()
        # The token reached nothing the server wrote: its output, its decision log.
        assert TOKEN not in (folder / "server-output.txt").read_text() + log.read_text()


AUTH = {"authorization": f"Bearer {TOKEN}"}


def _slow_clients(port: int, count: int) -> list[socket.socket]:
    """`count` connections: even ones send nothing, odd ones the start of a request head."""
    clients = []
    for i in range(count):
        client = socket.create_connection(("127.0.0.1", port), timeout=10)
        if i % 2:
            client.sendall(b"POST /v1/check HTTP/1.1\r\nhost: x\r\ncontent-le")
        clients.append(client)
    return clients


def _closed_by_server(client: socket.socket, within: float) -> bool:
    """True when the server closed the connection (EOF, after any 503 it wrote) within `within` s."""
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            client.settimeout(max(0.05, deadline - time.monotonic()))
            data = client.recv(4096)
            if not data:
                return True
            assert data.startswith(b"HTTP/1.1 503"), data  # refused at once: then closed
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return False


def test_slow_clients_are_closed_and_normal_requests_are_still_answered(served: dict) -> None:
    clients = _slow_clients(served["port"], SLOW_CLIENTS)
    try:
        started = time.monotonic()
        health = httpx.get(f"{served['url']}/healthz", timeout=ANSWER_WITHIN_S)
        check = httpx.post(
            f"{served['url']}/v1/check",
            json={"input": "is this fine?"},
            headers=AUTH,
            timeout=ANSWER_WITHIN_S,
        )
        answered_in = time.monotonic() - started
        # A trickler: a byte now and then never completes a head, so the timeout still applies
        # (the newest half-head client; an older one may have been closed already to make room).
        with contextlib.suppress(ConnectionError):
            clients[-1].sendall(b"n")
        closed = [_closed_by_server(c, within=HEAD_TIMEOUT_S + 5) for c in clients]
    finally:
        for client in clients:
            client.close()
    assert health.status_code == 200 and check.status_code == 200, (health.text, check.text)
    assert answered_in < ANSWER_WITHIN_S
    assert all(closed), f"{closed.count(False)} of {len(clients)} slow connections still open"
    # ... and the server is still whole afterwards.
    assert httpx.get(f"{served['url']}/healthz", timeout=ANSWER_WITHIN_S).status_code == 200


def test_a_body_that_stalls_is_a_408_after_the_body_timeout(served: dict) -> None:
    with socket.create_connection(("127.0.0.1", served["port"]), timeout=10) as client:
        client.sendall(
            f"POST /v1/check HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n"
            'content-type: application/json\r\ncontent-length: 100\r\n\r\n{"input": '.encode()
        )
        started = time.monotonic()
        answer = client.recv(4096)
        waited = time.monotonic() - started
        while not answer.endswith(b"}") and (more := client.recv(4096)):  # the body may come apart
            answer += more
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert f"did not arrive within {BODY_TIMEOUT_S:g} s".encode() in answer
    assert BODY_TIMEOUT_S - 0.5 < waited < BODY_TIMEOUT_S + 5


def _until_closed(client: socket.socket, within: float) -> tuple[bytes, bool, float]:
    """Everything `client` receives until the server closes it or `within` s pass; whether it
    closed; and when the last data came (time.monotonic, 0 if none)."""
    received, last_at = b"", 0.0
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        client.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            data = client.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return received, True, last_at
        if not data:
            return received, True, last_at
        received, last_at = received + data, time.monotonic()
    return received, False, last_at


def test_a_pipelined_request_is_served_past_the_head_timeout_and_an_idle_connection_is_then_closed(
    served: dict,
) -> None:
    """The head timer starts again when a response completes; a request already waiting behind it
    (pipelined) has its head in, so the timer stops although its body takes longer than the head
    timeout. With nothing more sent, the connection is closed after the head timeout."""
    body = b'{"input": "a pipelined check"}'
    with socket.create_connection(("127.0.0.1", served["port"]), timeout=10) as client:
        client.sendall(
            b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
            + f"POST /v1/check HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            + body[:5]
        )
        started = time.monotonic()
        rest = body[5:]
        for byte in rest:  # over 1.25 head timeouts, well within the body timeout (4 head timeouts)
            time.sleep(1.25 * HEAD_TIMEOUT_S / len(rest))
            client.sendall(bytes([byte]))
        sent = time.monotonic()
        received, closed, answered_at = _until_closed(client, within=ANSWER_WITHIN_S + HEAD_TIMEOUT_S + 5)
        # Closed by the head timer after the second answer, not by uvicorn's 5 s keep-alive: both
        # count from the answer (was from the last byte sent, so a slow answer ate the margin).
        assert sent - started > HEAD_TIMEOUT_S and time.monotonic() - answered_at < HEAD_TIMEOUT_S + 3
    answers = re.findall(rb"HTTP/1\.1 \d{3} [^\r]*", received)  # a body is not followed by CRLF
    assert answers == [b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK"], received
    assert closed


def test_a_request_head_without_end_is_a_431_and_closed(served: dict) -> None:
    """httptools buffers a head however long it grows (h11 stopped at 16 KiB): the guard answers
    431 and closes once a head passes MAX_HEAD_BYTES, long before the head timeout."""
    piece = b"a" * 16 * 1024
    with socket.create_connection(("127.0.0.1", served["port"]), timeout=10) as client:
        client.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-long: ")
        sent = 0
        # In pieces, stopping once the server answers: bytes it never reads would reset the
        # connection and lose its answer.
        while sent < 40 * len(piece) and not select.select([client], [], [], 0.05)[0]:
            client.sendall(piece)
            sent += len(piece)
        received, closed, _ = _until_closed(client, within=HEAD_TIMEOUT_S / 2)
    assert received.startswith(b"HTTP/1.1 431 "), (sent, received[:200])
    assert b"request head over 65536 bytes" in received and closed
    assert MAX_HEAD_BYTES < sent <= MAX_HEAD_BYTES + 16 * len(piece)
    assert httpx.get(f"{served['url']}/healthz", timeout=ANSWER_WITHIN_S).status_code == 200


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        pytest.param(b'{"input": ' + b"9" * 10_000 + b"}", "integer string conversion", id="10000-digits"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, "nested too deeply", id="deep"),
        pytest.param(b'{"input": "\\ud800 lone"}', "lone surrogate", id="surrogate-input"),
        pytest.param(
            b'{"messages": [{"role": "user", "content": "\\udfff"}]}',
            "messages[0].content",
            id="surrogate-msg",
        ),
        pytest.param(
            b'{"messages": [{"role": "user", "content": "hi", "name": 5}]}',
            "messages[0].name",
            id="name-type",
        ),
        pytest.param(b'{"request_id": ["x"], "label": 1}', "exactly one of", id="feedback-body"),
    ],
)
def test_malformed_bodies_over_http_are_one_line_4xx(served: dict, body: bytes, fragment: str) -> None:
    answer = httpx.post(
        f"{served['url']}/v1/check",
        content=body,
        headers={**AUTH, "content-type": "application/json"},
        timeout=30,
    )
    assert 400 <= answer.status_code < 500, answer.text
    error = answer.json()["error"]
    assert fragment in error and "\n" not in error and "Traceback" not in error


def test_feedback_with_a_lone_surrogate_id_is_a_400(served: dict) -> None:
    answer = httpx.post(
        f"{served['url']}/v1/feedback",
        content=b'{"request_id": "\\ud800", "label": 1}',
        headers={**AUTH, "content-type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == 400 and "lone surrogate" in answer.json()["error"]


def test_the_bearer_token_guards_the_posts_and_never_shows(served: dict) -> None:
    url = served["url"]
    for headers in (
        {},
        {"authorization": "Bearer wrong"},
        {"authorization": TOKEN},
        {"authorization": "Basic x"},
    ):
        for path, body in (("/v1/check", {"input": "hi"}), ("/v1/feedback", {"request_id": "a", "label": 1})):
            answer = httpx.post(f"{url}{path}", json=body, headers=headers, timeout=30)
            assert answer.status_code == 401, (path, headers, answer.text)
            assert answer.headers["www-authenticate"] == "Bearer" and TOKEN not in answer.text
    checked = httpx.post(f"{url}/v1/check", json={"input": "hi"}, headers=AUTH, timeout=30)
    assert checked.status_code == 200
    fed = httpx.post(
        f"{url}/v1/feedback",
        json={"request_id": checked.json()["request_id"], "label": 0},
        headers=AUTH,
        timeout=30,
    )
    assert fed.status_code == 200
    for path in ("/healthz", "/metrics"):  # open: probes and scrapers carry no token
        answer = httpx.get(f"{url}{path}", timeout=30)
        assert answer.status_code == 200 and TOKEN not in answer.text


def test_healthz_names_the_bundle_without_its_absolute_path(served: dict, bundle: Path) -> None:
    health = httpx.get(f"{served['url']}/healthz", timeout=30).json()
    assert health["bundle"] == bundle.name and len(health["bundle_id"]) == 12
    assert str(bundle.parent) not in str(health) and "/" not in health["bundle"]


def test_serve_says_ready_once_it_accepts_connections(bundle: Path, tmp_path: Path) -> None:
    """No polling of /healthz needed: stderr's "ready: listening on URL" line comes once the server
    accepts connections, and the URL it names answers the very next request."""
    port = free_port()
    process = start_ctd(
        "monitor", "serve", str(bundle), "--no-expert", "--port", str(port),
        "--log", str(tmp_path / "d.jsonl"), cwd=tmp_path,
    )  # fmt: skip
    assert process.stderr is not None and process.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stderr], daemon=True)
    reader.start()
    before: list[str] = []  # what stderr said before the ready line
    ready = ""
    try:
        deadline = time.monotonic() + 300
        while not ready and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                assert process.poll() is None, before
                continue
            if "ready: listening on " in line:
                ready = line
            else:
                before.append(line)
        assert ready, before
        url = ready.rsplit("ready: listening on ", 1)[1].strip()
        health = httpx.get(f"{url}/healthz", timeout=10)  # once, no retry
    finally:
        stop(process)
    assert url == f"http://127.0.0.1:{port}" and health.status_code == 200, (url, health.text)
    assert ready == f"ctd monitor: serving {bundle.name}; ready: listening on {url}\n"
    assert before == [], before
    reader.join(10)  # the rest of stderr, to the exit
    rest = list(lines.queue)
    assert not any("ready:" in line for line in rest), rest  # said once
    assert process.stdout.read() == ""  # stdout is for results: nothing here


def test_sighup_reopens_the_log_and_sigterm_stops_the_server_within_a_bounded_time(
    bundle: Path, tmp_path: Path
) -> None:
    """SIGHUP after the log was renamed away (log rotation) starts a new log and the server goes on
    (it used to die: SIGHUP's default action); SIGTERM then stops it within the bound."""
    port = free_port()
    log = tmp_path / "d.jsonl"
    process = start_ctd(
        "monitor", "serve", str(bundle), "--no-expert", "--port", str(port),
        "--log", str(log), cwd=tmp_path,
    )  # fmt: skip
    try:
        _wait_ready(process, port)
        url = f"http://127.0.0.1:{port}/v1/check"
        for n in range(3):
            assert httpx.post(url, json={"input": f"before {n}"}, timeout=30).status_code == 200
        log.rename(tmp_path / "d.jsonl.1")
        process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while not log.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for n in range(2):
            assert httpx.post(url, json={"input": f"after {n}"}, timeout=30).status_code == 200
        rotated = [json.loads(line) for line in (tmp_path / "d.jsonl.1").read_text().splitlines()]
        current = [json.loads(line) for line in log.read_text().splitlines()]
        assert [r["event"] for r in rotated] == ["decision"] * 3 and len(current) == 2, (rotated, current)
        # A request whose body stalls: the server is mid-request when SIGTERM comes.
        stalled = socket.create_connection(("127.0.0.1", port), timeout=5)
        stalled.sendall(
            b"POST /v1/check HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b'content-length: 100\r\n\r\n{"input": '
        )
        time.sleep(0.5)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):  # measured below
            process.wait(timeout=25)  # the graceful-shutdown bound is 10 s
        stopped_in = time.monotonic() - started
        stalled.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert stopped_in < 15, f"SIGTERM took {stopped_in:.1f} s"


BAD_OPTIONS = [
    (["--max-wait-ms", "inf"], "--max-wait-ms inf: must lie in 0..1000"),
    (["--max-wait-ms", "nan"], "--max-wait-ms nan: must lie in 0..1000"),
    (["--max-wait-ms", "-1"], "--max-wait-ms -1: must lie in 0..1000"),
    (["--max-batch", "0"], "--max-batch 0: must lie in 1..1024"),
    (["--max-batch", "100000"], "--max-batch 100000: must lie in 1..1024"),
    (["--batch-tokens", "0"], "--batch-tokens 0: must lie in 1..1048576"),
    (["--batch-tokens", "2000000"], "--batch-tokens 2000000: must lie in 1..1048576"),
    (["--port", "0"], "--port 0: must lie in 1..65535"),
    (["--port", "70000"], "--port 70000: must lie in 1..65535"),
    (["--head-timeout", "0"], "--head-timeout 0: must lie in"),
    (["--body-timeout", "inf"], "--body-timeout inf: must lie in"),
    (["--max-connections", "0"], "--max-connections 0: must lie in"),
    (["--max-delegation-rate", "nan"], "--max-delegation-rate nan: must lie in [0.0001, 1]"),
    (["--max-delegation-rate", "0.00001"], "--max-delegation-rate 1e-05: must lie in [0.0001, 1]"),
]


@pytest.mark.parametrize(("options", "fragment"), BAD_OPTIONS)
def test_every_serve_option_is_bounded_in_one_line(tmp_path: Path, options: list[str], fragment: str) -> None:
    assert_one_line_error(run_ctd("monitor", "serve", str(tmp_path), *options, cwd=tmp_path), fragment)


def test_the_auth_token_variable_must_hold_a_token(tmp_path: Path) -> None:
    for env, fragment in (
        ({}, "the variable is unset or empty"),
        ({"CTD_TEST_MONITOR_TOKEN": "  "}, "the variable is unset or empty"),
        ({"CTD_TEST_MONITOR_TOKEN": "two words"}, "printable ASCII without spaces"),
    ):
        environment = {k: v for k, v in os.environ.items() if k != "CTD_TEST_MONITOR_TOKEN"} | env
        result = subprocess.run(
            [sys.executable, "-c", CTD, "monitor", "serve", str(tmp_path),
             "--auth-token-env", "CTD_TEST_MONITOR_TOKEN"],
            cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert_one_line_error(result, "--auth-token-env CTD_TEST_MONITOR_TOKEN", fragment)
        assert "two words" not in result.stderr


def _copy(bundle: Path, to: Path) -> Path:
    shutil.copytree(bundle, to, ignore=shutil.ignore_patterns("decisions.jsonl"))
    return to


def test_a_port_in_use_is_one_line_before_the_model_loads(bundle: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_ctd("monitor", "serve", str(bundle), "--no-expert", "--port", str(port), cwd=tmp_path)
    assert_one_line_error(result, f"--port {port}: 127.0.0.1:{port} is already in use")


def test_a_corrupt_probe_is_one_line(bundle: Path, tmp_path: Path) -> None:
    broken = _copy(bundle, tmp_path / "broken")
    (broken / "dv.safetensors").write_bytes(b"not a safetensors file")
    seal(broken)  # its recorded hash too: the probe loader, not the hash check, must refuse it
    result = run_ctd("monitor", "serve", str(broken), "--no-expert", "--port", str(free_port()), cwd=tmp_path)
    assert_one_line_error(result, "dv.safetensors: not a safetensors file")


def test_a_missing_model_is_one_line(bundle: Path, tmp_path: Path) -> None:
    elsewhere = _copy(bundle, tmp_path / "elsewhere")
    for name in ("safety.json", "dv.json"):
        record = (
            (elsewhere / name).read_text().replace('"model": "smollm2"', '"model": "/nowhere/model.gguf"')
        )
        (elsewhere / name).write_text(record)
    seal(elsewhere)
    result = run_ctd(
        "monitor", "serve", str(elsewhere), "--no-expert", "--port", str(free_port()), cwd=tmp_path
    )
    assert_one_line_error(result, "/nowhere/model.gguf")


def test_a_log_path_that_is_a_folder_is_one_line_before_the_model_loads(bundle: Path, tmp_path: Path) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    result = run_ctd(
        "monitor", "serve", str(bundle), "--no-expert", "--port", str(free_port()), "--log", str(folder),
        cwd=tmp_path,
    )  # fmt: skip
    assert_one_line_error(result, f"--log {folder}: is a folder")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders: nothing to refuse")
def test_a_read_only_bundle_is_one_line_before_the_model_loads(bundle: Path, tmp_path: Path) -> None:
    frozen = _copy(bundle, tmp_path / "frozen")
    frozen.chmod(0o555)
    try:
        result = run_ctd(
            "monitor", "serve", str(frozen), "--no-expert", "--port", str(free_port()), cwd=tmp_path
        )
    finally:
        frozen.chmod(0o755)
    assert_one_line_error(result, "decisions.jsonl: cannot be appended to")
