"""`--expert` resolved once (`harness.expert`): a URL that cannot work is the same one line in every
command that takes one, and the expert a run's query stage asked is what `ctd monitor calibrate`
deploys, whatever the registry says later; a run made before the stage wrote it still resolves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ctd_cli import free_port, run_ctd
from eval_data import FAST, eval_env, write_tagged_data
from fault_server import RunningServer

SECRET_URL = "http://me:s3cret@127.0.0.1:9/v1"
PLAIN_URL = "http://127.0.0.1:9/v1"


@pytest.mark.parametrize(
    ("url", "model", "fragment"),
    [
        (SECRET_URL, [], "credentials in the URL are refused"),  # both problems: the URL's first
        (SECRET_URL, ["--expert-model", "m"], "credentials in the URL are refused"),
        (PLAIN_URL, [], "a URL needs --expert-model"),
    ],
)
def test_a_url_that_cannot_work_is_the_same_line_in_every_command(
    tmp_path: Path, url: str, model: list[str], fragment: str
) -> None:
    """`ctd eval --expert`, `ctd query --expert` and `ctd experts check` (its argument is an
    --expert) go through one rule: the same one line, exit code 2, the credentials never shown,
    and nothing written."""
    env = eval_env(tmp_path)
    commands = {
        "eval": ["eval", "--expert", url, *model],
        "query": ["query", "--data", "d.jsonl", "--out", "o.csv", "--expert", url, *model],
        "experts check": ["experts", "check", url, *model],
    }
    lines = {}
    for command, args in commands.items():
        result = run_ctd(*args, cwd=tmp_path, env=env, timeout=60)
        assert result.returncode == 2, (command, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (command, result.stderr)
        lines[command] = result.stderr.strip()
    assert len(set(lines.values())) == 1, lines
    line = lines["eval"]
    assert line.startswith("error: --expert ") and fragment in line and "s3cret" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _register(registry: Path, url: str, model: str) -> None:
    entry = f'base_url = "{url}"\nmodel = "{model}"\ntop_logprobs = 5\napi_key_env = "FAULT_KEY"\n'
    registry.write_text("[experts.fault]\n" + entry)


def _calibrate(tmp_path: Path, env: dict[str, str], name: str) -> dict:
    """`ctd monitor calibrate` on run t: the bundle's expert entry, without the expert calibration
    it carries, which is checked here to be the run's (the default run's kind, dev)."""
    args = ["monitor", "calibrate", "--run", "t", "--budget", "0.5", "--name", name]
    done = run_ctd(*args, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    bundle = Path(done.stdout.strip().splitlines()[-1])
    entry = json.loads((bundle / "bundle.json").read_text())["expert"]
    calibration = json.loads((tmp_path / "runs" / "t" / "query" / "expert_calibration.json").read_text())
    assert entry.pop("calibration") == calibration and calibration["kind"] == "dev"
    return entry


def test_the_bundle_deploys_the_expert_the_run_queried(tmp_path: Path) -> None:
    """A registered expert asked by a run, then changed in the registry (another URL, another
    model): `ctd monitor calibrate` writes the entry the run asked, read from the run folder
    (query/expert.json, a key's variable name but never the key). A run made before the query
    stage wrote that file (here: the file removed) resolves from the registry, as before."""
    env = {**eval_env(tmp_path), "CTD_EXPERTS_FILE": str(tmp_path / "experts.toml"), "FAULT_KEY": "sk-s3cret"}
    data = write_tagged_data(tmp_path / "data")
    with RunningServer() as server:
        _register(tmp_path / "experts.toml", server.url, "fault-model")
        args = ["eval", "--name", "t", "--expert", "fault", *FAST]
        for token in data:
            args += ["--data", token]
        done = run_ctd(*args, cwd=tmp_path, env=env, timeout=1200)
        assert done.returncode == 0, done.stderr
        asked = {
            "name": "fault",
            "base_urls": [server.url],
            "model": "fault-model",
            "method": "next-token",
            "template": "stakes-v1",
            "top_logprobs": 5,
            "api_key_env": "FAULT_KEY",
        }
    moved = f"http://127.0.0.1:{free_port()}/v1"
    _register(tmp_path / "experts.toml", moved, "changed-model")

    bundled = _calibrate(tmp_path, env, "queried")
    assert bundled == asked
    run = tmp_path / "runs" / "t"
    written = run / "query" / "expert.json"
    assert json.loads(written.read_text()) == asked
    assert "sk-s3cret" not in written.read_text()
    manifest = json.loads((run / "manifests" / "query.json").read_text())
    assert list(manifest["outputs"]) == [
        "query/expert_scores.parquet",
        "query/expert.json",
        "query/expert_calibration.json",
    ]

    written.unlink()
    assert _calibrate(tmp_path, env, "resolved") == {**asked, "base_urls": [moved], "model": "changed-model"}
