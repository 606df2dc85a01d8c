"""Every count option has an upper bound (harness/_bounds.py): a value past it is one line naming
the option and its limit, exit code 2, before any work. Before the bounds, `--budgets
0.1:0.5:100000000` and `ctd validate --trials 1000000000` ran into MemoryError tracebacks, and
`ctd eval --trials 1000000000` ran the whole pipeline first. Through the real entry point, in a
subprocess with a timeout, so that a run that starts working fails the test instead of hanging it.

The ragged CSV row (a row shorter than its header used to become id 'None' and label -1, and was
paid for) is here too: one line naming the file and line, nothing asked of anyone."""

from __future__ import annotations

from pathlib import Path

import pytest
from ctd_cli import assert_one_line_error, run_ctd

# Private: the count bounds every command checks.
from harness._bounds import LIMITS

BIG = "1000000000"

CASES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "eval budgets grid": (("eval", "--budgets", "0.1:0.5:100000000"), ("--budgets", "at most 10,000")),
    "eval budgets list": (
        ("eval", "--budgets", ",".join(["0.5"] * 10_001)),
        ("--budgets", "10,001 values"),
    ),
    "eval trials": (("eval", "--trials", BIG), ("--trials", "at most 100,000")),
    "eval epochs": (("eval", "--epochs", BIG), ("--epochs", "at most")),
    "eval max tokens": (("eval", "--max-tokens", BIG), ("--max-tokens", "at most")),
    "eval layer": (("eval", "--layer", BIG), ("--layer", "at most")),
    "eval limit": (("eval", "--limit", "1" + "0" * 12), ("--limit", "at most")),
    "eval seeds": (("eval", "--seeds", "0,99999999999"), ("--seeds", "at most 4,294,967,295")),
    "eval batch sizes": (("eval", "--batch-sizes", "32," + BIG + "0"), ("--batch-sizes", "at most")),
    "validate trials": (
        ("validate", "--scores", "s.parquet", "--trials", BIG),
        ("--trials", str(LIMITS["--trials"])),
    ),
    "calibrate budgets grid": (
        ("calibrate", "--scores", "s.parquet", "--out", "o", "--budgets", "0.1:0.5:100000000"),
        ("--budgets", "at most 10,000"),
    ),
    "simulate rows": (
        ("simulate", "--scenario", "strong", "--n", "10000000", "--seeds", "1000", "--out", "x.parquet"),
        ("rows in all", "at most 100,000,000"),
    ),
    "probe epochs": (("probe", "--out", "p", "--epochs", BIG), ("--epochs", "100000")),
    "experts add concurrency": (
        ("experts", "add", "j", "--url", "http://127.0.0.1:9/v1", "--model", "m", "--concurrency", BIG),
        ("--concurrency", "at most 4,096"),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_count_past_its_bound_is_one_line(name: str, tmp_path: Path) -> None:
    args, fragments = CASES[name]
    env = {
        "CTD_RUNS_DIR": str(tmp_path / "runs"),
        "CTD_CACHE": str(tmp_path / "cache.sqlite"),
        "CTD_EXPERTS_FILE": str(tmp_path / "experts.toml"),
    }
    result = run_ctd(*args, cwd=tmp_path, env=env, timeout=60)
    assert_one_line_error(result, *fragments)
    assert list(tmp_path.iterdir()) == []  # no run folder, cache, registry or output begun


@pytest.mark.parametrize(
    ("content", "line", "fields"),
    [
        ('inputs,ids,labels\n"fine",a,high-stakes\nshort row\n"ok",c,low-stakes\n', 3, 1),
        ('inputs,ids,labels\n"two\nlines",a,high-stakes\n"x",b\n', 4, 2),  # where the row starts
        ('inputs,ids,labels\n"x",a,low-stakes,extra\n', 2, 4),
    ],
)
def test_a_ragged_csv_row_names_its_file_and_line(
    tmp_path: Path, content: str, line: int, fields: int
) -> None:
    (tmp_path / "d.csv").write_text(content)
    env = {"CTD_CACHE": str(tmp_path / "cache.sqlite")}
    # Port 9 (discard) answers nothing: a request would be a connection error, not this line.
    result = run_ctd(
        "query", "--data", "d.csv", "--out", "o.csv", "--expert-url", "http://127.0.0.1:9/v1",
        "--expert-model", "m", cwd=tmp_path, env=env, timeout=60,
    )  # fmt: skip
    assert_one_line_error(result, f"d.csv:{line}: {fields} fields where the header has 3")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv"]
