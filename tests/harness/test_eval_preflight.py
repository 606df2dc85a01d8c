"""What `ctd eval` checks before any work, and what it needs: every shared path is checked at
once and named as the user gave it; the default expert is named as the default, never as an
option the user did not type; and a run whose expert answers are all in the cache neither
checks nor starts the expert, so it runs with the expert down."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import time
from pathlib import Path

import pytest
from aiohttp import web
from ctd_cli import assert_one_line_error, free_port, run_ctd
from eval_data import FAST, SIZES, eval_env, write_tagged_data
from fault_server import FaultPlan, RunningServer

from harness import InputError
from harness.data import load_data
from harness.expert import resolve_expert
from harness.run import Manifests, Roots, RunConfig, RunContext, RunLayout, RunLog, StageProgress
from harness.stages import QueryStage
from probes import ModelInfo


def eval_args(data: list[str], *extra: str) -> list[str]:
    args = ["eval", "--name", "t", *FAST, *extra]
    for token in data:
        args += ["--data", token]
    return args


def item_requests(server: RunningServer) -> int:
    """Every request the server had: scoring requests and the endpoint check's alike."""
    counts = server.server.counts
    return sum(counts.requests.values()) + counts.models


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize(
    ("variable", "make", "fragments"),
    [
        ("CTD_CACHE", "folder", ["CTD_CACHE=", "is a folder", "SQLite file", "experts.sqlite"]),
        ("CTD_STORE", "file", ["CTD_STORE=", "is a file, where a folder is expected"]),
        ("CTD_MODEL_CACHE", "file", ["CTD_MODEL_CACHE=", "is a file, where a folder is expected"]),
        ("CTD_RUNS_DIR", "file", ["CTD_RUNS_DIR=", "is a file, where a folder is expected"]),
        ("CTD_CACHE", "under a file", ["CTD_CACHE=", "is a file, so nothing can be made under it"]),
    ],
)
def test_a_wrong_kind_of_path_fails_at_once(
    tmp_path: Path, variable: str, make: str, fragments: list[str]
) -> None:
    """Each shared path of the wrong kind is one line naming the variable, exit code 2, at once
    (no data read, no model described, no probe trained), and nothing written. "At once" is
    measured against `ctd --version` (the same interpreter start and command-line imports) in
    the same test: twice that plus 2 s, so a loaded machine slows both alike (a loaded CI run
    took 7.7 s against a fixed 5 s); loading the model or training a probe takes far longer."""
    target = tmp_path / "given"
    if make == "folder":
        target.mkdir()
    else:
        target.write_text("a file\n")
    if make == "under a file":
        target = target / "experts.sqlite"
    env = {**eval_env(tmp_path), variable: str(target)}
    started = time.monotonic()
    assert run_ctd("--version", cwd=tmp_path, env=env, timeout=60).returncode == 0
    start_cost = time.monotonic() - started
    started = time.monotonic()
    result = run_ctd("eval", cwd=tmp_path, env=env, timeout=60)
    took = time.monotonic() - started
    assert took < 2 * start_cost + 2, f"took {took:.1f} s, `ctd --version` {start_cost:.1f} s"
    assert_one_line_error(result, str(target), *fragments)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "store").exists()


def test_a_file_as_runs_dir_names_the_option(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file\n")
    result = run_ctd("eval", "--runs-dir", "taken", cwd=tmp_path, env=eval_env(tmp_path), timeout=60)
    assert_one_line_error(result, "--runs-dir taken: is a file")


# --------------------------------------------------------------------------- naming the expert


def test_the_default_expert_is_named_as_the_default(tmp_path: Path) -> None:
    """A server at the default expert's URL that serves its model but gives no logprobs: the
    line says "the default expert smollm2", never `--expert smollm2`, which the user did not
    type; an expert the user chose is named by the option they typed."""
    env = eval_env(tmp_path)
    data = write_tagged_data(tmp_path / "data")
    with RunningServer(FaultPlan(logprobs=False), model="smollm2") as server:
        env["CTD_SMOLLM2_URL"] = server.url
        result = run_ctd(*eval_args(data), cwd=tmp_path, env=env, timeout=120)
        assert_one_line_error(result, "error: the default expert smollm2: ", "logprobs")
        assert "--expert smollm2" not in result.stderr
        experts_file = tmp_path / "experts.toml"
        experts_file.write_text(f'[experts.mine]\nbase_url = "{server.url}"\nmodel = "smollm2"\n')
        env["CTD_EXPERTS_FILE"] = str(experts_file)
        result = run_ctd(*eval_args(data, "--expert", "mine"), cwd=tmp_path, env=env, timeout=120)
        assert_one_line_error(result, "error: --expert mine: ", "logprobs")


@pytest.mark.skipif(
    importlib.util.find_spec("xllamacpp") is None, reason="xllamacpp (llama.cpp's server) is not installed"
)
def test_another_program_on_a_local_experts_port_lets_the_run_serve_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What answers at the default expert's URL lists another model: the run may start its own
    server (which moves to a free port), instead of refusing. One that refuses the request
    (an API key) is still refused, by its name: starting a second server beside it is not
    what its owner wants."""
    named = "the default expert smollm2"
    with RunningServer(model="another-model") as other:
        monkeypatch.setenv("CTD_SMOLLM2_URL", other.url)
        expert = resolve_expert("smollm2", named=named)
        assert expert.preflight(serve=True) is True
        with pytest.raises(InputError, match=r"^the default expert smollm2: .*serves another-model"):
            expert.preflight(serve=False)

    @web.middleware
    async def require_key(request: web.Request, handler):  # type: ignore[no-untyped-def]
        return web.json_response({"error": "unauthorized"}, status=401)

    locked = RunningServer(model="smollm2")
    locked.server.app.middlewares.append(require_key)
    with locked:
        monkeypatch.setenv("CTD_SMOLLM2_URL", locked.url)
        with pytest.raises(InputError, match=r"^the default expert smollm2: .*HTTP 401"):
            resolve_expert("smollm2", named=named).preflight(serve=True)


def test_eval_help_says_what_each_shared_path_is(tmp_path: Path) -> None:
    helped = " ".join(run_ctd("eval", "--help", cwd=tmp_path).stdout.split())  # unwrapped
    assert "$CTD_CACHE (the expert cache: a SQLite file, not a folder)" in helped
    assert "$CTD_STORE (the activation store, a folder)" in helped


# --------------------------------------------------------------------------- a cached run


def test_a_run_whose_answers_are_all_cached_needs_no_expert(tmp_path: Path) -> None:
    """A run against a served expert, then its query stage's output deleted, so that the rerun
    must query again: with the expert gone and another program on its port (which serves
    another model, so any check of it would refuse), the rerun answers every example from the
    cache and succeeds, and that program heard nothing."""
    env = eval_env(tmp_path)
    data = write_tagged_data(tmp_path / "data")
    with RunningServer() as server:
        args = eval_args(data, "--expert", server.url, "--expert-model", "fault-model", "--json")
        first = run_ctd(*args, cwd=tmp_path, env=env, timeout=900)
        assert first.returncode == 0, first.stderr
        port = server.port
    run = tmp_path / "runs" / "t"
    (run / "query" / "expert_scores.parquet").unlink()
    with RunningServer(model="another-model", port=port) as stranger:
        again = run_ctd(*args, cwd=tmp_path, env=env, timeout=900)
        assert again.returncode == 0, again.stderr
        assert item_requests(stranger) == 0
    query = next(s for s in json.loads(again.stdout)["stages"] if s["stage"] == "query")
    examples = SIZES["dev"] + SIZES["test"]
    assert query["status"] == "ran"
    assert query["detail"].startswith(f"0 scored, {examples} cached, 0 failed"), query["detail"]
    assert (
        f"all {examples} answers are in the cache; the expert is not needed" in (run / "log.txt").read_text()
    )
    # Nothing listens there now: the same again.
    (run / "query" / "expert_scores.parquet").unlink()
    down = run_ctd(*args, cwd=tmp_path, env=env, timeout=900)
    assert down.returncode == 0, down.stderr


def query_context(tmp_path: Path, url: str) -> RunContext:
    """The query stage's context of a run on the tagged data, against the expert at `url`."""
    data = load_data(write_tagged_data(tmp_path / "data"))
    roots = Roots(runs=tmp_path / "runs", store=tmp_path / "store", cache=tmp_path / "cache.sqlite")
    layout = roots.run("t")
    return RunContext(
        config=RunConfig(name="t", expert=url, expert_model="fault-model"),
        roots=roots,
        layout=layout,
        manifests=Manifests(layout),
        data=data,
        expert=resolve_expert(url, model="fault-model"),
        model=ModelInfo(identity="unused by the query stage", n_layers=1, config=None),
        progress=StageProgress(enabled=False),
    )


def test_answers_gone_from_the_cache_since_the_run_began_are_asked_after_a_check(tmp_path: Path) -> None:
    """The stage was set up without the expert (every answer cached when the run began), but
    the cache no longer holds them (here: it never did): the stage checks the expert and asks
    it then. With every answer now cached, the same stage runs with the expert gone."""
    examples = SIZES["dev"] + SIZES["test"]
    with RunningServer() as server:
        ctx = query_context(tmp_path, server.url)
        result = QueryStage(ctx, checked=False).run()
        assert server.server.counts.models >= 1  # the check came first
        assert sum(server.server.counts.requests.values()) >= examples
    assert result.detail.startswith(f"{examples} scored, 0 cached"), result.detail
    assert "answers left the cache since the run began" in ctx.layout.text_log.read_text()
    result = QueryStage(ctx, checked=False).run()  # nothing listens at the URL now
    assert result.detail.startswith(f"0 scored, {examples} cached"), result.detail


def test_a_missing_answer_with_the_expert_down_still_fails_before_any_work(tmp_path: Path) -> None:
    """The counterpart: with one answer missing and nothing at the expert's URL, the run refuses
    at once, naming the expert, as it always did."""
    dead = f"http://127.0.0.1:{free_port()}/v1"
    data = write_tagged_data(tmp_path / "data")
    result = run_ctd(
        *eval_args(data, "--expert", dead, "--expert-model", "fault-model"),
        cwd=tmp_path,
        env=eval_env(tmp_path),
        timeout=120,
    )
    assert_one_line_error(result, f"error: --expert {dead}: cannot reach")
    assert not list((tmp_path / "store").glob("*/complete.json"))


def test_a_second_invocation_of_a_running_run_is_one_line_and_touches_nothing(tmp_path: Path) -> None:
    """While an invocation runs (its lock held here, as a running `ctd eval` holds it), another of
    the same run is refused in one line, exit 2, before it writes: two at once would each rewrite
    run.json whole, and one invocation's record (its costs with it) would be lost."""
    layout = RunLayout(tmp_path / "runs" / "held")
    layout.root.mkdir(parents=True)
    RunLog().write(layout.run_log)  # an earlier invocation's record
    record = layout.run_log.read_bytes()
    with open(layout.lock, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        before = sorted(p.name for p in layout.root.iterdir())
        done = run_ctd("eval", "--name", "held", *FAST, cwd=tmp_path, env=eval_env(tmp_path))
    assert_one_line_error(done, f"{layout.root}: another `ctd eval` of this run is running")
    assert sorted(p.name for p in layout.root.iterdir()) == before
    assert layout.run_log.read_bytes() == record


def test_batch_tokens_below_max_tokens_is_one_line_before_the_run_folder_is_written(tmp_path: Path) -> None:
    done = run_ctd(
        "eval", "--name", "tight", *FAST, "--batch-tokens", "64", cwd=tmp_path, env=eval_env(tmp_path)
    )
    assert_one_line_error(done, "--max-tokens 96 / --batch-tokens 64: need 1 <= max-tokens <= batch-tokens")
    assert not (tmp_path / "runs" / "tight").exists()
