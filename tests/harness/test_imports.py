"""Commands import only what they use: a structural check, not a timing check.

Each case runs in a fresh interpreter (`python -c`), does one thing (an import, `ctd --help`, a
real `ctd calibrate` or `ctd query` run, a `ctd eval` stopped by its endpoint check) and reports
which heavy modules ended up in
`sys.modules`. torch, transformers, accelerate and matplotlib cost seconds and hundreds of MB
at import; only the probe and DV stages (and `ctd probe`, `ctd eval`) may load the first three,
only the report's figure workers matplotlib. A command line that only prints its help also leaves scipy (the
statistics) and sqlmodel and aiohttp (the expert engine) alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ctd_cli import CTD, free_port
from fault_server import RunningServer

# Loaded only by the probe and DV stages (torch, transformers, accelerate) and the report's workers.
MODEL_STACK = ("torch", "transformers", "accelerate", "matplotlib")
# Also kept out of a command line that only prints its help: the statistics, the expert engine,
# Ray (an optional extra, imported by `ctd score --ray` alone) and inspect_ai (an optional extra,
# imported by `ctd export inspect` alone, when it writes).
HELP_EXTRAS = ("scipy.stats", "scipy.special", "sqlmodel", "aiohttp", "ray", "inspect_ai")
WATCHED = (*MODEL_STACK, *HELP_EXTRAS)

# Prints, at exit (after a command's sys.exit too), the watched modules that were imported.
_REPORT = (
    "import atexit, json, sys\n"
    f"watched = {WATCHED!r}\n"
    "atexit.register(lambda: print('LOADED ' + json.dumps([m for m in watched if m in sys.modules])))\n"
)


def loaded_after(code: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> list[str]:
    """The watched modules that `code` (run with `args` as sys.argv[1:]) imported."""
    result = subprocess.run(
        [sys.executable, "-c", _REPORT + code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("LOADED ")]
    assert lines, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    return json.loads(lines[-1].removeprefix("LOADED "))


def loaded_by_ctd(*args: str, cwd: Path, env: dict[str, str] | None = None) -> list[str]:
    return loaded_after(CTD, *args, cwd=cwd, env=env)


def test_the_check_sees_torch_when_it_is_loaded(tmp_path: Path) -> None:
    """The control: the same check run on the probe trainer reports torch, so an empty list
    below means torch was not loaded, not that the check cannot see it."""
    assert "torch" in loaded_after("from probes import train_probe", cwd=tmp_path)
    assert "matplotlib" in loaded_after(
        "import numpy as np\n"
        "from harness.report._figures import mean_value_figure\n"
        "signals = {name: np.zeros((1, 2)) for name in ('dv', 'uncertainty', 'oracle')}\n"
        "mean_value_figure(np.array([0.1, 0.2]), signals, 0.0, title='t', path='f.png')\n",
        cwd=tmp_path,
    )


@pytest.mark.parametrize(
    "code",
    [
        "import harness.cli",
        "import harness, calibrate, experts, probes",
        "from harness import RunConfig, Roots, RunLayout, load_data, read_scores, build_report",
        "from probes import ARCHS, EMBEDDED_MODEL, ProbeConfig, ProbeError, ModelInfo",
        "from experts import ExpertSpec, ScoringMethod, ConfigError, load_experts",
    ],
)
def test_imports_that_declare_nothing_heavy(code: str, tmp_path: Path) -> None:
    assert loaded_after(code, cwd=tmp_path) == []


def test_the_stage_functions_import_without_the_model_stack(tmp_path: Path) -> None:
    """The pipeline and the probe and DV stages load torch when they run, not when imported."""
    loaded = loaded_after("from harness import run_eval, probe_stage, dv_stage, query_dataset", cwd=tmp_path)
    assert not set(loaded) & set(MODEL_STACK), loaded


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("calibrate", "--help"),
        ("query", "--help"),
        ("eval", "--help"),
        ("probe", "--help"),
        ("score", "--help"),
        ("export", "inspect", "--help"),
        ("experts", "list"),
    ],
    ids=lambda args: " ".join(args),
)
def test_help_and_registry_commands_load_neither_the_model_stack_nor_the_engines(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    env = {"CTD_EXPERTS_FILE": str(tmp_path / "experts.toml")}
    assert loaded_by_ctd(*args, cwd=tmp_path, env=env) == []


def test_calibrate_runs_without_the_model_stack(tmp_path: Path) -> None:
    table = tmp_path / "s.parquet"
    simulate = ("simulate", "--scenario", "weak", "--n", "200", "--n-dev", "50", "--seeds", "1")
    loaded = loaded_by_ctd(*simulate, "--out", str(table), cwd=tmp_path)
    assert not set(loaded) & set(MODEL_STACK), loaded
    loaded = loaded_by_ctd("calibrate", "--scores", str(table), "--out", str(tmp_path / "c"), cwd=tmp_path)
    assert (tmp_path / "c" / "sweep.csv").is_file()
    assert not set(loaded) & set(MODEL_STACK), loaded
    # The p-values need scipy.special; Spearman's rho and the exact intervals are computed
    # without scipy.stats, whose import took half a second of `ctd eval`.
    assert "scipy.special" in loaded and "scipy.stats" not in loaded, loaded
    trials = tmp_path / "trials.csv"
    loaded = loaded_by_ctd(
        "validate", "--scores", str(table), "--trials", "20", "--out", str(trials), cwd=tmp_path
    )
    assert trials.is_file()
    assert "scipy.special" in loaded and "scipy.stats" not in loaded, loaded


def test_eval_checks_everything_before_loading_the_model_stack(tmp_path: Path) -> None:
    """`ctd eval` loads torch in the probe and DV stages only, so a run stopped by its checks
    (here the endpoint check, on a closed port) never loads it, and neither does a rerun that
    skips those stages."""
    env = {"CTD_RUNS_DIR": str(tmp_path / "runs"), "CTD_CACHE": str(tmp_path / "cache.sqlite")}
    url = f"http://127.0.0.1:{free_port()}/v1"
    args = ("eval", "--budgets", "0.5,0.7", "--expert", url, "--expert-model", "m", "--serve", "never")
    loaded = loaded_by_ctd(*args, cwd=tmp_path, env=env)
    assert (tmp_path / "runs").is_dir()  # it got as far as the run folder
    assert not set(loaded) & set(MODEL_STACK), loaded


def test_query_runs_without_the_model_stack(tmp_path: Path) -> None:
    rows = [{"ids": f"ex{i}", "inputs": f"item-{i}: risky?", "labels": "low-stakes"} for i in range(5)]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with RunningServer() as running:
        registry = tmp_path / "experts.toml"
        registry.write_text(f'[experts.fault]\nbase_url = "{running.url}"\nmodel = "fault-model"\n')
        env = {"CTD_CACHE": str(tmp_path / "cache.sqlite"), "CTD_EXPERTS_FILE": str(registry)}
        query = ("query", "--data", "data.jsonl", "--out", "out.csv", "--expert", "fault", "--json")
        loaded = loaded_by_ctd(*query, cwd=tmp_path, env=env)
    assert (tmp_path / "out.csv").is_file()
    assert "sqlmodel" in loaded  # it did run the expert engine
    assert not set(loaded) & set(MODEL_STACK), loaded


@pytest.mark.parametrize("package", ["harness", "experts", "probes"])
def test_every_public_name_resolves(package: str, tmp_path: Path) -> None:
    """The lazy tables point at modules that define the names (a typo would surface only when a
    user first touched the name)."""
    code = (
        f"import {package}\n"
        f"missing = [n for n in {package}.__all__ if getattr({package}, n, None) is None]\n"
        "assert not missing, missing\n"
        f"assert set({package}.__all__) <= set(dir({package}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
