"""The data spec: which labelled files make up the train, dev and test splits, and their groups.

On the command line the spec is a list of `KEY=VALUE` tokens (one option value per token, or one
string with the tokens separated by whitespace):

    train=PATH  dev=GROUP:PATH,GROUP:PATH  test=GROUP:PATH,...

- `train` trains the safety probe, `dev` the DV probe, `test` is for calibration and evaluation.
  A key given twice adds its entries to the first (`dev=a.jsonl dev=b.jsonl`).
- `GROUP:PATH` puts every row of PATH in GROUP. Without `GROUP:` a row keeps its own `group`
  field if it has one, else the file stem names the group (`anthropic.jsonl` -> `anthropic`).
- PATH is a local JSONL or CSV file of the McKenzie et al. format, `builtin` (the built-in file of
  that split, see `harness.data.builtin`), or `hf:OWNER/NAME/PATH/IN/REPO.jsonl`, a file of a Hugging
  Face dataset repository (downloaded once into the Hugging Face cache).
- With no `test`, each dev file is cut into a dev half and a test half, stratified by (group,
  label), by a salted SHA-256 of the example id: the same ids always land in the same half.
- An empty spec, or the single token `builtin`, means the whole built-in set.

Paths containing whitespace are not supported (whitespace separates tokens).

Every problem is one `InputError` line that names the option, the entry and, where there is one,
the file and line.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast, get_args

from .._errors import InputError
from ._datasets import Dataset, read_dataset
from ._example import Example, SplitName
from ._limit import stratified_limit
from .builtin import builtin_dir

__all__ = [
    "BUILTIN",
    "HF_PREFIX",
    "SPLITS",
    "SPLIT_SALT",
    "DataFile",
    "DataSource",
    "DataSpec",
    "DataSplits",
    "Example",
    "SplitName",
    "load_data",
    "parse_data_spec",
]

SPLITS: tuple[SplitName, ...] = get_args(SplitName)
BUILTIN = "builtin"
HF_PREFIX = "hf:"
SPLIT_SALT = "ctd-dev-test-split-v1"
"""Salt of the id hash that cuts a dev file into dev and test halves; change it only with intent."""

_HASH_VERSION = b"ctd-data-v1\n"
_GROUP = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_LABEL_NAMES = {1: "high-stakes", 0: "low-stakes"}


@dataclass(frozen=True)
class DataSource:
    """One entry of the spec: where the rows come from and which group they get."""

    split: SplitName
    ref: str
    """As written: a local path, `builtin`, or `hf:OWNER/NAME/PATH/IN/REPO.jsonl`."""
    group: str | None = None
    """The `GROUP:` prefix; None means each row's `group` field, else the file stem."""

    def __str__(self) -> str:
        prefix = f"{self.group}:" if self.group else ""
        return f"{self.split}={prefix}{self.ref}"


@dataclass(frozen=True)
class DataSpec:
    """A parsed spec, before any file is read. `test_from_dev` is True when no `test` entry was
    given, so that each dev file is cut into dev and test halves."""

    sources: tuple[DataSource, ...]

    def entries(self, split: SplitName) -> tuple[DataSource, ...]:
        return tuple(source for source in self.sources if source.split == split)

    @property
    def test_from_dev(self) -> bool:
        return not self.entries("test")


@dataclass(frozen=True)
class DataFile:
    """What one spec entry contributed: the local file read, the rows kept and the ambiguous
    rows dropped. With an automatic split, a dev file's `examples` count both halves."""

    source: DataSource
    path: Path
    examples: int
    dropped: int


@dataclass(frozen=True)
class DataSplits:
    """The examples of each split, in id order, and where they came from.

    Examples are sorted by id (ids are unique within a split), so a split's content, not the
    order of files or rows, decides everything downstream: a stage whose result depends on order
    (a seeded shuffle while training) gives the same result for the same content, which is what
    makes `content_hash` a sound cache key.
    """

    train: tuple[Example, ...]
    dev: tuple[Example, ...]
    test: tuple[Example, ...]
    files: tuple[DataFile, ...]
    test_from_dev: bool
    """True when no `test` entry was given and each dev file was cut into dev and test halves."""
    where: Mapping[tuple[SplitName, str], str] = field(default_factory=dict, compare=False, repr=False)
    """(split, id) -> the "file:line" the example was read from, for messages about one example."""

    def __getitem__(self, split: SplitName) -> tuple[Example, ...]:
        if split not in SPLITS:
            raise KeyError(split)
        return getattr(self, split)

    @property
    def dropped(self) -> dict[str, int]:
        """Ambiguous rows left out, per spec entry (e.g. `{"dev=mt:mt.jsonl": 3}`)."""
        return {str(file.source): file.dropped for file in self.files}

    def counts(self) -> dict[SplitName, dict[str, dict[int, int]]]:
        """Examples per split, group and label: `counts()["test"]["chat"][1]`."""
        out: dict[SplitName, dict[str, dict[int, int]]] = {}
        for split in SPLITS:
            groups: dict[str, dict[int, int]] = {}
            for example in self[split]:
                per_label = groups.setdefault(example.group, {0: 0, 1: 0})
                per_label[example.label] += 1
            out[split] = dict(sorted(groups.items()))
        return out

    def content_hash(self, split: SplitName) -> str:
        """SHA-256 (hex) over the split's ids, labels, groups and conversations (canonical JSON),
        in id order. It ignores where the examples came from: file names, file order, row order,
        dropped rows and the split's name. A changed label, group or text changes it."""
        digest = hashlib.sha256(_HASH_VERSION)
        for example in self[split]:
            record = [example.id, example.label, example.group, example.conversation]
            digest.update(
                json.dumps(record, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()
            )
            digest.update(b"\n")
        return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------


def _tokens(spec: str | Sequence[str] | None) -> list[str]:
    if spec is None:
        return []
    values = [spec] if isinstance(spec, str) else list(spec)
    return [token for value in values for token in str(value).split()]


def parse_data_spec(spec: str | Sequence[str] | None, *, option: str = "--data") -> DataSpec:
    """Parse the spec's tokens: syntax only, no file is read (`load_data` checks the files and
    that train and dev are given). `option` names the spec in error messages."""
    tokens = _tokens(spec)
    if not tokens or tokens == [BUILTIN]:
        return DataSpec(tuple(DataSource(split, BUILTIN) for split in SPLITS))
    if BUILTIN in tokens:
        raise InputError(
            f"{option}: {BUILTIN!r} alone means the whole built-in set and cannot be combined with"
            f" other entries; write train={BUILTIN}, dev={BUILTIN} or test={BUILTIN} instead"
        )
    sources: list[DataSource] = []
    for token in tokens:
        key, eq, value = token.partition("=")
        if not eq:
            raise InputError(
                f"{option}: {token!r} is not KEY=VALUE (keys: {', '.join(SPLITS)}; or {BUILTIN})"
            )
        if key not in SPLITS:
            close = difflib.get_close_matches(key, SPLITS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InputError(
                f"{option}: unknown key {key!r} in {token!r} (expected {', '.join(SPLITS)}){hint}"
            )
        if not value:
            raise InputError(f"{option}: {token!r} names no file")
        for entry in value.split(","):
            sources.append(_source(cast(SplitName, key), entry, token, option))
    return DataSpec(tuple(sources))


def _source(split: SplitName, entry: str, token: str, option: str) -> DataSource:
    """One comma-separated entry: `PATH`, `GROUP:PATH`, `hf:...` or `GROUP:hf:...`."""
    if not entry:
        raise InputError(f"{option}: empty entry in {token!r} (a doubled or trailing comma?)")
    if entry.startswith(HF_PREFIX) or ":" not in entry:
        return DataSource(split, entry)
    group, _, ref = entry.partition(":")
    if not _GROUP.fullmatch(group):
        raise InputError(
            f"{option}: group {group!r} in {token!r} must start with a letter or digit and contain"
            " only letters, digits, '_', '-' and '.'"
        )
    if not ref:
        raise InputError(f"{option}: {entry!r} in {token!r} names a group but no file")
    return DataSource(split, ref, group)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def _hf_path(ref: str, where: str) -> Path:
    """Download `hf:OWNER/NAME/PATH/IN/REPO` (a dataset repository file) into the Hugging Face
    cache, or find it there when offline; every failure is one InputError line naming `ref`."""
    parts = ref[len(HF_PREFIX) :].split("/")
    if len(parts) < 3 or not all(parts):
        raise InputError(f"{where}: {ref!r} is not {HF_PREFIX}OWNER/NAME/PATH/IN/REPO.jsonl")
    repo_id, filename = "/".join(parts[:2]), "/".join(parts[2:])
    try:
        import huggingface_hub
        from huggingface_hub import errors as hf_errors
    except ImportError:
        raise InputError(f"{where}: reading {ref} needs the huggingface_hub package") from None
    try:
        return Path(huggingface_hub.hf_hub_download(repo_id, filename, repo_type="dataset"))
    except (hf_errors.LocalEntryNotFoundError, hf_errors.OfflineModeIsEnabled):
        raise InputError(
            f"{where}: cannot get {ref}: the Hugging Face Hub is unreachable (offline, HF_HUB_OFFLINE"
            " or a network error) and the file is not in the local cache"
        ) from None
    except (
        hf_errors.RepositoryNotFoundError,
        hf_errors.RemoteEntryNotFoundError,
        hf_errors.RevisionNotFoundError,
    ):
        raise InputError(
            f"{where}: {ref} not found on the Hugging Face Hub (no dataset repository {repo_id!r}"
            f" with a file {filename!r}, or it is private or gated)"
        ) from None
    except (hf_errors.HFValidationError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{where}: cannot get {ref} from the Hugging Face Hub ({first})") from None


def _local_path(source: DataSource, where: str, base: Path | None) -> Path:
    if source.ref == BUILTIN:
        return builtin_dir() / f"{source.split}.jsonl"
    if source.ref.startswith(HF_PREFIX):
        return _hf_path(source.ref, where)
    path = Path(source.ref).expanduser()
    if base is not None and not path.is_absolute():
        path = base / path
    if not path.is_file():
        what = "is a folder, expected a .jsonl or .csv file" if path.is_dir() else "no such file"
        raise InputError(f"{where}: {path}: {what}")
    return path


def _read(source: DataSource, where: str, base: Path | None) -> tuple[Path, Dataset]:
    path = _local_path(source, where, base)
    try:
        return path, read_dataset(path, require_labels=True)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


def _examples(source: DataSource, dataset: Dataset, path: Path) -> list[tuple[Example, str]]:
    """(example, file:line) pairs; the group is GROUP:, else the row's field, else the stem."""
    row_groups = dataset.extra.get("group", [""] * len(dataset))
    stem = Path(source.ref[len(HF_PREFIX) :] if source.ref.startswith(HF_PREFIX) else path).stem
    out: list[tuple[Example, str]] = []
    for item, label, row_group, where in zip(
        dataset.items, dataset.labels, row_groups, dataset.where, strict=True
    ):
        assert label is not None  # read with require_labels=True
        group = source.group or row_group or stem
        out.append((Example(item.id, group, source.split, label, item.conversation), where))
    return out


def _half_key(example: Example) -> str:
    """The salted id hash that orders examples for the dev/test cut (not Python's `hash`, which
    changes between processes)."""
    return hashlib.sha256(f"{SPLIT_SALT}\0{example.id}".encode()).hexdigest()


def _cut(examples: Iterable[Example]) -> tuple[list[Example], list[Example]]:
    """Cut one dev file into (dev, test) halves: within each (group, label) stratum, examples in
    salted-hash order, the first floor(n/2) to dev, the rest to test."""
    strata: dict[tuple[str, int], list[Example]] = {}
    for example in examples:
        strata.setdefault((example.group, example.label), []).append(example)
    dev: list[Example] = []
    test: list[Example] = []
    for key in sorted(strata):
        members = sorted(strata[key], key=lambda e: (_half_key(e), e.id))
        half = len(members) // 2
        dev += members[:half]
        test += [_with_split(e, "test") for e in members[half:]]
    return dev, test


def _with_split(example: Example, split: SplitName) -> Example:
    return Example(example.id, example.group, split, example.label, example.conversation)


def load_data(
    spec: str | Sequence[str] | DataSpec | None,
    *,
    option: str = "--data",
    base: Path | None = None,
    limit: int | None = None,
) -> DataSplits:
    """Read every file of the spec and check the result. `base` resolves relative paths (default:
    the working directory); `option` names the spec in error messages. `limit` keeps at most that
    many examples per split, stratified by group and label (`stratified_limit`).

    Errors (one InputError line each): a bad token, a missing or malformed file (file:line), no
    train or no dev entry, an unlabelled row, an id repeated within a split (both places named),
    a split left empty after dropping ambiguous rows, a dev file too small to cut into halves, a
    train set of one class.
    """
    if limit is not None and limit < 1:
        raise InputError(f"--limit {limit}: must be at least 1")
    parsed = spec if isinstance(spec, DataSpec) else parse_data_spec(spec, option=option)
    per_split: dict[SplitName, list[tuple[Example, str]]] = {split: [] for split in SPLITS}
    files: list[DataFile] = []
    for source in parsed.sources:
        where = f"{option} {source}"
        path, dataset = _read(source, where, base)
        rows = _examples(source, dataset, path)
        files.append(DataFile(source, path, len(rows), dataset.dropped))
        if source.split == "dev" and parsed.test_from_dev:
            dev, test = _cut(example for example, _ in rows)
            if not dev or not test:
                raise InputError(
                    f"{where}: {len(rows)} examples are too few to cut into dev and test halves;"
                    " give test=PATH explicitly"
                )
            lines = {example.id: line for example, line in rows}
            per_split["dev"] += [(e, lines[e.id]) for e in dev]
            per_split["test"] += [(e, lines[e.id]) for e in test]
        else:
            per_split[source.split] += rows
    for split in ("train", "dev"):  # after reading, so that a bad file is reported first
        if not parsed.entries(split):
            raise InputError(f"{option}: no {split}= entry (give {split}=PATH, or {split}={BUILTIN})")
    checked = {split: _checked(split, per_split[split], parsed, option) for split in SPLITS}
    splits = {split: examples for split, (examples, _) in checked.items()}
    if limit is not None:
        splits = {split: tuple(stratified_limit(examples, limit)) for split, examples in splits.items()}
    _check_train_classes(splits["train"], option)
    return DataSplits(
        train=splits["train"],
        dev=splits["dev"],
        test=splits["test"],
        files=tuple(files),
        test_from_dev=parsed.test_from_dev,
        where={(split, i): line for split, (_, lines) in checked.items() for i, line in lines.items()},
    )


def _checked(
    split: SplitName, rows: list[tuple[Example, str]], spec: DataSpec, option: str
) -> tuple[tuple[Example, ...], dict[str, str]]:
    """The split's examples in id order, after checking that ids are unique and it is not empty,
    and where each was read from (id -> file:line).

    Files of different groups often number their rows independently (the McKenzie et al. dev
    files share ids such as "507"); when an id repeats across groups, every id of the split is
    qualified by its group ("mt/507"), so ids stay unique and still say where they came from."""
    if not rows:
        named = ", ".join(str(s) for s in spec.entries(split)) or f"{split}="
        raise InputError(f"{option} {named}: the {split} split has no examples")
    groups_of: dict[str, set[str]] = {}
    for example, _ in rows:
        groups_of.setdefault(example.id, set()).add(example.group)
    if any(len(groups) > 1 for groups in groups_of.values()):
        rows = [(replace(example, id=f"{example.group}/{example.id}"), where) for example, where in rows]
    first: dict[str, str] = {}
    for example, where in rows:
        if example.id in first:
            raise InputError(
                f"{option} {split}: id {example.id!r} at {where} repeats (first at {first[example.id]});"
                " ids must be unique within a split"
            )
        first[example.id] = where
    return tuple(sorted((example for example, _ in rows), key=lambda e: e.id)), first


def _check_train_classes(train: tuple[Example, ...], option: str) -> None:
    labels = {example.label for example in train}
    if len(labels) < 2:
        (only,) = labels
        raise InputError(
            f"{option} train: all {len(train)} examples are {_LABEL_NAMES[only]}; the safety probe"
            " needs both high-stakes and low-stakes examples"
        )
