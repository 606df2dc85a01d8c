"""`ctd --help` and each command's help name every option."""

from __future__ import annotations

import re

import pytest
from cli_checks import (
    assert_ok,
    runner,
)

from harness.cli import app


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ((), ("simulate", "calibrate", "validate")),
        (("simulate",), ("--scenario", "--n", "--seeds", "--out")),
        (
            ("calibrate",),
            ("--scores", "--run", "--out", "--budgets", "--batch-sizes", "--policies", "--delta", "--json"),
        ),
        (
            ("validate",),
            (
                "--scores",
                "--run",
                "--mode",
                "--alpha",
                "--delta",
                "--trials",
                "--out",
                "--json",
                "--eval-scores",
                "--cal-size",
                "--pvalue",
                "--seed",
            ),
        ),
    ],
)
def test_help(command: tuple[str, ...], options: tuple[str, ...]):
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert_ok(result)
    assert "Usage" in result.stdout
    for option in options:
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", result.stdout), option
