"""`ctd probe`'s inputs: an example the model cannot read is named by its split, id and file line,
in one line, exit code 2, before anything is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ctd_cli import assert_one_line_error, run_ctd

from harness.data.builtin import builtin_dir

# Private: where the embedded model's converted folder lives.
from probes._model import embedded_gguf, file_sha256, model_cache_root

REJECTING = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}"
    "{% endif %}{{ m['content'] }}{% endfor %}"
)


def model_with_template(folder: Path, template: str) -> Path:
    """A copy of the embedded model (as a folder) whose chat template is `template`."""
    source = model_cache_root() / f"gguf-{file_sha256(embedded_gguf())[:24]}"
    if not (source / "model.safetensors").is_file():
        from probes import load_model

        load_model()  # converts the GGUF into that folder
    shutil.copytree(source, folder)
    (folder / "chat_template.jinja").write_text(template)
    return folder


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def small_splits(folder: Path) -> dict[str, list[dict]]:
    """Rows for train, dev and test files: a few of each label from the built-in set, ids t0, t1, ..."""
    rows = [json.loads(line) for line in (builtin_dir() / "train.jsonl").read_text().splitlines()]
    high = [r for r in rows if r["labels"] == "high-stakes" and isinstance(r["inputs"], str)]
    low = [r for r in rows if r["labels"] == "low-stakes" and isinstance(r["inputs"], str)]
    out: dict[str, list[dict]] = {}
    for number, split in enumerate(("train", "dev", "test")):
        chosen = high[4 * number : 4 * number + 4] + low[4 * number : 4 * number + 4]
        out[split] = [
            {"ids": f"{split[0]}{i}", "inputs": r["inputs"], "labels": r["labels"]}
            for i, r in enumerate(chosen)
        ]
    return out


def test_a_row_the_chat_template_rejects_is_named_by_split_id_and_line(tmp_path: Path) -> None:
    model = model_with_template(tmp_path / "model", REJECTING)
    rows = small_splits(tmp_path)
    system = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "delete prod?"}]
    rows["dev"][2] = {**rows["dev"][2], "ids": "zz-last", "inputs": system}  # sorts last in the split
    for split, split_rows in rows.items():
        write_rows(tmp_path / f"{split}.jsonl", split_rows)
    result = run_ctd(
        "probe", "--data", "train=train.jsonl dev=dev.jsonl test=test.jsonl", "--model", str(model),
        "--out", "out", "--arch", "mean", "--seeds", "0", "--epochs", "1", "--max-tokens", "16", "--json",
        cwd=tmp_path, env={"CTD_STORE": str(tmp_path / "store"), "HF_HUB_OFFLINE": "1"}, timeout=600,
    )  # fmt: skip
    assert_one_line_error(result, "--data dev", "'zz-last'", "dev.jsonl:3", "no system role")
    assert "example 7" not in result.stderr and not (tmp_path / "out").exists()


def test_rows_that_load_but_fail_later_are_refused_at_load(tmp_path: Path) -> None:
    """A lone surrogate escape (it broke the data hash), an empty message list (it was extracted as
    one pad token): one line naming the file line, before any model loads."""
    rows = small_splits(tmp_path)
    write_rows(tmp_path / "train.jsonl", rows["train"])
    write_rows(tmp_path / "test.jsonl", rows["test"])
    bad = {"surrogate": "a\ud800b", "empty": []}
    for name, inputs in bad.items():
        dev = [*rows["dev"][:3], {"ids": "bad", "inputs": inputs, "labels": "low-stakes"}, *rows["dev"][3:]]
        (tmp_path / "dev.jsonl").write_text("".join(json.dumps(row) + "\n" for row in dev))  # \ud800 escaped
        result = run_ctd(
            "probe", "--data", "train=train.jsonl dev=dev.jsonl test=test.jsonl", "--out", "out",
            cwd=tmp_path, env={"CTD_STORE": str(tmp_path / "store"), "HF_HUB_OFFLINE": "1"},
        )  # fmt: skip
        assert_one_line_error(result, "dev.jsonl:4")
        assert not (tmp_path / "out").exists() and not (tmp_path / "store").exists(), name


def test_a_complete_store_with_a_cut_shard_is_one_line(tmp_path: Path) -> None:
    """A store marked complete whose shard lost its end (a disk that filled, a copy that stopped):
    one line saying the store is damaged and what to do, where reading it raised an IndexError;
    doing it (rerunning the probe stage) extracts the shard again."""
    rows = small_splits(tmp_path)
    for split, split_rows in rows.items():
        write_rows(tmp_path / f"{split}.jsonl", split_rows)
    env = {"CTD_STORE": str(tmp_path / "store"), "HF_HUB_OFFLINE": "1"}
    probe_args = (
        "probe", "--data", "train=train.jsonl dev=dev.jsonl test=test.jsonl", "--out", "probe",
        "--arch", "mean", "--seeds", "0", "--epochs", "1", "--max-tokens", "16", "--json",
    )  # fmt: skip
    dv_args = ("dv", "--probe-dir", "probe", "--expert-scores", "expert.csv", "--out", "dv.csv", "--json")
    probe = run_ctd(*probe_args, cwd=tmp_path, env=env, timeout=600)
    assert probe.returncode == 0, probe.stderr
    dev_store = Path(json.loads((tmp_path / "probe" / "stores.json").read_text())["splits"]["dev"]["folder"])
    (shard,) = dev_store.glob("shard-*.f16")
    with shard.open("r+b") as handle:
        handle.truncate(shard.stat().st_size // 2)
    (tmp_path / "expert.csv").write_text(
        "id,expert\n" + "".join(f"{r['ids']},0.5\n" for split in ("dev", "test") for r in rows[split])
    )
    result = run_ctd(*dv_args, cwd=tmp_path, env=env)
    assert_one_line_error(result, str(dev_store), "damaged", shard.name, "rerun")
    assert not (tmp_path / "dv.csv").exists()
    # Rerunning the probe stage, as the line says, extracts that shard again; no folder to delete.
    again = run_ctd(*probe_args, cwd=tmp_path, env=env, timeout=600)
    assert again.returncode == 0, again.stderr
    result = run_ctd(*dv_args, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "dv.csv").is_file()


def test_an_out_that_cannot_be_a_folder_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    """--out naming a file, or a folder under a file: one line, where it failed only after
    extraction and training."""
    rows = small_splits(tmp_path)
    for split, split_rows in rows.items():
        write_rows(tmp_path / f"{split}.jsonl", split_rows)
    (tmp_path / "taken").write_text("a file the user keeps\n")
    env = {"CTD_STORE": str(tmp_path / "store"), "HF_HUB_OFFLINE": "1"}
    for out, fragment in (("taken", "--out taken: exists and is not a folder"), ("taken/p", "not a folder")):
        result = run_ctd(
            "probe", "--data", "train=train.jsonl dev=dev.jsonl test=test.jsonl", "--out", out,
            "--arch", "mean", "--seeds", "0", "--epochs", "1", "--max-tokens", "16", "--json",
            cwd=tmp_path, env=env, timeout=600,
        )  # fmt: skip
        assert_one_line_error(result, fragment)
        assert not (tmp_path / "store").exists()  # nothing extracted
    assert (tmp_path / "taken").read_text() == "a file the user keeps\n"
