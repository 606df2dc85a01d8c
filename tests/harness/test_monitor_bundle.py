"""Monitor bundles as a user handles them: names that cannot reach outside monitor/, replacement
only with --force and never by deleting, `ctd monitor audit` (matches, then tells a changed run, a
damaged copy and an altered record), an accuracy bundle that refuses a cap on expert calls, and a
decision log on a full disk that refuses checks before the expert is paid."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ctd_cli import assert_one_line_error, free_port, run_ctd
from fault_server import RunningServer
from monitor_run import conversations_of, fill, serve, stop

from harness import InputError
from harness.monitor import calibrate_bundle
from harness.run import RunLayout
from probes import read_artifact

_LIVE_WRITER = """
import sys, time
from pathlib import Path
from harness.data import staging_folder
# Private: the prefix and mark a bundle of that name is staged with.
from harness.monitor._bundle import STAGING_MARK, staging_prefix
with staging_folder(Path(sys.argv[1]), staging_prefix("swap-me"), marker=STAGING_MARK) as folder:
    print(folder, flush=True)
    time.sleep(120)
"""


def _tree(root: Path) -> dict[str, str]:
    """Every file under `root` with its content hash: what must not change."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_bundle_names_are_one_plain_folder_and_nothing_is_deleted_to_make_room(made: dict) -> None:
    tmp, env = made["tmp"], made["env"]
    runs = tmp / "runs"
    (runs / "t" / "monitor" / "other").mkdir(exist_ok=True)
    (runs / "t" / "monitor" / "other" / "note.txt").write_text("not a bundle")
    before = _tree(runs)
    outside = tmp / "outside"
    for name in ("..", ".", "a/b", str(outside), ".hidden", "-x", "a" * 101):
        result = run_ctd(
            "monitor", "calibrate", "--run", "t", "--budget", "0.5", "--name", name, cwd=tmp, env=env
        )
        assert_one_line_error(result, "--name", "one plain folder name")
        assert _tree(runs) == before, name
    assert not outside.exists()
    # An existing bundle is replaced only with --force; a folder that is not a bundle never.
    existing = made["bundle"].name
    assert_one_line_error(
        run_ctd(
            "monitor", "calibrate", "--run", "t", "--budget", "0.5", "--name", existing, cwd=tmp, env=env
        ),
        "exists; give --force",
    )
    assert_one_line_error(
        run_ctd(
            "monitor",
            "calibrate",
            "--run",
            "t",
            "--budget",
            "0.5",
            "--name",
            "other",
            "--force",
            cwd=tmp,
            env=env,
        ),
        "is not a monitor bundle",
    )
    assert _tree(runs) == before

    # --force: the new bundle takes the name; the old one, with its decision log, is kept.
    copy = runs / "t" / "monitor" / "replace-me"
    shutil.copytree(made["bundle"], copy)
    (copy / "decisions.jsonl").write_text('{"event": "decision"}\n')
    old = _tree(copy)
    done = run_ctd(
        "monitor",
        "calibrate",
        "--run",
        "t",
        "--budget",
        "0.3",
        "--name",
        "replace-me",
        "--force",
        cwd=tmp,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    kept = [p for p in copy.parent.iterdir() if p.name.startswith("replace-me.replaced-")]
    assert len(kept) == 1 and _tree(kept[0]) == old
    assert f"kept as {kept[0]}" in done.stdout and done.stdout.strip().splitlines()[-1] == str(copy)
    assert json.loads((copy / "bundle.json").read_text())["alpha"] == 0.3
    assert not (copy / "decisions.jsonl").exists()
    assert not [p for p in copy.parent.iterdir() if p.name.startswith(".")]  # no staging left
    for path, digest in before.items():
        assert _tree(runs).get(path) == digest, path


def test_what_a_killed_writer_staged_is_removed_and_a_failed_swap_replaces_nothing(
    made: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp, env = made["tmp"], made["env"]
    monitor = tmp / "runs" / "t" / "monitor"
    bundle = monitor / "swap-me"
    shutil.copytree(made["bundle"], bundle)
    old = _tree(bundle)
    # A writer killed while it wrote (nothing of it ran after), and a live one of the same name.
    killed = monitor / ".swap-me~partial-killed"
    killed.mkdir()
    (killed / ".staging").touch()
    (killed / "safety.safetensors").write_bytes(b"x" * 4096)
    # A writer killed between its exchange and its rename: the old bundle lies at its staged path,
    # unmarked, and must never be taken for a dead writer's folder.
    swapped_out = monitor / ".swap-me~partial-swapped"
    shutil.copytree(made["bundle"], swapped_out)
    live = subprocess.Popen(
        [sys.executable, "-c", _LIVE_WRITER, str(monitor)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert live.stdout is not None
        theirs = Path(live.stdout.readline().strip())
        args = ("monitor", "calibrate", "--run", "t", "--budget", "0.3", "--name", "swap-me", "--force")
        done = run_ctd(*args, cwd=tmp, env=env)
        assert done.returncode == 0, done.stderr
        assert not killed.exists() and theirs.is_dir() and swapped_out.is_dir()
    finally:
        live.kill()
        live.wait()
    shutil.rmtree(theirs)
    shutil.rmtree(swapped_out)
    for replaced in monitor.glob("swap-me.replaced-*"):
        shutil.rmtree(replaced)

    # The bundle there cannot be kept under its new name (a full disk, say): the two are swapped
    # back, the new one is removed, and the old one serves on, unchanged.
    shutil.rmtree(bundle)
    shutil.copytree(made["bundle"], bundle)
    rename = Path.rename

    def no_room_to_keep(self: Path, target: str | Path) -> Path:
        if ".replaced-" in Path(target).name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
        return rename(self, target)

    def stopped_there(self: Path, target: str | Path) -> Path:
        if ".replaced-" in Path(target).name:
            raise KeyboardInterrupt  # Ctrl-C between the exchange and the rename
        return rename(self, target)

    layout = RunLayout(tmp / "runs" / "t")
    for fault, raised in ((no_room_to_keep, InputError), (stopped_there, KeyboardInterrupt)):
        monkeypatch.setattr(Path, "rename", fault)
        with pytest.raises(raised) as info:
            calibrate_bundle(layout, name="swap-me", mode="budget", alpha=0.3, force=True)
        if raised is InputError:
            assert re.search(r"kept as swap-me\.replaced-.*nothing was replaced", str(info.value))
        assert _tree(bundle) == old
        assert not [p for p in monitor.iterdir() if p.name.startswith((".swap-me", "swap-me."))]


def test_audit_matches_and_tells_a_changed_run_a_damaged_copy_and_an_altered_record(made: dict) -> None:
    tmp, env, bundle = made["tmp"], made["env"], made["bundle"]
    record = json.loads((bundle / "bundle.json").read_text())
    assert record["version"] == 2 and record["test_order"] == "est_budget"
    assert record["sources"]["scores"]["path"] == "scores.parquet"
    ok = run_ctd("monitor", "audit", str(bundle), cwd=tmp, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "matches its run" in ok.stdout and "DIFFERS" not in ok.stdout

    # A later run into a copy of the run folder changes the scores table: the audit says so.
    changed = tmp / "changed-run"
    if changed.exists():
        shutil.rmtree(changed)
    shutil.copytree(tmp / "runs" / "t", changed, ignore=shutil.ignore_patterns("monitor"))
    table = pq.read_table(changed / "scores.parquet").to_pydict()
    table["dv"] = [0.0 if v is None else v + 1e-9 for v in table["dv"]]
    pq.write_table(pa.table(table), changed / "scores.parquet")
    differs = run_ctd("monitor", "audit", str(bundle), "--run", str(changed), "--json", cwd=tmp, env=env)
    assert differs.returncode == 1
    report = json.loads(differs.stdout)
    failed = {c["what"] for c in report["checks"] if not c["ok"]}
    assert failed == {"scores table", "LTT record"} and not report["matches"]

    # A damaged probe copy in a bundle: the audit names it, and serving refuses it in one line.
    damaged = tmp / "damaged-bundle"
    shutil.copytree(bundle, damaged, dirs_exist_ok=True)
    weights = bytearray((damaged / "dv.safetensors").read_bytes())
    weights[-1] ^= 0xFF
    (damaged / "dv.safetensors").write_bytes(bytes(weights))
    audit = run_ctd("monitor", "audit", str(damaged), "--json", cwd=tmp, env=env)
    assert audit.returncode == 1
    assert {c["what"] for c in json.loads(audit.stdout)["checks"] if not c["ok"]} == {"bundle's dv probe"}
    assert_one_line_error(
        run_ctd("monitor", "serve", str(damaged), cwd=tmp, env=env), "dv.safetensors", "certified"
    )

    # A record whose D_est and D_cal were hand-picked (one example swapped) is not its seed's cut.
    swapped = tmp / "swapped-bundle"
    shutil.copytree(bundle, swapped, dirs_exist_ok=True)
    forged = json.loads((swapped / "bundle.json").read_text())
    forged["est_ids"][0], forged["cal_ids"][0] = forged["cal_ids"][0], forged["est_ids"][0]
    (swapped / "bundle.json").write_text(json.dumps(forged))
    audit = run_ctd("monitor", "audit", str(swapped), "--json", cwd=tmp, env=env)
    assert audit.returncode == 1
    details = [c["detail"] for c in json.loads(audit.stdout)["checks"] if not c["ok"]]
    assert len(details) == 1 and "not the cut of split seed" in details[0]

    # An altered LTT record (one count) no longer recomputes.
    altered = tmp / "altered-bundle"
    shutil.copytree(bundle, altered, dirs_exist_ok=True)
    forged = json.loads((altered / "bundle.json").read_text())
    forged["ltt"]["k"][0] += 1
    (altered / "bundle.json").write_text(json.dumps(forged))
    audit = run_ctd("monitor", "audit", str(altered), "--json", cwd=tmp, env=env)
    assert audit.returncode == 1
    assert {c["what"] for c in json.loads(audit.stdout)["checks"] if not c["ok"]} == {"LTT record"}


def test_an_accuracy_bundle_records_its_order_and_refuses_a_cap_before_the_model_loads(made: dict) -> None:
    tmp, env = made["tmp"], made["env"]
    for level in ("0.2", "0.3", "0.4"):  # the small run's cascade is weak: the first level it certifies
        done = run_ctd(
            "monitor", "calibrate", "--run", "t", "--accuracy", level, "--name", f"acc-{level}", "--force",
            cwd=tmp, env=env,
        )  # fmt: skip
        if done.returncode == 0:
            break
    else:
        pytest.fail(f"no accuracy level certified: {done.stderr}")
    bundle = Path(done.stdout.strip().splitlines()[-1])
    record = json.loads((bundle / "bundle.json").read_text())
    assert (record["mode"], record["objective"], record["test_order"], record["selection"]) == (
        "performance",
        "accuracy",
        "est_error",
        "est_budget",
    )
    started = time.monotonic()
    refused = run_ctd("monitor", "serve", str(bundle), "--max-delegation-rate", "0.2", cwd=tmp, env=env)
    assert_one_line_error(refused, "--max-delegation-rate", "certifies accuracy")
    assert time.monotonic() - started < 30  # refused before the model loads


def test_a_full_decision_log_refuses_checks_before_the_expert_is_paid_and_heals(
    made: dict, small_disk: Path
) -> None:
    tmp = made["tmp"]
    everything = tmp / "delegate-all-log"  # every request needs the expert
    shutil.copytree(made["bundle"], everything, dirs_exist_ok=True)
    (everything / "decisions.jsonl").unlink(missing_ok=True)
    record = {**made["record"], "threshold": -1e9}
    (everything / "bundle.json").write_text(json.dumps(record))
    _, conversations = conversations_of(tmp / "data")
    log = small_disk / "decisions.jsonl"
    filler = small_disk / "filler"
    port = free_port()
    with RunningServer() as expert:
        process = serve(
            everything, port, "--expert-url", expert.url, "--log", str(log), cwd=tmp, env=made["env"]
        )
        try:
            url = f"http://127.0.0.1:{port}"
            fill(filler)  # the disk fills (the log keeps what it reserved)
            statuses: list[int] = []
            for conversation in conversations[:40]:
                body = (
                    {"input": conversation} if isinstance(conversation, str) else {"messages": conversation}
                )
                statuses.append(httpx.post(f"{url}/v1/check", json=body, timeout=300).status_code)
                if statuses[-1] == 503:
                    break
            health = httpx.get(f"{url}/healthz", timeout=30)
            paid_while_full = sum(expert.server.counts.requests.values())
            refused = httpx.post(f"{url}/v1/check", json={"input": "one more, item-9999"}, timeout=300)
            paid_after_refusal = sum(expert.server.counts.requests.values())
            filler.unlink()  # space comes back: /healthz says so before any check arrives
            recovered = httpx.get(f"{url}/healthz", timeout=30)
            healed = httpx.post(f"{url}/v1/check", json={"input": "after, item-9998"}, timeout=300)
        finally:
            stop(process)
    assert 503 in statuses and refused.status_code == 503 and "Retry-After" in refused.headers
    assert paid_after_refusal == paid_while_full  # a refused check paid nothing
    assert health.status_code == 503 and "log" in health.json()
    assert recovered.status_code == 200 and recovered.json()["log"] == "ok"
    assert healed.status_code == 200
    lines = [json.loads(line) for line in log.read_text().splitlines()]  # no torn line
    decisions = [r for r in lines if r["event"] == "decision"]
    assert len(decisions) == statuses.count(200) + 1
    assert len(decisions) == paid_after_refusal + 1  # every paid call is a logged, answered decision


def test_a_bundle_records_the_dtype_its_probes_were_trained_in(made: dict) -> None:
    """Both probes of a run's bundle say in which dtype the model computed their activations
    (float32 on this CPU), which `ctd monitor serve` then loads the model in."""
    bundle: Path = made["bundle"]
    for stem in ("safety", "dv"):
        assert read_artifact(bundle / stem).dtype == "float32", stem
