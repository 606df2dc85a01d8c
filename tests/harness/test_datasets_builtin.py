"""The built-in data set (shipped files = what the generator writes; size, balance, groups,
short texts) and the data-spec parser (every key form, group defaults, the automatic dev/test
cut, the content hash, and one clear InputError line for each kind of bad input)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import DataSplits, InputError, load_data
from harness.data import parse_data_spec, read_dataset

# Private: the spec parser's salt and sources, and the built-in set's generator, unit-tested.
from harness.data._dataspec import SPLIT_SALT, DataSource
from harness.data.builtin import builtin_dir

# Private: the generator of the built-in files, checked against them.
from harness.data.builtin._generate import (
    BUILTIN_GROUPS,
    BUILTIN_SPLITS,
    PER_LABEL,
    TRAIN_GROUPS,
    builtin_rows,
    write_builtin,
)

REPO = Path(__file__).resolve().parents[2]


def _words(inputs: str) -> int:
    text = inputs.strip()
    if text.startswith("["):
        return sum(len(m["content"].split()) for m in json.loads(text))
    return len(text.split())


def _builtin_file_rows() -> dict[str, list[dict[str, str]]]:
    return {
        split: [json.loads(line) for line in (builtin_dir() / f"{split}.jsonl").read_text().splitlines()]
        for split in BUILTIN_SPLITS
    }


def _write(path: Path, rows: list[dict], *, raw_lines: dict[int, str] | None = None) -> Path:
    """A JSONL file of `rows`; `raw_lines` replaces (1-based) lines with raw text."""
    lines = [json.dumps(row) for row in rows]
    for number, text in (raw_lines or {}).items():
        lines[number - 1] = text
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _rows(prefix: str, n_high: int, n_low: int, **extra: str) -> list[dict]:
    rows = [
        {"inputs": f"{prefix} example {i}", "ids": f"{prefix}-{i}", "labels": "high-stakes", **extra}
        for i in range(n_high)
    ]
    rows += [
        {"inputs": f"{prefix} example {i}", "ids": f"{prefix}-{i}", "labels": "low-stakes", **extra}
        for i in range(n_high, n_high + n_low)
    ]
    return rows


def _error(spec: object, **kwargs: object) -> str:
    with pytest.raises(InputError) as info:
        load_data(spec, **kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message, message
    return message


# ---------------------------------------------------------------------------------------------
# The built-in set
# ---------------------------------------------------------------------------------------------


def test_builtin_files_are_exactly_what_the_generator_writes(tmp_path: Path) -> None:
    written = write_builtin(tmp_path)
    assert sorted(written) == sorted(BUILTIN_SPLITS)
    for split in BUILTIN_SPLITS:
        shipped = builtin_dir() / f"{split}.jsonl"
        assert shipped.is_file(), f"{shipped} is missing: run python -m harness.data.builtin._generate"
        assert written[split].read_bytes() == shipped.read_bytes(), f"{split}.jsonl differs from a rewrite"


def test_builtin_module_entry_point_is_independent_of_the_hash_seed(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run(
        [sys.executable, "-m", "harness.data.builtin._generate", str(tmp_path)],
        check=True,
        cwd=REPO,
        env=env,
        capture_output=True,
    )
    for split in BUILTIN_SPLITS:
        assert (tmp_path / f"{split}.jsonl").read_bytes() == (builtin_dir() / f"{split}.jsonl").read_bytes()


def test_builtin_size_groups_balance_and_ids() -> None:
    rows = _builtin_file_rows()
    assert rows == builtin_rows()
    assert {split: len(r) for split, r in rows.items()} == {"train": 80, "dev": 160, "test": 240}
    counts = Counter((row["group"], split, row["labels"]) for split, r in rows.items() for row in r)
    assert {group for group, _, _ in counts} == set(BUILTIN_GROUPS) and len(BUILTIN_GROUPS) == 4
    for group in BUILTIN_GROUPS:
        for split in BUILTIN_SPLITS:
            for label in ("high-stakes", "low-stakes"):
                expected = 0 if split == "train" and group not in TRAIN_GROUPS else PER_LABEL[split]
                assert counts[(group, split, label)] == expected, (group, split, label)
    ids = [row["ids"] for r in rows.values() for row in r]
    assert len(ids) == len(set(ids)), "ids must be unique across all three files"
    texts = [row["inputs"] for r in rows.values() for row in r]
    assert len(texts) == len(set(texts)), "no example repeats, within or across splits"


def test_builtin_texts_are_short() -> None:
    words = [_words(row["inputs"]) for r in _builtin_file_rows().values() for row in r]
    assert min(words) >= 10 and max(words) <= 70
    assert 15 <= sum(words) / len(words) <= 45


def test_builtin_groups_have_their_shapes() -> None:
    for split in BUILTIN_SPLITS:
        dataset = read_dataset(builtin_dir() / f"{split}.jsonl", require_labels=True)
        for item, group in zip(dataset.items, dataset.extra["group"], strict=True):
            conversation = item.conversation
            if group in ("clinical",):
                assert isinstance(conversation, str)
            elif group == "dialogue":
                roles = [m["role"] for m in conversation]
                assert roles[0] == "user" and len(roles) >= 3
                assert all(a != b for a, b in itertools.pairwise(roles)), "turns alternate"
            elif group == "tooluse":
                assert conversation[0]["role"] == "system" and "Tools:" in conversation[0]["content"]
                assert any(
                    m["role"] == "assistant" and m["content"].startswith("CALL ") for m in conversation
                )


def test_builtin_spec_forms_load_the_whole_set() -> None:
    for spec in (None, "", [], "builtin", ["builtin"], "train=builtin dev=builtin test=builtin"):
        data = load_data(spec)
        assert not data.test_from_dev
        assert {split: len(data[split]) for split in BUILTIN_SPLITS} == {
            "train": 2 * len(TRAIN_GROUPS) * PER_LABEL["train"],
            "dev": 2 * len(BUILTIN_GROUPS) * PER_LABEL["dev"],
            "test": 2 * len(BUILTIN_GROUPS) * PER_LABEL["test"],
        }
        assert set(data.counts()["test"]) == set(BUILTIN_GROUPS)
        assert data.dropped == {f"{split}=builtin": 0 for split in BUILTIN_SPLITS}


# ---------------------------------------------------------------------------------------------
# Parsing the spec
# ---------------------------------------------------------------------------------------------


def test_parse_every_key_form() -> None:
    one_string = parse_data_spec("train=t.jsonl dev=a:x.jsonl,b:y.csv test=c:z.jsonl")
    tokens = parse_data_spec(["train=t.jsonl", "dev=a:x.jsonl,b:y.csv", "test=c:z.jsonl"])
    mixed = parse_data_spec(["train=t.jsonl dev=a:x.jsonl,b:y.csv", "test=c:z.jsonl"])
    repeated = parse_data_spec(["train=t.jsonl", "dev=a:x.jsonl", "dev=b:y.csv", "test=c:z.jsonl"])
    assert one_string == tokens == mixed == repeated
    assert one_string.sources == (
        DataSource("train", "t.jsonl"),
        DataSource("dev", "x.jsonl", "a"),
        DataSource("dev", "y.csv", "b"),
        DataSource("test", "z.jsonl", "c"),
    )
    assert not one_string.test_from_dev
    assert parse_data_spec("train=t.jsonl dev=d.jsonl").test_from_dev
    hub = parse_data_spec("train=hf:me/data/train.jsonl dev=mt:hf:me/data/sub/mt.jsonl,train:builtin")
    assert hub.entries("train") == (DataSource("train", "hf:me/data/train.jsonl"),)
    assert hub.entries("dev") == (
        DataSource("dev", "hf:me/data/sub/mt.jsonl", "mt"),
        DataSource("dev", "builtin", "train"),
    )
    assert str(hub.entries("dev")[0]) == "dev=mt:hf:me/data/sub/mt.jsonl"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("train=a.jsonl tset=b.jsonl", ["--data", "unknown key 'tset'", "did you mean 'test'"]),
        ("train=a.jsonl dev", ["--data", "'dev' is not KEY=VALUE"]),
        ("train=a.jsonl dev=", ["--data", "'dev=' names no file"]),
        ("train=a.jsonl dev=x.jsonl,", ["--data", "empty entry in 'dev=x.jsonl,'"]),
        ("train=a.jsonl dev=bad/group:x.jsonl", ["--data", "group 'bad/group'"]),
        ("train=a.jsonl dev=mt:", ["--data", "'mt:' in 'dev=mt:' names a group but no file"]),
        ("builtin train=a.jsonl", ["--data", "'builtin' alone"]),
    ],
)
def test_parse_errors_name_the_option_and_token(spec: str, expected: list[str]) -> None:
    with pytest.raises(InputError) as info:
        parse_data_spec(spec)
    message = str(info.value)
    assert "\n" not in message
    for part in expected:
        assert part in message, message


def test_the_option_name_in_errors_can_be_set() -> None:
    with pytest.raises(InputError, match=r"^--dataset: unknown key"):
        parse_data_spec("trian=a.jsonl", option="--dataset")


# ---------------------------------------------------------------------------------------------
# Loading: groups, counts, the automatic split, the content hash
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "train": _write(tmp_path / "synthetic.jsonl", _rows("tr", 6, 6)),
        "anthropic": _write(tmp_path / "anthropic.jsonl", _rows("an", 10, 10)),
        "mt": _write(tmp_path / "mt.jsonl", _rows("mt", 7, 5)),
        "grouped": _write(tmp_path / "mixed.jsonl", _rows("gx", 4, 4, group="toolace")),
    }


def test_group_defaults_stem_row_field_and_explicit(files: dict[str, Path], tmp_path: Path) -> None:
    partly = _rows("pp", 2, 2)
    partly[0]["group"] = "special"
    _write(tmp_path / "partly.jsonl", partly)
    data = load_data(
        f"train={files['train']} dev={files['anthropic']},{files['grouped']},{tmp_path / 'partly.jsonl'}"
        f" test=clinic:{files['mt']},override:{files['grouped']}"
    )
    assert {e.group for e in data.train} == {"synthetic"}
    dev_and_test = [e for split in ("dev", "test") for e in data[split]]
    groups = Counter(e.group for e in dev_and_test)
    assert groups["anthropic"] == 20 and groups["toolace"] == 8 and groups["clinic"] == 12
    assert groups["override"] == 8 and groups["special"] == 1 and groups["partly"] == 3


def test_relative_paths_resolve_against_base(files: dict[str, Path], tmp_path: Path) -> None:
    data = load_data("train=synthetic.jsonl dev=anthropic.jsonl test=mt.jsonl", base=tmp_path)
    assert len(data.train) == 12 and len(data.test) == 12


def test_examples_carry_split_label_and_conversation(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    rows = [
        {"inputs": json.dumps(messages), "ids": "m1", "labels": "low-stakes"},
        {"inputs": "a plain turn", "ids": "m2", "labels": "high-stakes"},
    ]
    path = _write(tmp_path / "msgs.jsonl", rows)
    data = load_data(f"train={path} dev={path} test={path}")
    by_id = {e.id: e for e in data.test}
    assert by_id["m1"].conversation == messages and by_id["m1"].label == 0 and by_id["m1"].split == "test"
    assert by_id["m2"].conversation == "a plain turn" and by_id["m2"].label == 1
    assert by_id["m2"].item().id == "m2"
    assert [e.split for e in data.train] == ["train", "train"]


def test_ambiguous_rows_are_dropped_and_counted_per_file(files: dict[str, Path], tmp_path: Path) -> None:
    rows = _rows("am", 3, 3)
    rows.insert(2, {"inputs": "unclear", "ids": "am-x", "labels": "ambiguous"})
    rows.append({"inputs": "unclear too", "ids": "am-y", "labels": "ambiguous"})
    path = _write(tmp_path / "amb.jsonl", rows)
    data = load_data(f"train={files['train']} dev={path} test=mt:{files['mt']}")
    assert data.dropped == {f"train={files['train']}": 0, f"dev={path}": 2, f"test=mt:{files['mt']}": 0}
    assert [f.examples for f in data.files] == [12, 6, 12]
    assert {e.id for e in data.dev} == {f"am-{i}" for i in range(6)}


def test_examples_are_in_id_order(files: dict[str, Path]) -> None:
    data = load_data(f"train={files['train']} dev={files['mt']},{files['anthropic']} test={files['mt']}")
    for split in ("train", "dev", "test"):
        ids = [e.id for e in data[split]]
        assert ids == sorted(ids)


def test_automatic_dev_test_split(files: dict[str, Path], tmp_path: Path) -> None:
    spec = f"train={files['train']} dev={files['anthropic']},{files['mt']}"
    data = load_data(spec)
    assert data.test_from_dev
    assert all(e.split == "dev" for e in data.dev) and all(e.split == "test" for e in data.test)
    dev_ids, test_ids = {e.id for e in data.dev}, {e.id for e in data.test}
    assert not dev_ids & test_ids, "disjoint"
    every = {
        json.loads(line)["ids"]
        for name in ("anthropic", "mt")
        for line in files[name].read_text().splitlines()
    }
    assert dev_ids | test_ids == every, "covering"
    # Stratified: each (group, label) stratum is cut in half, floor to dev, the rest to test.
    counts = data.counts()
    assert counts["dev"] == {"anthropic": {0: 5, 1: 5}, "mt": {0: 2, 1: 3}}
    assert counts["test"] == {"anthropic": {0: 5, 1: 5}, "mt": {0: 3, 1: 4}}
    # Deterministic: again, and with the files' rows in another order and another place.
    assert load_data(spec) == data
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    for name in ("anthropic", "mt"):
        lines = files[name].read_text().splitlines()
        (moved / files[name].name).write_text("".join(line + "\n" for line in reversed(lines)))
    again = load_data(f"train={files['train']} dev={moved / 'mt.jsonl'},{moved / 'anthropic.jsonl'}")
    assert [e.id for e in again.dev] == [e.id for e in data.dev]
    assert [e.id for e in again.test] == [e.id for e in data.test]
    assert again.content_hash("test") == data.content_hash("test")


def test_automatic_split_depends_on_the_salted_id_hash(files: dict[str, Path], monkeypatch) -> None:
    # Private: its hash function is patched.
    import harness.data._dataspec as dataspec

    spec = f"train={files['train']} dev={files['anthropic']}"
    before = {e.id for e in load_data(spec).test}
    monkeypatch.setattr(dataspec, "SPLIT_SALT", SPLIT_SALT + "-other")
    assert {e.id for e in load_data(spec).test} != before


def test_content_hash_follows_content_not_order_or_place(files: dict[str, Path], tmp_path: Path) -> None:
    data = load_data(f"train={files['train']} dev={files['anthropic']},{files['mt']} test={files['mt']}")
    hashes = {split: data.content_hash(split) for split in ("train", "dev", "test")}
    assert len(set(hashes.values())) == 3 and all(len(h) == 64 for h in hashes.values())
    # Reordering the files of a split, or copying them elsewhere, keeps the hash.
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in files.values():
        shutil.copy(path, copy / path.name)
    reordered = load_data(
        f"train={copy / 'synthetic.jsonl'} dev={copy / 'mt.jsonl'},{copy / 'anthropic.jsonl'}"
        f" test={files['mt']}"
    )
    assert reordered.content_hash("dev") == hashes["dev"]
    assert reordered.content_hash("train") == hashes["train"]

    edited = tmp_path / "edited"
    edited.mkdir()

    def changed(edit: Callable[[dict], object]) -> DataSplits:
        rows = [json.loads(line) for line in files["anthropic"].read_text().splitlines()]
        edit(rows[3])
        path = _write(edited / "anthropic.jsonl", rows)
        return load_data(f"train={files['train']} dev={path},{files['mt']} test={files['mt']}")

    flipped = changed(
        lambda row: row.update(labels="low-stakes" if row["labels"] == "high-stakes" else "high-stakes")
    )
    assert flipped.content_hash("dev") != hashes["dev"]
    assert changed(lambda row: row.update(inputs=row["inputs"] + "!")).content_hash("dev") != hashes["dev"]
    assert changed(lambda row: row.update(group="elsewhere")).content_hash("dev") != hashes["dev"]
    assert changed(lambda row: None).content_hash("dev") == hashes["dev"]
    # The same examples hash the same whichever split they are in.
    assert data.content_hash("test") == load_data(
        f"train={files['mt']} dev={files['mt']} test=x:{files['train']}"
    ).content_hash("dev")


# ---------------------------------------------------------------------------------------------
# Load errors: one line naming the option, the entry, the file and the line
# ---------------------------------------------------------------------------------------------


def test_missing_file_and_folder(files: dict[str, Path], tmp_path: Path) -> None:
    message = _error(f"train={files['train']} dev={tmp_path / 'nope.jsonl'}")
    assert message.startswith(f"--data dev={tmp_path / 'nope.jsonl'}: ") and "no such file" in message
    message = _error(f"train={tmp_path} dev={files['mt']}")
    assert message.startswith(f"--data train={tmp_path}: ") and "is a folder" in message


def test_train_and_dev_are_required_after_the_files_are_checked(
    files: dict[str, Path], tmp_path: Path
) -> None:
    assert _error(f"dev={files['mt']}") == "--data: no train= entry (give train=PATH, or train=builtin)"
    assert _error(f"train={files['train']} test={files['mt']}").startswith("--data: no dev= entry")
    missing = tmp_path / "missing.jsonl"
    assert _error(f"train={missing}") == f"--data train={missing}: {missing}: no such file"


def test_content_parts_and_tool_calls_are_read_as_text_and_other_parts_are_refused(
    files: dict[str, Path], tmp_path: Path
) -> None:
    """OpenAI's content parts: the text parts joined by newlines; an assistant's tool calls: a line
    each, as the monitor reads them; an image part is one line naming the file, the line and the
    part."""
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    rows = [
        {"inputs": [{"role": "user", "content": parts}], "ids": f"p{i}", "labels": label}
        for i, label in enumerate(["low-stakes", "high-stakes"])
    ]
    listing = {"function": {"name": "ls", "arguments": "{}"}}
    rows[1]["inputs"] = [
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": None, "tool_calls": [listing]},
    ]
    path = _write(tmp_path / "parts.jsonl", rows)
    data = load_data(f"train={path} dev={path} test={path}")
    assert data.test[0].conversation == [{"role": "user", "content": "first\nsecond"}]
    assert data.test[1].conversation[1] == {"role": "assistant", "content": "[tool call] ls({})"}
    # A reply kept as the API returned it, and OpenAI's other role names, read as the monitor reads them.
    reply = {"role": "assistant", "content": None, "refusal": "No.", "audio": None, "function_call": None}
    rows[0]["inputs"] = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "hi"},
        reply,
    ]
    path = _write(tmp_path / "replies.jsonl", rows)
    data = load_data(f"train={path} dev={path} test={path}")
    assert data.test[0].conversation == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "No."},
    ]
    image = [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]
    rows = _rows("im", 3, 3)
    rows[1]["inputs"] = [{"role": "user", "content": image}]
    path = _write(tmp_path / "image.jsonl", rows)
    message = _error(f"train={files['train']} dev={files['mt']} test=grp:{path}")
    assert f"{path}:2" in message, message
    assert "message 0 of 'inputs': content[0]: a part of type 'image_url'" in message, message


def test_malformed_line_names_file_and_line(files: dict[str, Path], tmp_path: Path) -> None:
    path = _write(tmp_path / "broken.jsonl", _rows("br", 3, 3), raw_lines={4: '{"inputs": "x", "ids": '})
    message = _error(f"train={files['train']} dev={files['mt']} test=grp:{path}")
    assert message.startswith(f"--data test=grp:{path}: {path}:4: malformed JSON"), message
    # The column is where the line breaks off (after its 23 characters), not "column 1" of a line 2
    # that the line's own newline made.
    assert "at column 24)" in message, message


def test_unlabelled_row_names_file_and_line(files: dict[str, Path], tmp_path: Path) -> None:
    rows = _rows("ul", 2, 2)
    del rows[2]["labels"]
    path = _write(tmp_path / "unlabelled.jsonl", rows)
    for spec in (
        f"train={path} dev={files['mt']}",
        f"train={files['train']} dev={path}",
        f"train={files['train']} dev={files['mt']} test={path}",
    ):
        message = _error(spec)
        assert f"{path}:3: missing field 'labels'" in message and message.startswith("--data "), message


def test_duplicate_ids_within_a_split_name_both_places(files: dict[str, Path], tmp_path: Path) -> None:
    clash = _rows("x", 2, 2)
    clash[3]["ids"] = "mt-5"
    path = _write(tmp_path / "clash.jsonl", clash)
    message = _error(f"train={files['train']} dev=mt:{files['mt']},mt:{path} test={files['anthropic']}")
    assert message == (
        f"--data dev: id 'mt-5' at {path}:4 repeats (first at {files['mt']}:6);"
        " ids must be unique within a split"
    )
    # Within one file, read_dataset's own check names both lines.
    same = _rows("s", 2, 2)
    same[2]["ids"] = "s-0"
    one = _write(tmp_path / "same.jsonl", same)
    message = _error(f"train={one} dev={files['mt']}")
    assert message.startswith(f"--data train={one}: {one}:3: id 's-0' repeats (first at {one}:1)")


def test_ids_shared_by_two_groups_are_qualified_by_group(files: dict[str, Path], tmp_path: Path) -> None:
    """The McKenzie et al. dev files number rows independently; two groups may share an id."""
    clash = _rows("x", 2, 2)
    clash[3]["ids"] = "mt-5"
    path = _write(tmp_path / "clash.jsonl", clash)
    data = load_data(f"train={files['train']} dev={files['mt']},{path} test={files['anthropic']}")
    ids = [e.id for e in data.dev]
    assert "mt/mt-5" in ids and "clash/mt-5" in ids and len(set(ids)) == len(ids)
    assert all(e.id.startswith(f"{e.group}/") for e in data.dev)
    assert not any("/" in e.id for e in data.test)  # only the split with the clash is qualified


def test_the_same_id_in_two_splits_is_allowed(files: dict[str, Path]) -> None:
    data = load_data(f"train={files['mt']} dev={files['mt']} test={files['mt']}")
    assert [e.id for e in data.train] == [e.id for e in data.test]


def test_a_file_left_empty_after_dropping_ambiguous_rows(files: dict[str, Path], tmp_path: Path) -> None:
    rows = [{"inputs": f"maybe {i}", "ids": f"amb-{i}", "labels": "ambiguous"} for i in range(3)]
    path = _write(tmp_path / "all_ambiguous.jsonl", rows)
    message = _error(f"train={files['train']} dev={files['mt']} test={path}")
    assert message == f"--data test={path}: {path}: no examples (after dropping 3 ambiguous rows)"


def test_train_with_one_class(files: dict[str, Path], tmp_path: Path) -> None:
    path = _write(tmp_path / "only_low.jsonl", _rows("ol", 0, 5))
    message = _error(f"train={path} dev={files['mt']}")
    assert message.startswith("--data train: all 5 examples are low-stakes"), message


def test_dev_file_too_small_to_cut(files: dict[str, Path], tmp_path: Path) -> None:
    path = _write(tmp_path / "tiny.jsonl", _rows("ti", 1, 0))
    message = _error(f"train={files['train']} dev={path}")
    assert message.startswith(f"--data dev={path}: 1 examples are too few") and "test=PATH" in message


# ---------------------------------------------------------------------------------------------
# Hugging Face references
# ---------------------------------------------------------------------------------------------


def test_hf_reference_downloads_through_hf_hub_download(files: dict[str, Path], monkeypatch) -> None:
    import huggingface_hub

    calls: list[tuple] = []

    def fake_download(repo_id: str, filename: str, **kwargs: object) -> str:
        calls.append((repo_id, filename, kwargs))
        return str(files["anthropic"])

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    data = load_data(f"train={files['train']} dev=hf:someone/stakes/eval/anthropic_dev.jsonl")
    assert calls == [("someone/stakes", "eval/anthropic_dev.jsonl", {"repo_type": "dataset"})]
    assert {e.group for e in data.dev} == {"anthropic_dev"}, "the group defaults to the file stem"
    assert data.files[1].path == files["anthropic"]


def test_hf_reference_offline_is_one_clear_line(files: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    ref = "hf:ctd-harness-tests/no-such-data/dev/part.jsonl"
    message = _error(f"train={files['train']} dev=mt:{ref}")
    assert message.startswith(f"--data dev=mt:{ref}: cannot get {ref}: the Hugging Face Hub is unreachable")


def test_hf_reference_network_error_and_not_found(files: dict[str, Path], monkeypatch) -> None:
    import huggingface_hub
    from huggingface_hub import errors as hf_errors

    def unreachable(*args: object, **kwargs: object) -> str:
        raise hf_errors.LocalEntryNotFoundError("cannot reach the hub\nsecond line")

    def connection_reset(*args: object, **kwargs: object) -> str:
        raise ConnectionResetError("connection reset by peer")

    ref = "hf:owner/name/file.jsonl"
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    assert "unreachable" in _error(f"train={files['train']} dev={ref}")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", connection_reset)
    message = _error(f"train={files['train']} dev={ref}")
    assert (
        message == f"--data dev={ref}: cannot get {ref} from the Hugging Face Hub (connection reset by peer)"
    )


@pytest.mark.parametrize("ref", ["hf:owner/name", "hf:owner//file.jsonl", "hf:"])
def test_hf_reference_malformed(files: dict[str, Path], ref: str) -> None:
    message = _error(f"train={files['train']} dev={ref}")
    assert message == f"--data dev={ref}: {ref!r} is not hf:OWNER/NAME/PATH/IN/REPO.jsonl"
