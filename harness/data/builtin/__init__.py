"""The built-in labelled data set: `train.jsonl`, `dev.jsonl` and `test.jsonl` in this folder, read
by the data spec when no `--data` is given. Their generator (`_generate`, with the hand-written
templates in `_templates`) is not on the run-time path: `python -m harness.data.builtin._generate`
rewrites the files, and a test checks that the shipped bytes equal a rewrite."""

from pathlib import Path

__all__ = ["builtin_dir"]


def builtin_dir() -> Path:
    """The folder of the installed built-in files (`train.jsonl`, `dev.jsonl`, `test.jsonl`)."""
    return Path(__file__).parent
