"""Malformed inputs and configurations across the expert-stage commands (`ctd query`,
`ctd experts`, `ctd cache`) and the run options that guard them: each is one line naming the
file, line or option, exit code 2, no traceback, and nothing asked of the endpoint, cached or
written. One table of cases, run through the real `ctd` app against a live fault server."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from fault_server import RunningServer
from typer.testing import CliRunner

from harness.cli import app

SECRET = "hunter2-url-password"


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]  # {url} is the fault server's base URL
    fragments: tuple[str, ...]  # each must appear in the one error line
    registry: str = ""  # experts.toml content ({url} filled in)
    files: Callable[[Path], None] | None = None  # builds extra input files


def _expert(**keys: object) -> str:
    lines = ["[experts.judge]", 'base_url = "{url}"', 'model = "fault-model"']
    lines += [f"{k} = {json.dumps(v) if isinstance(v, str) else v}" for k, v in keys.items()]
    return "\n".join(lines) + "\n"


def _write(name: str, content: bytes | str) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        path = folder / name
        if name.endswith("/"):
            path.mkdir()
        else:
            path.write_bytes(content if isinstance(content, bytes) else content.encode())

    return make


QUERY = ("query", "--data", "data.jsonl", "--out", "out.csv")
BY_URL = ("--expert-url", "{url}", "--expert-model", "fault-model")
BY_NAME = ("--expert", "judge")


def _data_case(name: str, content: bytes | str, fragment: str) -> Case:
    """`ctd query` on a dataset file `name` holding `content`."""
    return Case(
        ("query", "--data", name, "--out", "o.csv", *BY_URL), (fragment,), files=_write(name, content)
    )


CASES: dict[str, Case] = {
    # the dataset
    "data missing": Case((*QUERY[:2], "nope.jsonl", *QUERY[3:], *BY_URL), ("nope.jsonl: no such file",)),
    "data folder": Case(
        ("query", "--data", "folder", "--out", "o.csv", *BY_URL),
        ("folder: is a folder",),
        files=_write("folder/", ""),
    ),
    "data not utf-8": _data_case(
        "l1.jsonl", b'{"inputs": "fine"}\n{"inputs": "caf\xe9"}\n', "l1.jsonl:2: not UTF-8"
    ),
    "data bad json": _data_case("bad.jsonl", '{"inputs": "a"}\n{"inputs": \n', "bad.jsonl:2: malformed JSON"),
    "data unknown label": _data_case(
        "lab.jsonl", '{"inputs": "a", "labels": "maybe"}\n', "lab.jsonl:1: label 'maybe'"
    ),
    "data repeated id": _data_case(
        "dup.jsonl",
        '{"ids": "x", "inputs": "a"}\n{"ids": "x", "inputs": "b"}\n',
        "dup.jsonl:2: id 'x' repeats",
    ),
    "data no inputs": _data_case("noin.jsonl", '{"text": "a"}\n', "noin.jsonl:1: missing field 'inputs'"),
    # rows that read, but fail later: at the data hash (UnicodeEncodeError), in json (RecursionError),
    # silently (the last of two columns wins; nothing extracted but a pad token)
    "data lone surrogate": _data_case(
        "sur.jsonl",
        '{"inputs": "ok"}\n{"inputs": "a\\ud800b"}\n',
        "sur.jsonl:2: a lone surrogate escape (\\ud800)",
    ),
    "data nested too deeply": _data_case(
        "deep.jsonl", '{"inputs": ' + "[" * 100_000 + "]" * 100_000 + "}\n", "deep.jsonl:1: malformed JSON"
    ),
    "data csv repeated column": _data_case(
        "rep.csv",
        "inputs,ids,labels,labels\na,x,high-stakes,low-stakes\n",
        "rep.csv:1: column 'labels' appears",
    ),
    "data empty messages": _data_case(
        "em.jsonl", '{"inputs": []}\n', "em.jsonl:1: 'inputs' is an empty list"
    ),
    "data empty messages text": _data_case(
        "emt.jsonl", '{"inputs": "a"}\n{"inputs": "[]"}\n', "emt.jsonl:2: 'inputs' is an empty list"
    ),
    # the output and the cache
    "out .txt": Case((*QUERY[:4], "out.txt", *BY_URL), ("--out out.txt", "unknown file type '.txt'")),
    "out under a file": Case(
        (*QUERY[:4], "plain/o.csv", *BY_URL),
        ("--out plain/o.csv", "not a folder"),
        files=_write("plain", "x"),
    ),
    "out in /proc": Case((*QUERY[:4], "/proc/o.csv", *BY_URL), ("--out /proc/o.csv", "cannot write")),
    "max-failed nan": Case((*QUERY, *BY_URL, "--max-failed", "nan"), ("--max-failed nan",)),
    "max-failed 1": Case((*QUERY, *BY_URL, "--max-failed", "1"), ("--max-failed 1",)),
    "cache not sqlite": Case(
        (*QUERY, *BY_URL, "--cache", "c.sqlite"),
        ("c.sqlite: cannot be used as the cache",),
        files=_write("c.sqlite", "no"),
    ),
    "cache folder": Case(
        (*QUERY, *BY_URL, "--cache", "cdir"), ("cdir: is a folder",), files=_write("cdir/", "")
    ),
    "cache stats not sqlite": Case(
        ("cache", "stats", "--cache", "c.sqlite"),
        ("c.sqlite: cannot be used",),
        files=_write("c.sqlite", "no"),
    ),
    "cache export .txt": Case(("cache", "export", "--out", "x.txt"), ("--out x.txt", "unknown file type")),
    # a list option with an empty item (it used to drop the value silently)
    "budgets empty item": Case(("eval", "--budgets", "0.3,,0.5"), ("--budgets", "item 2 is empty")),
    "batch sizes trailing comma": Case(("eval", "--batch-sizes", "32,64,"), ("--batch-sizes", "item 3")),
    "seeds empty item": Case(("eval", "--seeds", ",1"), ("--seeds", "item 1 is empty")),
    # a list of names with a repeat (it used to run the arch twice: duplicate rows, a later IndexError)
    "arch repeated": Case(
        ("probe", "--out", "p", "--arch", "mean,mean"), ("--arch", "item 2 repeats 'mean'")
    ),
    "eval arch repeated": Case(("eval", "--arch", "mlp,mean,mlp"), ("--arch", "item 3 repeats")),
    "policies repeated": Case(
        ("calibrate", "--scores", "s.csv", "--out", "c", "--policies", "ctd,ctd"),
        ("--policies", "item 2 repeats"),
    ),
    # the expert, by URL
    "url without model": Case((*QUERY, "--expert-url", "{url}"), ("--expert-model",)),
    "url scheme": Case(
        (*QUERY, "--expert-url", "ftp//nope", "--expert-model", "m"), ("--expert-url", "ftp//nope")
    ),
    "url credentials": Case(
        (*QUERY, "--expert-url", f"http://user:{SECRET}@127.0.0.1:9/v1", "--expert-model", "m"),
        ("--expert-url", "--api-key-env"),
    ),
    "unknown expert": Case((*QUERY, "--expert", "nosuch"), ("--expert: unknown expert 'nosuch'",)),
    # the expert, from experts.toml
    "toml rpm nan": Case((*QUERY, *BY_NAME), ("experts.toml:4", "rpm"), registry=_expert(rpm="nan")),
    "toml rpm text": Case((*QUERY, *BY_NAME), ("experts.toml:4", "rpm"), registry=_expert(rpm='"fast"')),
    "toml timeout nan": Case(
        (*QUERY, *BY_NAME), ("experts.toml:4", "timeout"), registry=_expert(timeout="nan")
    ),
    "toml base_url number": Case(
        (*QUERY, *BY_NAME),
        ("experts.toml", "base_url"),
        registry='[experts.judge]\nbase_url = 5\nmodel = "m"\n',
    ),
    "toml unknown key": Case((*QUERY, *BY_NAME), ("experts.toml:4", "modle"), registry=_expert(modle='"m"')),
    "toml tpm below one request": Case((*QUERY, *BY_NAME), ("tpm",), registry=_expert(tpm=1)),
    "toml credentials": Case(
        ("experts", "list"),
        ("experts.toml", "--api-key-env"),
        registry=f'[experts.judge]\nbase_url = "http://u:{SECRET}@h/v1"\nmodel = "m"\n',
    ),
    # experts add
    "add rpm nan": Case(
        ("experts", "add", "j", "--url", "{url}", "--model", "m", "--rpm", "nan"), ("--rpm nan",)
    ),
    "add url scheme": Case(
        ("experts", "add", "j", "--url", "ftp//nope", "--model", "m"), ("--url", "ftp//nope")
    ),
    "add template": Case(
        ("experts", "add", "j", "--url", "{url}", "--model", "m", "--template", "nosuch"),
        ("--template", "nosuch"),
    ),
    "add concurrency 0": Case(
        ("experts", "add", "j", "--url", "{url}", "--model", "m", "--concurrency", "0"), ("--concurrency",)
    ),
}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    with RunningServer() as running:
        yield running


def test_there_are_more_than_25_cases() -> None:
    assert len(CASES) >= 25


@pytest.mark.parametrize("name", list(CASES))
def test_malformed_input_is_one_line(
    name: str, server: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CASES[name]
    monkeypatch.chdir(tmp_path)  # the relative names of the cases live here
    rows = [{"ids": f"ex{i}", "inputs": f"item-{i}: risky?", "labels": "low-stakes"} for i in range(5)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    registry = tmp_path / "experts.toml"
    if case.registry:
        registry.write_text(case.registry.replace("{url}", server.url))
    if case.files is not None:
        case.files(tmp_path)
    before = _snapshot(tmp_path)
    requests_before = sum(server.server.counts.requests.values())
    env = {"CTD_CACHE": str(tmp_path / "cache.sqlite"), "CTD_EXPERTS_FILE": str(registry)}
    args = [a.replace("{url}", server.url) for a in case.args]
    result = CliRunner().invoke(app, args, env=env, catch_exceptions=True)
    assert result.exit_code == 2, (name, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in case.fragments:
        assert re.search(re.escape(fragment), lines[0]), (fragment, lines[0])
    assert SECRET not in result.output
    assert sum(server.server.counts.requests.values()) == requests_before  # nothing asked
    assert _snapshot(tmp_path) == before  # nothing cached or written, experts.toml untouched
