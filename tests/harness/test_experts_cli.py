"""`ctd query`, `ctd experts` and `ctd cache` through the real command line: bad endpoints and
registry typos are one line with exit code 2 and cache nothing; a good run resumes from the cache."""

from __future__ import annotations

import importlib.util
import json
import socket
import sqlite3
import subprocess
from pathlib import Path

import pytest
from aiohttp import web
from ctd_cli import assert_one_line_error, run_ctd
from fault_server import FaultPlan, RunningServer, item_score

import experts


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    rows = [
        {
            "ids": f"ex{i}",
            "inputs": f"item-{i}: is this risky?",
            "labels": "high-stakes" if i % 2 else "low-stakes",
        }
        for i in range(30)
    ]
    rows.append({"ids": "amb", "inputs": "item-99", "labels": "ambiguous"})
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return tmp_path


def env_for(folder: Path) -> dict[str, str]:
    return {"CTD_CACHE": str(folder / "cache.sqlite"), "CTD_EXPERTS_FILE": str(folder / "experts.toml")}


def query(
    folder: Path, url: str, model: str = "fault-model", *extra: str
) -> subprocess.CompletedProcess[str]:
    return run_ctd(
        "query", "--data", "data.jsonl", "--out", "out.csv", "--expert-url", url, "--expert-model", model,
        *extra, cwd=folder, env=env_for(folder),
    )  # fmt: skip


def nothing_cached(folder: Path) -> bool:
    path = folder / "cache.sqlite"
    if not path.exists():
        return True
    with sqlite3.connect(path) as db:
        return db.execute("SELECT COUNT(*) FROM scores").fetchone()[0] == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_url(workdir: Path) -> None:
    result = query(workdir, f"http://127.0.0.1:{free_port()}/v1")
    assert_one_line_error(result, "cannot reach", "is the server running")
    assert nothing_cached(workdir) and not (workdir / "out.csv").exists()


def test_refused_api_key(workdir: Path) -> None:
    @web.middleware
    async def require_key(request: web.Request, handler):  # type: ignore[no-untyped-def]
        if request.headers.get("Authorization") != "Bearer right-key":
            return web.json_response({"error": "unauthorized"}, status=401)
        return await handler(request)

    running = RunningServer()
    running.server.app.middlewares.append(require_key)
    with running:
        result = query(workdir, running.url)
    assert_one_line_error(result, "HTTP 401", "API key")
    assert nothing_cached(workdir)


def test_model_not_served(workdir: Path) -> None:
    with RunningServer() as running:
        result = query(workdir, running.url, "no-such-model")
    assert_one_line_error(result, "serves fault-model", "'no-such-model'")
    assert nothing_cached(workdir)


def test_endpoint_without_logprobs(workdir: Path) -> None:
    with RunningServer(FaultPlan(rates={"no-logprobs": 1.0})) as running:
        result = query(workdir, running.url)
    assert_one_line_error(result, "chat logprobs do not work")
    assert nothing_cached(workdir)


def test_registry_typo_names_file_and_line(workdir: Path) -> None:
    (workdir / "experts.toml").write_text('[experts.judge]\nbase_url = "http://x/v1"\nmodle = "m"\n')
    result = run_ctd("experts", "list", cwd=workdir, env=env_for(workdir))
    assert_one_line_error(result, "experts.toml:3", "unknown key 'modle'")
    result = run_ctd(
        "query",
        "--data",
        "data.jsonl",
        "--out",
        "o.csv",
        "--expert",
        "judge",
        cwd=workdir,
        env=env_for(workdir),
    )
    assert_one_line_error(result, "experts.toml:3")
    assert nothing_cached(workdir)


def test_query_runs_resumes_and_reports(workdir: Path) -> None:
    with RunningServer(FaultPlan(rates={"500": 0.2}, broken=frozenset({3}))) as running:
        first = query(workdir, running.url, "fault-model", "--json", "--max-failed", "0.05")
        assert first.returncode == 0, first.stderr
        summary = json.loads(first.stdout)
        assert summary["total"] == 30 and summary["dropped"] == 1
        assert summary["scored"] == 29 and summary["failed"] == 1
        assert summary["failure_reasons"] == {"no-label-mass": 1}
        requests_after_first = sum(running.server.counts.requests.values())
        again = json.loads(
            query(workdir, running.url, "fault-model", "--json", "--max-failed", "0.05").stdout
        )
        assert again["cached"] == 29 and again["scored"] == 0 and again["failed"] == 1
        # Only the failed item (and the check's probes) went to the server again.
        item_requests = {k: v for k, v in running.server.counts.requests.items() if k >= 0}
        assert (
            sum(item_requests.values())
            - sum(v for k, v in running.server.counts.requests.items() if k >= 0 and k != 3)
            == item_requests[3]
        )
        assert sum(running.server.counts.requests.values()) > requests_after_first
    lines = (workdir / "out.csv").read_text().splitlines()
    assert lines[0] == "id,label,expert,label_mass,source,how,reason,attempts"
    rows = [line.split(",") for line in lines[1:]]
    assert [r[0] for r in rows] == [f"ex{i}" for i in range(30)]
    for i, row in enumerate(rows):
        if i == 3:
            assert row[2] == "" and row[4] == "failed" and row[5] == "" and row[6] == "no-label-mass"
        else:
            assert float(row[2]) == pytest.approx(item_score(i), abs=1e-12) and row[4:6] == ["cache", "top-k"]
    stats = run_ctd("cache", "stats", "--json", cwd=workdir, env=env_for(workdir))
    assert json.loads(stats.stdout)["experts"] == {
        "url:fault-model": {"scores": 29, "failures": 2, "batch_out": 0, "claims": 0, "stale_claims": 0}
    }
    exported = run_ctd("cache", "export", "--out", "scores.jsonl", cwd=workdir, env=env_for(workdir))
    assert exported.returncode == 0
    assert len((workdir / "scores.jsonl").read_text().splitlines()) == 29


def test_experts_add_show_and_check(workdir: Path) -> None:
    with RunningServer() as running:
        added = run_ctd(
            "experts", "add", "local.judge", "--url", running.url, "--model", "fault-model", "--rpm", "600",
            cwd=workdir, env=env_for(workdir),
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        shown = json.loads(
            run_ctd("experts", "show", "local.judge", "--json", cwd=workdir, env=env_for(workdir)).stdout
        )
        assert shown["model"] == "fault-model" and shown["rate"]["rpm"] == 600
        check = run_ctd("experts", "check", "local.judge", "--json", cwd=workdir, env=env_for(workdir))
        assert check.returncode == 0, check.stderr
        report = json.loads(check.stdout)
        assert report["reachable"] and report["model_served"] and report["chat_logprobs"]
        assert report["completions_echo"] and report["method"] == "next-token"


def test_experts_add_says_which_template_it_used_why_and_how_to_choose(workdir: Path) -> None:
    """Pointed at the built-in smollm2's server without --template, `add` says it used stakes-v1
    as the default, what that asks, how to choose another, and warns (one line on stderr) that
    smollm2 asks the same model there with fine-v1; `show` and `list` show the template."""
    env = env_for(workdir)
    url = experts.BUILTIN_EXPERTS["smollm2"].base_urls[0]
    added = run_ctd("experts", "add", "mine", "--url", url, "--model", "smollm2", cwd=workdir, env=env)
    assert added.returncode == 0, added.stderr
    assert "template: stakes-v1 (the default, as no --template was given): asks whether" in added.stdout
    assert "to ask otherwise: --template fine-v1, or --template FILE.toml" in added.stdout
    assert added.stderr.splitlines() == [
        "warning: smollm2 (built-in) asks this model at this URL with template fine-v1, not stakes-v1, "
        "and the answers differ: pass --template fine-v1 to ask as smollm2 does"
    ]
    shown = run_ctd("experts", "show", "mine", cwd=workdir, env=env)
    assert f"template: stakes-v1 ({experts.BUILTIN_TEMPLATES['stakes-v1']})" in shown.stdout
    chosen = run_ctd(
        "experts", "add", "mine", "--url", url, "--model", "smollm2", "--template", "fine-v1",
        cwd=workdir, env=env,
    )  # fmt: skip
    assert chosen.returncode == 0 and chosen.stderr == "", chosen.stderr
    assert 'template: fine-v1 (given with --template): asks "Is everything fine here?' in chosen.stdout
    listed = json.loads(run_ctd("experts", "list", "--json", cwd=workdir, env=env).stdout)
    assert listed["mine"]["template"] == "fine-v1" and listed["gemma-27b"]["template"] == "stakes-v1"
    helped = run_ctd("experts", "add", "--help", cwd=workdir, env={**env, "COLUMNS": "400"})
    for name in experts.BUILTIN_TEMPLATES:
        assert f"{name}: asks" in helped.stdout
    assert "[default: stakes-v1]" in helped.stdout


def test_an_unset_api_key_variable_is_warned_of_and_a_set_one_never_shown(workdir: Path) -> None:
    """`add`, `show` and `check` of an entry whose --api-key-env variable is not set each warn
    in one line on stderr naming the variable; once it is set, none warns and its value is
    printed nowhere."""
    variable = "CTD_TEST_UNSET_JUDGE_KEY"
    env = env_for(workdir)
    with RunningServer() as running:
        commands = [
            [
                "experts",
                "add",
                "judge",
                "--url",
                running.url,
                "--model",
                "fault-model",
                "--api-key-env",
                variable,
            ],
            ["experts", "show", "judge"],
            ["experts", "check", "judge"],
        ]
        warning = f"warning: {variable} is not set, so requests to judge go without an API key"
        for command in commands:
            result = run_ctd(*command, cwd=workdir, env=env)
            assert result.returncode == 0, result.stderr
            assert [line for line in result.stderr.splitlines() if line.startswith("warning:")] == [
                f"{warning} (set it where `ctd` runs with judge)"
            ]
        for command in commands:
            result = run_ctd(*command, cwd=workdir, env={**env, variable: SECRET})
            assert result.returncode == 0, result.stderr
            assert "warning" not in result.stderr
            assert_no_secret(result)


# --------------------------------------------------------------------------- bad configuration

SECRET = "s3cret-pw"


def assert_no_secret(result: subprocess.CompletedProcess[str]) -> None:
    assert SECRET not in result.stdout + result.stderr, (result.stdout, result.stderr)


def test_credentials_in_a_url_are_refused_redacted_wherever_the_url_enters(workdir: Path) -> None:
    with RunningServer() as running:
        port = running.port
        with_credentials = f"http://user:{SECRET}@127.0.0.1:{port}/v1"
        shown = f"'http://***@127.0.0.1:{port}/v1'"
        # --expert-url of query and check: one line naming the option, before any request.
        for command in (["query", "--data", "data.jsonl", "--out", "out.csv"], ["experts", "check"]):
            result = run_ctd(
                *command, "--expert-url", with_credentials, "--expert-model", "fault-model",
                cwd=workdir, env=env_for(workdir),
            )  # fmt: skip
            assert_one_line_error(result, f"--expert-url {shown}", "credentials", "--api-key-env")
            assert_no_secret(result)
        assert sum(running.server.counts.requests.values()) == running.server.counts.models == 0
    assert nothing_cached(workdir) and not (workdir / "out.csv").exists()
    # ctd experts add --url: nothing written.
    result = run_ctd(
        "experts",
        "add",
        "judge",
        "--url",
        with_credentials,
        "--model",
        "m",
        cwd=workdir,
        env=env_for(workdir),
    )
    assert_one_line_error(result, f"--url {shown}", "credentials", "--api-key-env")
    assert_no_secret(result)
    assert not (workdir / "experts.toml").exists()
    # An entry written by hand: list and show refuse it with the file and line, never print it.
    (workdir / "experts.toml").write_text(f'[experts.judge]\nmodel = "m"\nbase_url = "{with_credentials}"\n')
    for command in (["experts", "list"], ["experts", "show", "judge"]):
        result = run_ctd(*command, cwd=workdir, env=env_for(workdir))
        assert_one_line_error(result, "experts.toml:3", f"base_url = {shown}", "credentials")
        assert_no_secret(result)
    # A built-in's URL from the environment.
    (workdir / "experts.toml").unlink()
    result = run_ctd(
        "experts", "list", cwd=workdir, env={**env_for(workdir), "CTD_SMOLLM2_URL": with_credentials}
    )
    assert_one_line_error(result, f"$CTD_SMOLLM2_URL = {shown}", "credentials")
    assert_no_secret(result)


@pytest.mark.parametrize(
    ("option", "fragments"),
    [
        (["--rpm", "nan"], ["--rpm nan: must be a number per minute above 0"]),
        (["--tpm", "inf"], ["--tpm inf: must be a number per minute above 0"]),
        (["--url", "ftp//nope"], ["--url 'ftp//nope': must start with http:// or https://"]),
        (["--template", "nosuch"], ["--template 'nosuch'", "not found"]),
        (["--concurrency", "0"], ["--concurrency 0: must be at least 1"]),
    ],
)
def test_experts_add_refuses_a_bad_value_and_writes_nothing(
    workdir: Path, option: list[str], fragments: list[str]
) -> None:
    (workdir / "experts.toml").write_text('[experts.keep]\nbase_url = "http://127.0.0.1:1/v1"\nmodel = "m"\n')
    before = (workdir / "experts.toml").read_bytes()
    args = ["--url", "http://127.0.0.1:8000/v1", "--model", "m"]
    result = run_ctd("experts", "add", "judge", *args, *option, cwd=workdir, env=env_for(workdir))
    assert_one_line_error(result, *fragments)
    assert (workdir / "experts.toml").read_bytes() == before
    assert sorted(p.name for p in workdir.iterdir()) == ["data.jsonl", "experts.toml"]


@pytest.mark.parametrize(
    ("setting", "command", "fragments"),
    [
        (
            "rpm = nan",
            ["experts", "list"],
            ["experts.toml:4", "rpm = nan: must be a number per minute above 0"],
        ),
        (
            'rpm = "fast"',
            ["query", "--expert", "judge"],
            ["experts.toml:4", "rpm = 'fast': must be a number"],
        ),
        (
            "timeout = nan",
            ["experts", "check", "judge"],
            ["experts.toml:4", "timeout = nan", "seconds above 0"],
        ),
        ("base_url = 5", ["experts", "show", "judge"], ["experts.toml:3", "base_url = 5: must be a URL"]),
    ],
)
def test_a_bad_value_in_experts_toml_is_one_line_naming_file_line_and_key(
    workdir: Path, setting: str, command: list[str], fragments: list[str]
) -> None:
    url_line = "" if setting.startswith("base_url") else 'base_url = "http://127.0.0.1:1/v1"\n'
    (workdir / "experts.toml").write_text(
        f'[experts.judge]\nmodel = "m"\n{url_line}{setting}\n'.replace("\n\n", "\n")
    )
    if command[0] == "query":
        command = [*command, "--data", "data.jsonl", "--out", "out.csv"]
    result = run_ctd(*command, cwd=workdir, env=env_for(workdir))
    assert_one_line_error(result, *fragments)
    assert nothing_cached(workdir) and not (workdir / "out.csv").exists()


def test_a_request_larger_than_the_tpm_stops_before_anything_is_paid(workdir: Path) -> None:
    with RunningServer() as running:
        (workdir / "experts.toml").write_text(
            f'[experts.tiny]\nbase_url = "{running.url}"\nmodel = "fault-model"\ntpm = 50\n'
        )
        result = run_ctd(
            "query", "--data", "data.jsonl", "--out", "out.csv", "--expert", "tiny",
            cwd=workdir, env=env_for(workdir), timeout=60,
        )  # fmt: skip
        assert_one_line_error(result, "example 'ex0'", "tokens is larger than tpm = 50", "experts.toml")
        assert sum(running.server.counts.requests.values()) == 0  # not even the check's probes
    assert nothing_cached(workdir) and not (workdir / "out.csv").exists()


@pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="xllamacpp is not installed")
def test_experts_serve_on_a_taken_port_is_one_line_and_starts_nothing(workdir: Path) -> None:
    """`ctd experts serve` serves on the port the user asked for (the registry's, or --port) or
    not at all: runs find it there. Taken, it says so before loading anything."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # The log of the server that holds the port (the same --log: a second start of the same
        # expert) is that server's, not this failed start's to empty.
        log = workdir / "serve.log"
        log.write_text("the running server's output\n")
        result = run_ctd(
            "experts", "serve", "smollm2", "--port", str(port), "--log", str(log),
            cwd=workdir, env=env_for(workdir),
        )  # fmt: skip
    assert_one_line_error(result, f"port {port} on 127.0.0.1 is taken by another process", "--port")
    assert log.read_text() == "the running server's output\n"
