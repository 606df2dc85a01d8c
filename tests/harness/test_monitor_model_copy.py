"""A monitor bundle moves with its model (issue 25): `ctd monitor serve BUNDLE --model COPY` serves
a bundle whose probes record a model folder from any copy of the same files, and refuses a copy
with one byte of its weights changed. Every refusal at start-up is one line on stderr, exit code 2,
no traceback, and writes no decision log.
"""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

import httpx
import pytest
from ctd_cli import assert_one_line_error, free_port, run_ctd
from monitor_bundle import write_untrained_bundle
from monitor_run import serve, stop

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "probes"))
from test_model_identity import converted_folder, flip_byte


@pytest.fixture(scope="module")
def folder_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A bundle whose probes record the embedded model's converted folder, and a copy of that
    folder elsewhere."""
    tmp = tmp_path_factory.mktemp("copy")
    original = converted_folder()
    bundle = write_untrained_bundle(tmp / "bundle", model=str(original))
    copy = tmp / "moved" / "model"
    shutil.copytree(original, copy)
    (copy / "ctd-converted.json").unlink()  # names the GGUF by path: not part of the identity
    return bundle, copy


def test_a_copy_of_the_model_serves_the_bundle_and_a_changed_weight_is_refused(
    folder_bundle: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle, copy = folder_bundle
    port = free_port()
    log = tmp_path / "served.jsonl"
    extra = ("--no-expert", "--model", str(copy), "--log", str(log))
    process = serve(bundle, port, *extra, cwd=tmp_path, env={})
    try:
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/check", json={"input": "hello"}, timeout=600)
    finally:
        stop(process)
    assert answer.status_code == 200 and 0 <= answer.json()["probe"] <= 1

    weights = copy / "model.safetensors"
    flip_byte(weights, weights.stat().st_size - 4096)  # hashed above; size and time kept
    log = tmp_path / "refused.jsonl"
    # Refused in the scorer process: the refusal crosses to the server as the same one line.
    result = run_ctd(
        "monitor", "serve", str(bundle), "--no-expert", "--model", str(copy), "--port", str(free_port()),
        "--log", str(log), "--scorer-process", cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert_one_line_error(result, f"model {copy}: its weights (folder:sha256:", "are not those the probes")
    assert not log.exists()


def test_start_up_refusals_are_one_line_and_write_no_log(
    folder_bundle: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle, _ = folder_bundle
    tampered = tmp_path / "tampered"
    shutil.copytree(bundle, tampered)
    with (tampered / "dv.safetensors").open("r+b") as handle:
        handle.seek(100)
        handle.write(b"\x00\x01")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    taken = busy.getsockname()[1]
    cases = [
        (tmp_path / "no-such-bundle", [], "not a monitor bundle"),
        (tampered, [], "dv.safetensors: its content is not what was certified"),
        (bundle, ["--model", str(tmp_path / "nowhere")], "no such file or folder"),
        (bundle, ["--port", str(taken)], "is already in use"),
    ]
    try:
        for where, extra, fragment in cases:
            log = tmp_path / "logs" / f"{where.name}.jsonl"
            result = run_ctd(
                "monitor", "serve", str(where), "--no-expert", "--port", str(free_port()), "--log", str(log),
                *extra, cwd=tmp_path, timeout=300,
            )  # fmt: skip
            assert_one_line_error(result, fragment)
            assert not log.exists() and not log.parent.exists()
    finally:
        busy.close()
    assert not (tampered / "decisions.jsonl").exists()
