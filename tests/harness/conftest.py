"""Fixtures shared by the harness tests: one finished run with a monitor bundle (`made`), made
once per session for the `ctd monitor` test modules, and a small disk that fills up."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from ctd_cli import run_ctd
from eval_data import FAST, eval_env, write_tagged_data
from fault_server import RunningServer


@pytest.fixture(scope="session")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A finished run and a budget bundle whose threshold delegates something."""
    tmp = tmp_path_factory.mktemp("monitor")
    env = eval_env(tmp)
    data = write_tagged_data(tmp / "data")
    with RunningServer() as server:
        args = ["eval", "--name", "t", "--expert", server.url, "--expert-model", "fault-model", *FAST]
        for token in data:
            args += ["--data", token]
        done = run_ctd(*args, cwd=tmp, env=env, timeout=1200)
        assert done.returncode == 0, done.stderr
    # The run's test split is small (D_est 19 rows): on some cuts the Pareto front is "never
    # delegate" alone; take the first cut whose certified threshold delegates.
    for split_seed in range(20):
        out = run_ctd(
            "monitor", "calibrate", "--run", "t", "--budget", "0.5", "--split-seed", str(split_seed),
            "--force", cwd=tmp, env=env, timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        bundle = Path(out.stdout.strip().splitlines()[-1])
        record = json.loads((bundle / "bundle.json").read_text())
        if record["threshold"] != "inf":
            break
    else:
        pytest.fail("no cut of the test split certified a threshold that delegates")
    return {"tmp": tmp, "env": env, "bundle": bundle, "record": record}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs: a real file system that fills up, mounted where the test may (root)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)]
    done = subprocess.run(command, capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
