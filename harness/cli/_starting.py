"""`ctd eval` in a terminal says at once that it is starting: "ctd eval: starting", written before
the command line's imports, on a line that the first output after it replaces (the run's live
display, or the one error line of a refused run), so a terminal is never blank for the second
those imports take and a refusal still reads as one line. Elsewhere (a file, a pipe, --json,
--help) nothing is written."""

from __future__ import annotations

import os
import sys
from typing import TextIO

__all__ = ["say_eval_is_starting"]

_LINE = "ctd eval: starting"
_CLEAR_LINE = "\r\x1b[2K"  # back to the line's start, erase it
_QUIET = frozenset({"--json", "--help", "-h"})


def say_eval_is_starting() -> None:
    args = sys.argv[1:]
    if args[:1] != ["eval"] or _QUIET & set(args) or not sys.stderr.isatty():
        return
    if os.environ.get("LOCAL_RANK", "0") != "0":  # `accelerate launch`: one line, from the main process
        return
    sys.stderr.write(_LINE)
    sys.stderr.flush()
    sys.stderr = _ReplacesTheLine(sys.stderr)


class StreamWrapper:
    """A text stream that writes to the wrapped one; every other attribute (isatty, fileno,
    encoding, the byte buffer) is the wrapped stream's, so consoles still see a terminal.
    Subclasses change `write`."""

    def __init__(self, stream: TextIO) -> None:
        self.wrapped = stream

    def write(self, text: str) -> int:
        self.wrapped.write(text)
        return len(text)

    def writelines(self, lines: list[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.wrapped.flush()

    def __getattr__(self, name: str) -> object:
        return getattr(self.wrapped, name)


class _ReplacesTheLine(StreamWrapper):
    """stderr, whose first write starts by erasing the starting line."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._pending = True

    def write(self, text: str) -> int:
        if self._pending and text:
            self._pending = False
            self.wrapped.write(_CLEAR_LINE)
        return super().write(text)
