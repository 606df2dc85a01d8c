"""`ctd query --batch-out` / `--batch-in`: a data set's expert requests as an OpenAI batch file keyed
by the cache key, answered elsewhere (here: each line posted to the fault server, whose answers
are written in the batch output format of `vllm run-batch` and OpenAI's Batch API), committed to
the cache with the client's own scoring, after which a plain `ctd query` pays for nothing and
gives the table a direct `ctd query` gives. The real `vllm run-batch` round trip is in
tests/harness/test_vllm_batch.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from ctd_cli import assert_one_line_error, run_ctd
from fault_server import RunningServer

import experts
from experts import BatchAnswer, read_batch_results
from harness import InputError
from harness.data import read_dataset, read_table
from harness.expert import resolve_expert
from harness.stages import batch_out, preflight_cache

ITEMS = 1000
SECRET = "sk-batch-secret-0123456789"  # the expert's API key: it must reach no batch file
BEARER = "q1w2e3r4t5y6u7i8"  # a bearer token a results file quotes


def write_data(folder: Path, n: int, *, name: str = "data.jsonl") -> Path:
    """`n` distinct conversations (the fault server scores each by its item number), then one
    more example with the input of the first (a duplicate: the same cache key)."""
    rows = [
        {
            "ids": f"ex{i}",
            "inputs": f"item-{i}: is this risky?",
            "labels": ("low-stakes", "high-stakes")[i % 2],
        }
        for i in range(n)
    ]
    rows.append({"ids": "ex0-again", "inputs": rows[0]["inputs"], "labels": rows[0]["labels"]})
    path = folder / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


class Expert:
    """The fault server registered as expert `fault` (scoring `method`, a key read from
    $FAULT_KEY), and `ctd` run against it with the cache at `cache`."""

    def __init__(self, folder: Path, url: str, method: str, *, template: str | None = None) -> None:
        self.folder = folder
        self.registry = folder / f"experts-{method}.toml"
        extra = f'template = "{template}"\n' if template else ""
        self.registry.write_text(
            f'[experts.fault]\nbase_url = "{url}"\nmodel = "fault-model"\nmethod = "{method}"\n'
            f'api_key_env = "FAULT_KEY"\nmax_attempts = 2\nconcurrency = 32\n{extra}'
        )

    def ctd(self, *args: str, cache: str = "cache.sqlite", timeout: float = 300) -> Any:
        env = {
            "CTD_CACHE": str(self.folder / cache),
            "CTD_EXPERTS_FILE": str(self.registry),
            "FAULT_KEY": SECRET,
        }
        return run_ctd(*args, "--expert", "fault", cwd=self.folder, env=env, timeout=timeout)


def answer_batch(requests: Path, root: str, results: Path, *, edit: Any = None) -> int:
    """Post every line's body to `root` + its url and write the answers as batch result lines
    (`edit(line, result)` may change a result before it is written). Returns the lines."""
    lines = [json.loads(line) for line in requests.read_text().splitlines()]
    with httpx.Client(base_url=root, timeout=30) as client, results.open("w") as out:
        for number, line in enumerate(lines):
            assert line["method"] == "POST"
            answer = client.post(line["url"], json=line["body"])
            result = {
                "id": f"batch-req-{number}",
                "custom_id": line["custom_id"],
                "response": {
                    "status_code": answer.status_code,
                    "request_id": f"r{number}",
                    "body": answer.json(),
                },
                "error": None,
            }
            if edit is not None:
                result = edit(line, result)
            if result is not None:
                out.write(json.dumps(result) + "\n")
    return len(lines)


def item_requests(server: RunningServer) -> int:
    """Requests that named an item (the pre-flight check's probes name none)."""
    return sum(n for item, n in server.server.counts.requests.items() if item >= 0)


def stored(path: Path) -> tuple[int, int]:
    if not path.exists():
        return 0, 0
    with sqlite3.connect(path) as db:
        return (
            db.execute("SELECT COUNT(*) FROM scores").fetchone()[0],
            db.execute("SELECT COUNT(*) FROM failures").fetchone()[0],
        )


@pytest.mark.parametrize("method", ["next-token", "likelihood"])
def test_a_1000_item_batch_round_trip_leaves_nothing_to_pay(
    tmp_path: Path, method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_data(tmp_path, ITEMS)
    with RunningServer() as running:
        expert = Expert(tmp_path, running.url, method)
        root = running.url.removesuffix("/v1")

        made = expert.ctd("query", "--data", str(data), "--batch-out", "requests.jsonl", "--json")
        assert made.returncode == 0, made.stderr
        bodies = 2 if method == "likelihood" else 1
        assert json.loads(made.stdout) | {"tokens": 0} == {
            "expert": "fault",
            "out": "requests.jsonl",
            "cache": str(tmp_path / "cache.sqlite"),
            "total": ITEMS + 1,
            "cached": 0,
            "duplicates": 1,
            "to_recover": 0,
            "written": ITEMS,
            "lines": ITEMS * bodies,
            "tokens": 0,
            "dropped": 0,
            "usd": 0.0,  # the expert has no price: the estimate says so, counting the lines written
            "estimate": (
                f"about {ITEMS * bodies} batch lines, $0: fault costs nothing (no price set for it)"
            ),
            "pending": 0,
            "pending_files": {},
        }
        assert json.loads(made.stdout)["tokens"] > ITEMS  # the client's estimate, summed
        assert item_requests(running) == 0  # nothing was sent
        text = (tmp_path / "requests.jsonl").read_text()
        assert SECRET not in text and "FAULT_KEY" not in text
        lines = [json.loads(line) for line in text.splitlines()]
        url = "/v1/chat/completions" if method == "next-token" else "/v1/completions"
        assert {line["url"] for line in lines} == {url}
        assert {line["body"]["model"] for line in lines} == {"fault-model"}
        # KEY@TAG: the item's cache key and the batch's tag, one tag for the whole file
        ids = [line["custom_id"].partition("@") for line in lines]
        assert {at for _, at, _ in ids} == {"@"} and len({tag for *_, tag in ids}) == 1
        if method == "likelihood":  # the two bodies of an item: KEY.0 (high), KEY.1 (low)
            keys = {base.rsplit(".", 1)[0] for base, *_ in ids}
            assert {base[-2:] for base, *_ in ids} == {".0", ".1"} and len(keys) == ITEMS

        assert answer_batch(tmp_path / "requests.jsonl", root, tmp_path / "results.jsonl") == ITEMS * bodies
        paid = item_requests(running)
        committed = expert.ctd(
            "query", "--data", str(data), "--batch-in", "results.jsonl", "--out", "batch.parquet", "--json"
        )
        assert committed.returncode == 0, committed.stderr
        report = json.loads(committed.stdout)
        assert (report["committed"], report["already"], report["failed"]) == (ITEMS, 0, 0)
        assert (report["unmatched"], report["missing"], report["lines"]) == (0, 0, ITEMS * bodies)
        assert stored(tmp_path / "cache.sqlite") == (ITEMS, 0)
        with sqlite3.connect(tmp_path / "cache.sqlite") as db:  # every request read back: none out
            assert db.execute("SELECT COUNT(*) FROM batch_out").fetchone() == (0,)
        # What `ctd eval`'s query stage asks the cache before it starts (or checks) an expert.
        monkeypatch.setenv("CTD_EXPERTS_FILE", str(expert.registry))
        spec = resolve_expert("fault").spec
        assert preflight_cache(tmp_path / "cache.sqlite", spec, read_dataset(data).items) == 0

        rerun = expert.ctd("query", "--data", str(data), "--out", "rerun.parquet")
        assert rerun.returncode == 0, rerun.stderr
        assert item_requests(running) == paid  # the rerun paid for nothing
        assert f"{ITEMS + 1} from the cache" in rerun.stdout

        direct = expert.ctd("query", "--data", str(data), "--out", "direct.parquet", cache="direct.sqlite")
        assert direct.returncode == 0, direct.stderr
    batch, again, asked = (
        read_table(tmp_path / n).columns for n in ("batch.parquet", "rerun.parquet", "direct.parquet")
    )
    assert set(asked["source"].astype(str)) == {"expert"}
    assert set(again["source"].astype(str)) == set(batch["source"].astype(str)) == {"cache"}
    for table in (batch, again):
        assert np.array_equal(table["id"], asked["id"])
        assert np.array_equal(table["label"], asked["label"])
        assert np.array_equal(table["expert"], asked["expert"])  # the same scores, bit for bit
        assert np.array_equal(table["label_mass"], asked["label_mass"], equal_nan=True)
    with sqlite3.connect(tmp_path / "cache.sqlite") as db, sqlite3.connect(tmp_path / "direct.sqlite") as ref:
        columns = "key, expert, item_id, endpoint, model, method, template_sha256, score, label_mass"
        query = f"SELECT {columns} FROM scores ORDER BY key"
        assert db.execute(query).fetchall() == ref.execute(query).fetchall()  # the client's rows


def test_a_second_batch_out_writes_only_what_is_still_missing(tmp_path: Path) -> None:
    data = write_data(tmp_path, 30)
    with RunningServer() as running:
        expert = Expert(tmp_path, running.url, "next-token")
        first_ten = write_data(tmp_path, 10, name="first.jsonl")
        assert expert.ctd("query", "--data", str(first_ten), "--out", "first.csv").returncode == 0
        made = expert.ctd("query", "--data", str(data), "--batch-out", "rest.jsonl")
    assert made.returncode == 0, made.stderr
    assert "31 examples: 11 already in the cache, 0 duplicates" in made.stdout, made.stdout
    assert "wrote 20 request lines for 20 examples" in made.stdout
    assert "nothing was sent" in made.stdout
    assert len((tmp_path / "rest.jsonl").read_text().splitlines()) == 20


def _out_in(cache: Path) -> dict[str, int]:
    """Requests out in batch files, by file name."""
    with sqlite3.connect(cache) as db:
        rows = db.execute("SELECT file, COUNT(*) FROM batch_out GROUP BY file").fetchall()
    return {Path(file).name: n for file, n in rows}


def test_results_read_again_leave_a_later_batch_out(tmp_path: Path) -> None:
    """A failed line lets its request go into a second batch; the first batch's results read
    again (or come late, after a release) must not let that second batch's request go: asked
    live meanwhile, it would be paid twice. Each line's custom_id carries its batch's tag."""
    data = write_data(tmp_path, 6)
    with RunningServer() as running:
        expert = Expert(tmp_path, running.url, "next-token")
        root = running.url.removesuffix("/v1")
        assert expert.ctd("query", "--data", str(data), "--batch-out", "first.jsonl").returncode == 0

        def fail_item_2(line: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
            if "item-2:" in json.dumps(line["body"]):
                result["response"] = {"status_code": 500, "request_id": "r", "body": {"error": "internal"}}
            return result

        answer_batch(tmp_path / "first.jsonl", root, tmp_path / "first-results.jsonl", edit=fail_item_2)
        batch_in = ("query", "--data", str(data), "--batch-in", "first-results.jsonl", "--out", "o.csv")
        assert expert.ctd(*batch_in, "--max-failed", "0.5").returncode == 0
        assert _out_in(tmp_path / "cache.sqlite") == {}
        second = expert.ctd("query", "--data", str(data), "--batch-out", "second.jsonl")
        assert "wrote 1 request lines" in second.stdout, second.stdout
        again = expert.ctd(*batch_in, "--max-failed", "0.5", "--json")
        assert again.returncode == 0, again.stderr
        assert _out_in(tmp_path / "cache.sqlite") == {"second.jsonl": 1}  # still out
        assert json.loads(again.stdout)["failure_reasons"] == {}  # an older batch's failure: not news
        paid = item_requests(running)
        live = expert.ctd("query", "--data", str(data), "--out", "live.csv")
        assert_one_line_error(live, "second.jsonl (1)")
        assert item_requests(running) == paid


def test_a_pair_split_over_two_results_files_is_scored_when_both_are_read(tmp_path: Path) -> None:
    """Likelihood scoring's two lines of an item in two results files of one batch (a provider's
    cap on lines per file): read one at a time, the item stays out, asked neither live nor in a
    new batch; read together, it is scored."""
    data = write_data(tmp_path, 4)
    with RunningServer() as running:
        expert = Expert(tmp_path, running.url, "likelihood")
        root = running.url.removesuffix("/v1")
        assert expert.ctd("query", "--data", str(data), "--batch-out", "batch.jsonl").returncode == 0
        answer_batch(tmp_path / "batch.jsonl", root, tmp_path / "results.jsonl")
        lines = (tmp_path / "results.jsonl").read_text().splitlines(keepends=True)
        (tmp_path / "part1.jsonl").write_text("".join(lines[:3]))  # items 0 and half of 1
        (tmp_path / "part2.jsonl").write_text("".join(lines[3:]))
        for part, out in (("part1.jsonl", 3), ("part2.jsonl", 1)):  # items 2, 3 are in part 2
            read = expert.ctd(
                "query", "--data", str(data), "--batch-in", part, "--out", "o.csv",
                "--max-failed", "0.9", "--json",
            )  # fmt: skip
            assert read.returncode == 0, read.stderr
            assert json.loads(read.stdout)["failed"] == 0
            assert _out_in(tmp_path / "cache.sqlite") == {"batch.jsonl": out}  # the split item among them
        rewritten = expert.ctd("query", "--data", str(data), "--batch-out", "again.jsonl")
        assert "wrote 0 request lines" in rewritten.stdout, rewritten.stdout
        both = expert.ctd(
            "query", "--data", str(data), "--batch-in", "part1.jsonl", "--batch-in", "part2.jsonl",
            "--out", "o.csv", "--json",
        )  # fmt: skip
        assert both.returncode == 0, both.stderr
        assert json.loads(both.stdout)["committed"] == 1 and _out_in(tmp_path / "cache.sqlite") == {}
        paid = item_requests(running)
        assert expert.ctd("query", "--data", str(data), "--out", "live.csv").returncode == 0
        assert item_requests(running) == paid  # every item answered: nothing asked twice


def test_requests_out_in_a_batch_not_read_back_are_not_asked_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second --batch-out before the first batch's results are read back leaves its requests
    out (both submitted, they would be paid twice) and names the file, and a live `ctd query`
    of them is refused before anything is sent; --batch-in of results that lack some items
    releases the rest; `ctd cache release-batch` releases those (a batch never submitted)."""
    data = write_data(tmp_path, 30)
    env = {"CTD_CACHE": str(tmp_path / "cache.sqlite")}
    with RunningServer() as running:
        expert = Expert(tmp_path, running.url, "next-token")

        def batch_out(name: str) -> dict[str, Any]:
            made = expert.ctd("query", "--data", str(data), "--batch-out", name, "--json")
            assert made.returncode == 0, made.stderr
            return json.loads(made.stdout)

        def live_refused(n: int) -> None:
            refused = expert.ctd("query", "--data", str(data), "--out", "live.csv")
            assert_one_line_error(
                refused, f"{n} of the requests to fault are out in batch files", "paid twice"
            )
            assert "ctd cache release-batch FILE" in refused.stderr and item_requests(running) == 0

        first = batch_out("first.jsonl")
        assert (first["written"], first["pending"]) == (30, 0)
        stats = run_ctd("cache", "stats", "--json", cwd=tmp_path, env=env)
        assert json.loads(stats.stdout)["experts"]["fault"]["batch_out"] == 30, stats.stderr
        again = expert.ctd("query", "--data", str(data), "--batch-out", "again.jsonl")
        assert again.returncode == 0, again.stderr
        assert "wrote 0 request lines for 0 examples" in again.stdout
        said = " ".join(again.stdout.split())  # the terminal wraps the line
        assert "left out 30 requests out in earlier batch files" in said
        assert f"{tmp_path / 'first.jsonl'} (30)" in said and "ctd cache release-batch FILE" in said
        assert (tmp_path / "again.jsonl").read_text() == ""
        live_refused(30)
        # `ctd eval` asks the cache this before it checks or starts an expert: refused there too.
        monkeypatch.setenv("CTD_EXPERTS_FILE", str(expert.registry))
        with pytest.raises(InputError, match="30 of the requests to fault are out in batch files"):
            preflight_cache(tmp_path / "cache.sqlite", resolve_expert("fault").spec, read_dataset(data).items)

        def drop_five(line: dict[str, Any], result: dict[str, Any]) -> dict[str, Any] | None:
            item = int(line["body"]["messages"][-1]["content"].split("item-")[1].split(":")[0])
            return None if item < 5 else result

        root = running.url.removesuffix("/v1")
        answer_batch(tmp_path / "first.jsonl", root, tmp_path / "r.jsonl", edit=drop_five)
        committed = expert.ctd(
            "query", "--data", str(data), "--batch-in", "r.jsonl", "--out", "t.csv", "--max-failed", "0.5"
        )
        assert committed.returncode == 0, committed.stderr
        third = batch_out("third.jsonl")  # 25 answered; items 0-4 are still out in first.jsonl
        assert (third["cached"], third["duplicates"], third["written"], third["pending"]) == (25, 1, 0, 5)
        assert third["pending_files"] == {str(tmp_path / "first.jsonl"): 5} and third["usd"] == 0
        running.server.counts.requests.clear()
        live_refused(5)

        released = run_ctd("cache", "release-batch", "first.jsonl", "--json", cwd=tmp_path, env=env)
        assert json.loads(released.stdout)["released"] == 5, released.stderr
        fourth = batch_out("fourth.jsonl")
        assert (fourth["written"], fourth["pending"]) == (5, 0)
        assert len((tmp_path / "fourth.jsonl").read_text().splitlines()) == 5
        assert item_requests(running) == 0  # nothing was sent since the batch was answered
    unknown = run_ctd("cache", "release-batch", "first.jsonl", cwd=tmp_path, env=env)
    listed = f"the batch files with requests out there: {tmp_path / 'fourth.jsonl'} (5)"
    assert_one_line_error(unknown, "first.jsonl: no requests of this batch file", listed)


def test_a_batch_recorded_out_whose_file_is_not_there_is_said_so(tmp_path: Path) -> None:
    """A --batch-out stopped between its record and its rename leaves a record of a file that is
    not there (as does a batch file deleted since): the next --batch-out of that name is refused
    in one line that says so and gives the command that releases it; another name leaves its
    requests out, naming the file as not found; once released, the name writes every request."""
    data = write_data(tmp_path, 10)
    cache = tmp_path / "cache.sqlite"
    with RunningServer() as running:
        expert = Expert(tmp_path, running.url, "next-token")
        made = expert.ctd("query", "--data", str(data), "--batch-out", "lost.jsonl")
        assert made.returncode == 0, made.stderr
        (tmp_path / "lost.jsonl").unlink()  # the state a stop before the rename leaves
        lost = tmp_path / "lost.jsonl"
        again = expert.ctd("query", "--data", str(data), "--batch-out", "lost.jsonl")
        assert_one_line_error(
            again,
            f"{lost} (not found here) names 10 requests of another batch still out",
            f"`ctd cache release-batch {lost} --cache {cache}` first",
        )
        assert not lost.exists()
        other = expert.ctd("query", "--data", str(data), "--batch-out", "other.jsonl")
        assert other.returncode == 0, other.stderr
        assert f"{lost} (10, not found here)" in " ".join(other.stdout.split())
        released = run_ctd("cache", "release-batch", str(lost), cwd=tmp_path, env={"CTD_CACHE": str(cache)})
        assert released.returncode == 0, released.stderr
        made = expert.ctd("query", "--data", str(data), "--batch-out", "lost.jsonl", "--json")
        assert made.returncode == 0, made.stderr
        assert json.loads(made.stdout)["written"] == 10 and len(lost.read_text().splitlines()) == 10
        assert item_requests(running) == 0  # a batch file sends nothing


def test_two_batch_outs_at_once_never_both_write_a_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second --batch-out records its requests while the first is writing the same ones (the
    first has looked, and found none out): the first then records nothing, removes its file and
    says so in one line; the second's file and record stand."""
    data = write_data(tmp_path, 30)
    expert = Expert(tmp_path, "http://127.0.0.1:9/v1", "next-token")  # never asked: nothing is sent
    monkeypatch.setenv("CTD_EXPERTS_FILE", str(expert.registry))
    monkeypatch.setenv("FAULT_KEY", SECRET)
    spec = resolve_expert("fault").spec
    cache = tmp_path / "cache.sqlite"
    lines_of = experts.batch_request_lines
    others: list[Any] = []  # the other run: started, then its summary

    def another_run_meanwhile(*args: Any, **kwargs: Any) -> Any:
        yield from lines_of(*args, **kwargs)  # this run has looked: nothing out
        if not others:  # the other run, once, between this one's look and its record
            others.append("started")
            others.append(batch_out(data, spec, tmp_path / "other.jsonl", cache_path=cache))

    monkeypatch.setattr(experts, "batch_request_lines", another_run_meanwhile)
    with pytest.raises(InputError, match="another --batch-out wrote 30 of these requests") as refused:
        batch_out(data, spec, tmp_path / "first.jsonl", cache_path=cache)
    other = tmp_path / "other.jsonl"
    assert str(other) in str(refused.value) and "nothing was written" in str(refused.value)
    assert not (tmp_path / "first.jsonl").exists() and list(tmp_path.glob(".first.jsonl*")) == []
    assert others[1].written == 30 and len(other.read_text().splitlines()) == 30
    with sqlite3.connect(cache) as db:
        assert db.execute("SELECT DISTINCT file FROM batch_out").fetchall() == [(str(other),)]


# --------------------------------------------------------------------------- failures, counted


def test_failed_lines_are_recorded_and_asked_again_and_stored_scores_are_kept(tmp_path: Path) -> None:
    """One batch with every kind of line: a server error, a runner's error, an answer without
    the label tokens, half of a likelihood pair, a line for another item, and answers for items
    some run already stored (with a different score here, so an overwrite would show)."""
    data = write_data(tmp_path, 12)
    with RunningServer() as running:
        expert = Expert(tmp_path, running.url, "likelihood")
        root = running.url.removesuffix("/v1")
        assert expert.ctd("query", "--data", str(data), "--batch-out", "requests.jsonl").returncode == 0
        before = write_data(tmp_path, 3, name="before.jsonl")  # ex0..ex2 answered by a run meanwhile
        # (asked live while out in the batch, they are refused: the batch is released first)
        env = {"CTD_CACHE": str(tmp_path / "cache.sqlite")}
        assert run_ctd("cache", "release-batch", "requests.jsonl", cwd=tmp_path, env=env).returncode == 0
        assert expert.ctd("query", "--data", str(before), "--out", "before.parquet").returncode == 0
        kept = read_table(tmp_path / "before.parquet").columns["expert"].astype(float)

        def edit(line: dict[str, Any], result: dict[str, Any]) -> dict[str, Any] | None:
            item = int(line["body"]["prompt"].split("item-")[1].split(":")[0])
            half = line["custom_id"].partition("@")[0][-1]  # KEY.N@TAG
            if item < 3 and half == "0":  # a different answer for the stored items: P(high) moves
                logprobs = result["response"]["body"]["choices"][0]["logprobs"]["token_logprobs"]
                logprobs[1:-1] = [value - 3.0 for value in logprobs[1:-1]]
            if item == 3:
                result["response"] = {"status_code": 500, "request_id": "r", "body": {"error": "internal"}}
            if item == 4 and half == "1":
                result["response"] = None
                result["error"] = {"code": "batch_expired", "message": "This request could not be executed"}
            if item == 5:
                result["response"]["body"]["choices"][0].pop("logprobs")
            if item == 6 and half == "1":
                return None  # the low answer's line is missing
            if item == 7:
                return None  # not in this batch at all
            return result

        answer_batch(tmp_path / "requests.jsonl", root, tmp_path / "results.jsonl", edit=edit)
        with (tmp_path / "results.jsonl").open("a") as out:  # a line of another batch
            out.write(
                json.dumps(
                    {"id": "x", "custom_id": "f" * 64, "response": {"status_code": 200}, "error": None}
                )
            )
        committed = expert.ctd(
            "query", "--data", str(data), "--batch-in", "results.jsonl", "--out", "batch.parquet",
            "--max-failed", "0.5", "--json",
        )  # fmt: skip
        assert committed.returncode == 0, committed.stderr
        report = json.loads(committed.stdout)
        assert report["failure_reasons"] == {"http-500": 1, "batch-error": 1, "no-logprobs": 1}, report
        assert (report["committed"], report["already"], report["failed"]) == (4, 3, 3)
        # Half a pair is no failure (the rest may be in another results file of the batch): it is
        # missing, as is the item not in these results (released above, neither is out).
        assert (report["unmatched"], report["missing"]) == (1, 2) and report["still_out"] == {}

        table = read_table(tmp_path / "batch.parquet").columns
        rows = zip(table["source"].astype(str), table["reason"].astype(str), strict=True)
        by_id = dict(zip(table["id"].astype(str), rows, strict=True))
        assert by_id["ex3"] == ("failed", "http-500") and by_id["ex4"] == ("failed", "batch-error")
        assert by_id["ex6"] == ("failed", "batch-incomplete") and by_id["ex7"] == ("failed", "not-in-batch")
        assert np.array_equal(
            table["expert"].astype(float)[:3], kept[:3]
        )  # stored scores kept, not overwritten
        paid = item_requests(running)
        rerun = expert.ctd("query", "--data", str(data), "--out", "rerun.csv")
        assert rerun.returncode == 0, rerun.stderr
        # Only the 5 failed or missing items are asked again (2 requests each: likelihood).
        assert item_requests(running) - paid == 10
    assert "5 scored" in rerun.stdout


def test_items_left_without_an_answer_exit_1_past_max_failed(tmp_path: Path) -> None:
    data = write_data(tmp_path, 10)
    with RunningServer() as running:
        expert = Expert(tmp_path, running.url, "next-token")
        assert expert.ctd("query", "--data", str(data), "--batch-out", "requests.jsonl").returncode == 0
        root = running.url.removesuffix("/v1")
        answer_batch(tmp_path / "requests.jsonl", root, tmp_path / "results.jsonl")
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    (tmp_path / "half.jsonl").write_text("\n".join(lines[:5]) + "\n")
    result = expert.ctd("query", "--data", str(data), "--batch-in", "half.jsonl", "--out", "out.csv")
    assert result.returncode == 1, result.stderr
    assert "5 of 11 failed" in result.stderr and "0 failed in the batch, 5 not in it" in result.stderr
    assert stored(tmp_path / "cache.sqlite") == (5, 0)  # what the batch answered is kept
    assert (tmp_path / "out.csv").exists()


# --------------------------------------------------------------------------- bad input: one line, exit 2


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A folder with a data file and its next-token batch's results, and the expert's URL (the
    server is gone: nothing below may send anything), made once for the tests below."""
    folder = tmp_path_factory.mktemp("made")
    data = write_data(folder, 6)
    with RunningServer() as running:
        expert = Expert(folder, running.url, "next-token")
        assert expert.ctd("query", "--data", str(data), "--batch-out", "requests.jsonl").returncode == 0
        answer_batch(folder / "requests.jsonl", running.url.removesuffix("/v1"), folder / "results.jsonl")
        return folder, running.url


@pytest.fixture()
def answered(tmp_path: Path, made: tuple[Path, str]) -> tuple[Path, Path, str]:
    """The data file and the results of `made`, copied into this test's folder (no cache yet)."""
    folder, url = made
    for name in ("data.jsonl", "results.jsonl"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    return tmp_path / "data.jsonl", tmp_path / "results.jsonl", url


def test_a_malformed_result_line_commits_nothing(tmp_path: Path, answered: tuple[Path, Path, str]) -> None:
    data, results, url = answered
    lines = results.read_text().splitlines()
    lines.insert(2, '{"custom_id": "abc", "response": {"status_code": 200, "body": {')
    results.write_text("\n".join(lines) + "\n")
    result = Expert(tmp_path, url, "next-token").ctd(
        "query", "--data", str(data), "--batch-in", str(results), "--out", "out.csv"
    )
    assert_one_line_error(result, f"{results}:3: not JSON")
    assert stored(tmp_path / "cache.sqlite") == (0, 0) and not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("[1, 2]", ":4: expected a result object, found list"),
        ('{"response": {"status_code": 200, "body": {}}}', ":4: no custom_id"),
        ('{"custom_id": "k", "response": null, "error": null}', ":4: neither a response nor an error"),
        (
            '{"custom_id": "k", "response": {"status_code": "200"}}',
            ":4: response.status_code must be an integer",
        ),
        ('{"custom_id": "k", "response": ' + "[" * 200_000 + "]" * 200_000 + "}", ":4: nested too deeply"),
    ],
    ids=["list", "no-custom-id", "neither", "status-text", "deep"],
)
def test_a_line_that_is_no_result_is_named(
    tmp_path: Path, answered: tuple[Path, Path, str], line: str, problem: str
) -> None:
    data, results, url = answered
    results.write_text("\n".join([*results.read_text().splitlines()[:3], line]) + "\n")
    result = Expert(tmp_path, url, "next-token").ctd(
        "query", "--data", str(data), "--batch-in", str(results), "--out", "out.csv"
    )
    assert_one_line_error(result, f"{results}{problem}")
    assert stored(tmp_path / "cache.sqlite") == (0, 0)


def test_an_error_message_that_is_not_unicode_is_stored_escaped(
    tmp_path: Path, answered: tuple[Path, Path, str]
) -> None:
    """A runner's error whose message holds a lone surrogate (valid JSON, not Unicode): recorded
    as a failure with the surrogate escaped, not a traceback."""
    data, results, url = answered
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    lines[0]["response"], lines[0]["error"] = None, {"code": "x", "message": "bad \ud800 text"}
    results.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = Expert(tmp_path, url, "next-token").ctd(
        "query", "--data", str(data), "--batch-in", str(results), "--out", "out.csv", "--max-failed", "0.5"
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    with sqlite3.connect(tmp_path / "cache.sqlite") as db:
        (message,) = db.execute("SELECT message FROM failures").fetchone()
    assert "bad \\ud800 text" in message, message


def test_a_repeated_custom_id_is_named(tmp_path: Path, answered: tuple[Path, Path, str]) -> None:
    data, results, url = answered
    first = results.read_text().splitlines()[0]
    (tmp_path / "errors.jsonl").write_text(first + "\n")  # as if an error file held it again
    result = Expert(tmp_path, url, "next-token").ctd(
        "query",
        "--data",
        str(data),
        "--batch-in",
        str(results),
        "--batch-in",
        "errors.jsonl",
        "--out",
        "o.csv",
    )
    assert_one_line_error(result, "errors.jsonl:1: custom_id", f"repeats {results}:1")
    assert stored(tmp_path / "cache.sqlite") == (0, 0)


@pytest.mark.parametrize(
    ("method", "template"), [("likelihood", None), ("next-token", "fine-v1")], ids=["method", "template"]
)
def test_results_for_another_expert_match_nothing(
    tmp_path: Path, answered: tuple[Path, Path, str], method: str, template: str | None
) -> None:
    """The batch was made with next-token scoring and the default template: read back with
    another method or another template, no custom_id is any item's key."""
    data, results, url = answered
    result = Expert(tmp_path, url, method, template=template).ctd(
        "query", "--data", str(data), "--batch-in", str(results), "--out", "out.csv"
    )
    assert_one_line_error(result, "none of the 6 result lines answers an item", "fault")
    assert stored(tmp_path / "cache.sqlite") == (0, 0)


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (("--batch-out", "r.jsonl", "--batch-in", "results.jsonl", "--out", "o.csv"), "give one"),
        (("--batch-out", "r.txt"), "--batch-out r.txt: unknown file type '.txt'"),
        (("--batch-out", "r.jsonl", "--out", "o.csv"), "--out with --batch-out"),
        (("--batch-in", "results.jsonl"), "--out is required with --batch-in"),
        (("--batch-in", "absent.jsonl", "--out", "o.csv"), "--batch-in absent.jsonl: no such file"),
    ],
)
def test_batch_options_that_cannot_work_are_one_line(
    tmp_path: Path, answered: tuple[Path, Path, str], args: tuple[str, ...], problem: str
) -> None:
    data, _, url = answered
    result = Expert(tmp_path, url, "next-token").ctd("query", "--data", str(data), *args)
    assert_one_line_error(result, problem)
    assert stored(tmp_path / "cache.sqlite") == (0, 0)
    assert not (tmp_path / "r.jsonl").exists() and not (tmp_path / "o.csv").exists()


# --------------------------------------------------------------------------- what a results file may hold


def test_secrets_in_results_stay_out_of_the_cache_and_unlabelled_answers_are_left_to_the_ladder(
    tmp_path: Path,
) -> None:
    """A results file that quotes a key in an error and echoes the expert's own key in an answer:
    neither reaches the cache. An answer without label tokens is a failure the live client would
    try to recover: the next --batch-out leaves it out (the same request would get the same
    answer, paid again) and says so, and a live `ctd query` asks it. The batch's answers are
    priced from their usage."""
    data = write_data(tmp_path, 8)
    leaked = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWXYZ0123"  # not this expert's key: found by its shape
    with RunningServer() as running:
        expert = Expert(tmp_path, running.url, "next-token")
        priced = expert.registry.read_text() + "price_input = 2.0\nprice_output = 8.0\nbatch_discount = 0.5\n"
        expert.registry.write_text(priced)
        assert expert.ctd("query", "--data", str(data), "--batch-out", "requests.jsonl").returncode == 0

        def edit(line: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
            item = int(line["body"]["messages"][-1]["content"].split("item-")[1].split(":")[0])
            body = result["response"]["body"]
            if item == 2:  # an answer whose top tokens hold neither label
                for entry in body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]:
                    entry["token"] = "perhaps"
            if item == 3:
                said = f"Incorrect API key provided: {leaked}. Authorization: Bearer {BEARER}"
                error = {"error": {"message": said}}
                result["response"] = {"status_code": 401, "request_id": "r", "body": error}
            if item == 4:
                body["echo"] = f"your key is {SECRET}"
            return result

        answer_batch(
            tmp_path / "requests.jsonl",
            running.url.removesuffix("/v1"),
            tmp_path / "results.jsonl",
            edit=edit,
        )
        usage = sum(
            json.loads(line)["response"]["body"].get("usage", {}).get(kind, 0) * price
            for line in (tmp_path / "results.jsonl").read_text().splitlines()
            for kind, price in (("prompt_tokens", 2.0), ("completion_tokens", 8.0))
        )
        committed = expert.ctd(
            "query", "--data", str(data), "--batch-in", "results.jsonl", "--out", "batch.csv",
            "--max-failed", "0.5", "--json",
        )  # fmt: skip
        assert committed.returncode == 0, committed.stderr
        report = json.loads(committed.stdout)
        assert report["failure_reasons"] == {"no-label-mass": 1, "http-401": 1}
        assert report["usd"] == pytest.approx(usage / 1e6 * 0.5) and usage > 0
        with sqlite3.connect(tmp_path / "cache.sqlite") as db:
            stored_text = " ".join(
                str(value)
                for table in ("scores", "failures")
                for row in db.execute(f"SELECT * FROM {table}").fetchall()
                for value in row
            )
        assert SECRET not in stored_text and leaked not in stored_text and BEARER not in stored_text
        assert "Incorrect API key provided" in stored_text  # the message itself is kept

        again = expert.ctd("query", "--data", str(data), "--batch-out", "again.jsonl", "--json")
        assert again.returncode == 0, again.stderr
        second = json.loads(again.stdout)
        assert (second["to_recover"], second["written"]) == (1, 1)  # item 2 left out, item 3 asked
        assert "item-3:" in (tmp_path / "again.jsonl").read_text()
        shown = expert.ctd("query", "--data", str(data), "--batch-out", "third.jsonl")
        assert "left out 1 requests answered before without label tokens" in shown.stdout

        # again.jsonl was never submitted: its request (item 3) is released to be asked live.
        env = {"CTD_CACHE": str(tmp_path / "cache.sqlite")}
        assert run_ctd("cache", "release-batch", "again.jsonl", cwd=tmp_path, env=env).returncode == 0
        paid = item_requests(running)
        live = expert.ctd("query", "--data", str(data), "--out", "live.csv")
        assert live.returncode == 0, live.stderr
        assert item_requests(running) - paid == 2  # items 2 and 3, live


def test_batch_out_never_replaces_a_file(tmp_path: Path, answered: tuple[Path, Path, str]) -> None:
    """Not the data set, not a batch's paid results: --batch-out names a new file."""
    data, results, url = answered
    before = {path: path.read_bytes() for path in (data, results)}
    expert = Expert(tmp_path, url, "next-token")
    for path in (data, results):
        refused = expert.ctd("query", "--data", str(data), "--batch-out", str(path))
        assert_one_line_error(refused, f"--batch-out {path}: already exists")
    assert {path: path.read_bytes() for path in (data, results)} == before
    (tmp_path / "folder.jsonl").mkdir()
    folder = expert.ctd("query", "--data", str(data), "--batch-in", "folder.jsonl", "--out", "o.csv")
    assert_one_line_error(folder, "--batch-in folder.jsonl: is a folder")


def test_a_short_key_is_not_masked_and_an_empty_answer_is_no_answer_to_recover(
    answered: tuple[Path, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local server's token such as "1" is no secret: masking it would garble every line of the
    results (its digits). A line with status 200 and no body was not answered: its reason is not
    one the recovery ladder (and so the next --batch-out) treats as an answer without labels."""
    _, results, _ = answered
    monkeypatch.setenv("SHORT_KEY", "1")
    assert read_batch_results([results], api_key_env="SHORT_KEY") == read_batch_results([results])
    failure = BatchAnswer(f"{results}:1", 200, None, None).failure()
    assert failure is not None and failure.reason == "batch-error"
