"""An expert endpoint that echoes the API key in its error bodies and headers must not get it
printed or stored: the real `ctd experts check`, `ctd query` and `ctd cache explain` run against
such a server, and the key is looked for in every line they print and every byte of every file
under the test's folder (the cache's SQLite file and its WAL, tables, the registry, HOME). The
run folder's log and the CLI's stderr, the last lines of defence, are checked on their own."""

from __future__ import annotations

import io
import json
import secrets
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from ctd_cli import run_ctd
from fault_server import RunningServer

# Private: the stream that redacts keys from a command's output.
from harness.cli._redacting import RedactingStream
from harness.run import Manifests, RunLayout, RunLog, StageStatus

# A name no secret-name rule knows: only the expert's own api_key_env can find its value.
KEY_ENV = "ECHO_JUDGE_AUTH"

Handler = Callable[[web.Request], Any]


def echoing(answers: dict[str, tuple[int, dict[str, str]]]) -> Any:
    """Middleware: a request whose path ends with a key of `answers` gets that status and headers,
    with an OpenAI-style error body echoing the Authorization header and the bare key; every
    answer, good ones included, echoes the header back in a header of its own."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        authorization = request.headers.get("Authorization", "")
        echo = {"X-Echo-Authorization": authorization}
        for suffix, (status, headers) in answers.items():
            if request.path.endswith(suffix):
                key = authorization.removeprefix("Bearer ")
                message = f"Incorrect API key provided: {authorization}. You passed: {key}"
                body = {"error": {"message": message, "type": "invalid_request_error", "code": status}}
                return web.json_response(body, status=status, headers={**echo, **headers})
        response = await handler(request)
        response.headers.update(echo)
        return response

    return middleware


def write_workdir(folder: Path, url: str) -> dict[str, str]:
    """Data, a registry entry naming KEY_ENV, and an environment that keeps HOME, the cache and
    runs in `folder`; returns that environment, the key included."""
    rows = [
        {"ids": f"ex{i}", "inputs": f"item-{i}: is this risky?", "labels": "low-stakes"} for i in range(6)
    ]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    registry = folder / "experts.toml"
    registry.write_text(
        f'[experts.echo]\nbase_url = "{url}"\nmodel = "fault-model"\napi_key_env = "{KEY_ENV}"\n'
        "max_attempts = 2\ndown_after = 3\n"
    )
    (folder / "home").mkdir()
    return {
        KEY_ENV: "live" + secrets.token_hex(16),  # no known key shape: only its value finds it
        "HOME": str(folder / "home"),
        "CTD_EXPERTS_FILE": str(registry),
        "CTD_CACHE": str(folder / "cache.sqlite"),
        "CTD_RUNS_DIR": str(folder / "runs"),
        "CTD_STORE": str(folder / "store"),
        "HF_HUB_OFFLINE": "1",
    }


def assert_found_nowhere(key: str, folder: Path, results: list[subprocess.CompletedProcess[str]]) -> None:
    """Neither the key nor its first half in any output line or any file under `folder`."""
    pieces = (key, key[: len(key) // 2])
    for result in results:
        for piece in pieces:
            assert piece not in result.stdout and piece not in result.stderr, (result.stdout, result.stderr)
    for path in (p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        for piece in pieces:
            assert piece.encode() not in data, f"{path} holds the key"


HOUR = {"Retry-After": "3600"}  # longer than the check's deadline: it gives up at once, quoting the answer

CASES = {
    # name: (answers, ctd arguments, exit code, a fragment of the error line)
    "check-401": ({"/models": (401, {})}, ["experts", "check", "echo"], 2, "HTTP 401"),
    "check-500": ({"/models": (500, HOUR)}, ["experts", "check", "echo"], 2, "HTTP 500"),
    "check-400-json": (
        {"/chat/completions": (400, {}), "/completions": (400, {})},
        ["experts", "check", "echo", "--json"],
        2,
        "HTTP 400",
    ),
    "query-check-400": (
        {"/chat/completions": (400, {}), "/completions": (400, {})},
        ["query", "--data", "data.jsonl", "--out", "out.csv", "--expert", "echo"],
        2,
        "HTTP 400",
    ),
    "query-401": (
        {"/chat/completions": (401, {})},
        ["query", "--data", "data.jsonl", "--out", "out.csv", "--expert", "echo", "--no-check"],
        1,
        "http-401",
    ),
    "query-500-down": (
        {"/chat/completions": (500, {})},
        ["query", "--data", "data.jsonl", "--out", "out.csv", "--expert", "echo", "--no-check"],
        1,
        "HTTP 500",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_key_the_server_echoes_is_printed_and_stored_nowhere(tmp_path: Path, case: str) -> None:
    answers, args, code, fragment = CASES[case]
    running = RunningServer()
    running.server.app.middlewares.append(echoing(answers))
    with running:
        env = write_workdir(tmp_path, running.url)
        result = run_ctd(*args, cwd=tmp_path, env=env)
        results = [result]
        if args[0] == "query":  # what the cache recorded, read back by the command that shows it
            results.append(run_ctd("cache", "explain", "ex0", cwd=tmp_path, env=env))
    assert result.returncode == code, (result.stdout, result.stderr)
    assert fragment in result.stderr.strip().splitlines()[-1], result.stderr
    assert "Traceback" not in result.stderr
    assert args[0] != "query" or (tmp_path / "cache.sqlite").is_file()  # a cache was there to search
    assert_found_nowhere(env[KEY_ENV], tmp_path, results)
    if case == "query-401":  # the failures were recorded, with the server's message redacted
        assert "recorded failure" in results[1].stdout and "Bearer ***" in results[1].stdout, results[
            1
        ].stdout


def test_the_run_log_redacts_what_it_records(tmp_path: Path) -> None:
    """The last line of defence of a `ctd eval` run folder: log.txt and run.json."""
    layout = RunLayout(tmp_path / "run")
    error = "EndpointDown: the last with HTTP 401: Incorrect API key provided: Bearer live0123456789abcdef"
    Manifests(layout).log(f"query: failed: {error}")
    log = RunLog()
    log.started({})
    log.record("query", StageStatus.FAILED, 1.0, error)
    log.write(layout.run_log)
    for path in (layout.text_log, layout.run_log):
        text = path.read_text()
        assert "live0123456789abcdef" not in text and "Bearer ***" in text, text


def test_the_cli_stderr_is_redacted_and_still_a_terminal_when_its_stream_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "Zq" * 20)

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    wrapped = Terminal()
    stream = RedactingStream(wrapped)
    text = f"error: HTTP 401: the server said {'Zq' * 20}\n"  # no shape: the variable's name finds it
    assert stream.write(text) == len(text)  # the caller's count: it must not write the rest again
    assert wrapped.getvalue() == "error: HTTP 401: the server said ***\n"
    assert stream.isatty()
