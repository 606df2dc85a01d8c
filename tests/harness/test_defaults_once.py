"""Every default is written once: the commands' defaults are the config sections' (read from the
Typer app's own parameters), `ctd eval`'s are RunConfig's, RunConfig's are the sections', and the
engine's split fractions, grids, Pareto filter and split seed are spelled once in the source; and
whether D_cal is large enough is computed in one place."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import typer

import calibrate
from harness import ExpertSettings, ProbeSettings, RunConfig, simulate, simulate_scores
from harness.cli import app
from harness.data import DEFAULT_RANDOM_STATE

REPO = Path(__file__).resolve().parents[2]


def _defaults(*path: str) -> dict[str, Any]:
    """{option: default} of the command at `path` (e.g. "monitor", "calibrate")."""
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # a group's subcommands
    return {max(p.opts, key=len): p.default for p in command.params}


def _joined(values: tuple[object, ...]) -> str:
    return ",".join(map(str, values))


def test_calibrate_command_defaults_are_the_sweep_config() -> None:
    sweep = calibrate.SweepConfig()
    found = _defaults("calibrate")
    assert found["--budgets"] is None  # None: the sweep's grid, read in the command body
    assert {
        "--batch-sizes": found["--batch-sizes"],
        "--policies": found["--policies"],
        "--objectives": found["--objectives"],
        "--delta": found["--delta"],
        "--merge": found["--merge"],
        "--fwer": found["--fwer"],
        "--pvalue": found["--pvalue"],
        "--pareto": found["--pareto"],
        "--split-seed": found["--split-seed"],
    } == {
        "--batch-sizes": _joined(sweep.batch_sizes),
        "--policies": _joined(sweep.policies),
        "--objectives": _joined(sweep.objectives),
        "--delta": sweep.delta,
        "--merge": sweep.merge,
        "--fwer": sweep.fwer,
        "--pvalue": sweep.pvalue,
        "--pareto": sweep.pareto,
        "--split-seed": sweep.split_seed,
    }


def test_validate_command_defaults_are_the_validation_config() -> None:
    config = calibrate.ValidationConfig()
    found = _defaults("validate")
    for option, field in (
        ("--delta", "delta"),
        ("--trials", "trials"),
        ("--policy", "policy"),
        ("--objective", "objective"),
        ("--pareto", "pareto"),
        ("--fwer", "fwer"),
        ("--pvalue", "pvalue"),
        ("--merge", "merge"),
        ("--seed", "seed"),
        ("--cal-size", "cal_size"),
    ):
        assert found[option] == getattr(config, field), option


def test_simulate_command_and_functions_default_to_one_random_state() -> None:
    found = _defaults("simulate")["--random-state"]
    function = inspect.signature(simulate).parameters["random_state"].default
    engine = inspect.signature(simulate_scores).parameters["random_state"].default
    assert found == function == engine == DEFAULT_RANDOM_STATE


def test_probe_and_dv_command_defaults_are_the_probe_settings() -> None:
    settings = ProbeSettings()
    found = _defaults("probe")
    assert {k: found[k] for k in ("--model", "--revision", "--layer", "--max-tokens", "--batch-tokens")} == {
        "--model": settings.model,
        "--revision": settings.revision,
        "--layer": settings.layer,
        "--max-tokens": settings.max_tokens,
        "--batch-tokens": settings.batch_tokens,
    }
    assert found["--device-map"] == settings.device_map
    assert found["--arch"] == _joined(settings.archs)
    assert found["--seeds"] == _joined(settings.seeds)
    assert found["--epochs"] == settings.training.epochs
    dv = _defaults("dv")
    assert dv["--epochs"] == settings.training.epochs
    assert dv["--target"] == calibrate.DV_TARGETS[0] == RunConfig().dv_target


def test_monitor_calibrate_defaults_are_the_engine_and_bundle_defaults() -> None:
    from harness.monitor import calibrate_bundle  # the function the command calls

    found = _defaults("monitor", "calibrate")
    bundle = inspect.signature(calibrate_bundle).parameters
    assert found["--delta"] == calibrate.ControlConfig().delta == bundle["delta"].default
    assert found["--split-seed"] == bundle["split_seed"].default == calibrate.SweepConfig().split_seed
    assert bundle["objective"].default == calibrate.ValidationConfig().objective  # what validate checks


def test_sweep_and_validation_commands_read_their_sections_not_the_engine_constants() -> None:
    """`ctd calibrate` and `ctd validate` take their defaults from SweepConfig and ValidationConfig,
    so a section's default changes its command's; an engine constant (calibrate.DEFAULT_*) written
    as an option's default would keep the old value (the one exception, --seed, says why)."""
    source = (REPO / "harness" / "cli" / "_calibrate.py").read_text(encoding="utf-8").splitlines()
    hits = [
        f"{number}: {line.strip()}"
        for number, line in enumerate(source, 1)
        if re.search(r"\bDEFAULT_[A-Z_]+\b", line)
        and not line.lstrip().startswith("#")
        and "DEFAULT_RANDOM_STATE" not in line  # ctd simulate has no section: the constant is its default
        and "ValidationConfig's, typed as the one seed" not in line
    ]
    assert hits == []


def test_eval_defaults_are_run_config_and_run_config_is_made_of_the_sections() -> None:
    """`ctd eval`'s options default to None (RunConfig fills them, and --help shows its values);
    RunConfig's defaults are those of the sections the stages take."""
    found = _defaults("eval")
    unset = {k: v for k, v in found.items() if k not in ("--help", "--json", "--force", "--dry-run")}
    assert all(v in (None, False, ()) for v in unset.values()), unset
    config = RunConfig()
    assert config.probe_settings == ProbeSettings()
    assert config.expert_settings == ExpertSettings()
    assert config.sweep_config("default") == calibrate.SweepConfig()
    assert config.validation_config == calibrate.ValidationConfig()


def test_the_testing_defaults_are_the_control_configs() -> None:
    """The sweep and validation test as ControlConfig does unless told otherwise."""
    control = calibrate.ControlConfig()
    assert calibrate.SweepConfig().control == control == calibrate.ValidationConfig().control


# Each engine default, as it would be spelled if written again: (pattern, where it may appear).
SPELLED_ONCE = {
    r"\b0\.3\b.*(?:est|D_est)|est_fraction\s*[:=][^=]*\b0\.3\b": 0,  # EST_FRACTION = 0.3 names it
    r"EST_FRACTION\s*=\s*0\.3": 1,
    r"CAL_FRACTION\s*=\s*0\.5": 1,
    r"cal_fraction\s*:\s*float\s*=\s*0\.5": 0,
    r"\(32, 64, 128\)": 1,
    r"delta\s*:\s*float\s*=\s*0\.1|DeltaOption\s*=\s*0\.1|\]\s*=\s*0\.1,": 0,
    r"n_grid\s*:\s*int\s*=\s*100": 0,
    r"trials\s*:\s*int\s*=\s*500|\]\s*=\s*500,": 0,
    r"= \(0\.1, 0\.2, 0\.3\)": 1,
    r"pareto\s*:\s*bool\s*=\s*True": 0,
    r"DEFAULT_PARETO\s*=\s*True": 1,
    # a seed's default 0 as a field, a one-line option or a multi-line option's closing line
    r"seed\s*:\s*int[^=]*=\s*0\b|\"--(?:split-)?seed\".*\]\s*=\s*0,|^\s*\]\s*=\s*0,?$": 0,
    r"DEFAULT_SPLIT_SEED\s*=\s*0": 1,
    # the simulated table's generator seed, as a field or a one-line option
    r"random_state\s*:.*=\s*0\b|\"--random-state\".*\]\s*=\s*0,": 0,
    r"DEFAULT_RANDOM_STATE\s*=\s*0": 1,
    r"objective\s*:[^=]*=\s*\"auroc\"": 1,  # ValidationConfig's
}


@pytest.mark.parametrize("pattern", list(SPELLED_ONCE))
def test_engine_defaults_are_spelled_once(pattern: str) -> None:
    """Outside tests, a default of the engine is a named constant, not a number written again."""
    hits = [
        f"{path.relative_to(REPO)}:{number}"
        for package in ("calibrate", "harness", "probes", "experts")
        for path in sorted((REPO / package).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if not line.lstrip().startswith("#") and re.search(pattern, line)
    ]
    assert len(hits) == SPELLED_ONCE[pattern], hits


def test_the_calibration_size_is_asked_in_one_place() -> None:
    """Every refusal of a too small D_cal (eval's budgets, the sweep's and validation's samples,
    the validate stage's levels, the monitor bundle) asks `calibrate.calibration_size`; none
    computes the size or the certifiable level itself."""
    pattern = r"min_calibration_size\(|min_certifiable_level\(|\* 1000\) / 1000"
    hits = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted((REPO / "harness").rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(pattern, line)
    ]
    assert hits == []
