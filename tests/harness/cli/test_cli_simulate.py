"""`ctd simulate`: the table it writes, and the seed and scenario that change it."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_checks import (
    assert_ok,
    ctd,
)

from harness import read_scores


@pytest.mark.parametrize("suffix", ["parquet", "csv"])
def test_simulate_writes_a_readable_table(tmp_path: Path, suffix: str):
    out = tmp_path / "sub" / f"s.{suffix}"
    result = ctd("simulate", "--scenario", "strong", "--n", 120, "--n-dev", 30, "--seeds", 3, "--out", out)
    assert_ok(result)
    assert str(out) in result.stdout
    table = read_scores(out)
    assert len(table.id) == 3 * (120 + 30)
    assert table.seeds == [0, 1, 2]
    assert all(s.n == 120 for s in table.test_scores().values())
    assert set(table.group) == {"anthropic", "mt", "mts", "toolace"}
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]


def test_simulate_random_state_and_scenario_change_the_table(tmp_path: Path):
    paths = {}
    for name, extra in {"a": (), "b": (), "c": ("--random-state", 5), "d": ()}.items():
        scenario = "weak" if name == "d" else "strong"
        paths[name] = tmp_path / f"{name}.csv"
        assert_ok(
            ctd("simulate", "--scenario", scenario, "--n", 50, "--seeds", 1, "--out", paths[name], *extra)
        )
    text = {k: p.read_text(encoding="utf-8") for k, p in paths.items()}
    assert text["a"] == text["b"]
    assert text["a"] != text["c"]
    assert text["a"] != text["d"]
