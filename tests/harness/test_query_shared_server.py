"""Two runs of the embedded default share the registry's port: the second finds the first's local
llama.cpp server answering and uses it. When the first run ends it stops that server; the second
then starts its own and finishes from the cache, instead of failing with "the expert stopped
answering". Real llama.cpp servers and the real `ctd eval`."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import time
from pathlib import Path

import pytest
from ctd_cli import free_port, llama_servers_on, start_ctd
from eval_data import eval_env

import experts
from harness.run._config import RunConfig
from probes._embedded import embedded_gguf

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("xllamacpp") is None,
    reason="xllamacpp (llama.cpp's server) is not installed (see the README's install command)",
)
LIMIT = 60


def _wait_for(path: Path, text: str, process: subprocess.Popen[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {path} after {timeout} s")


def test_a_run_whose_borrowed_local_server_goes_away_starts_its_own_and_finishes(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    env = {**eval_env(tmp_path), "CTD_SMOLLM2_URL": url}
    spec = dataclasses.replace(experts.BUILTIN_EXPERTS["smollm2"], base_urls=(url,))
    other = experts.LocalServer(spec, gguf=embedded_gguf(), log=tmp_path / "other-run.log", ready_timeout=120)
    other.start()  # the first run's server
    try:
        args = ("eval", "--limit", str(LIMIT), "--budgets", "0.5", "--seeds", "0", "--trials", "20")
        run = start_ctd(*args, cwd=tmp_path, env=env)
        log = tmp_path / "runs" / RunConfig(limit=LIMIT).run_name / "log.txt"
        _wait_for(log, "query: started", run)
        time.sleep(5)  # some answers in (about 5 a second), most still to come
        other.stop()  # the first run ends
        _, stderr = run.communicate(timeout=600)
    finally:
        other.stop()
    assert run.returncode == 0, stderr
    text = log.read_text()
    assert "starting a local llama.cpp server" not in text.split("went away")[0]  # borrowed first
    assert "the local server for smollm2 (another run's) went away" in text
    assert f"starting a local llama.cpp server for smollm2 at {url}" in text
    (summary,) = [line for line in text.splitlines() if "query: " in line and " examples, " in line]
    assert f"query: {2 * LIMIT} examples," in summary and " 0 failed" in summary, summary
    assert " 0 from the cache" not in summary  # the answers given before the server went away
    assert llama_servers_on(port) == []  # the run stopped the server it started
