"""The CLI's last line of defence against printing a secret: stderr, where every error line,
warning and traceback goes, passes through the experts' redactor (`experts.redact`). The expert
stage already redacts what servers say where it enters; this catches whatever reaches a print
by another road."""

from __future__ import annotations

from typing import TextIO

from experts import redact

__all__ = ["RedactingStream"]


class RedactingStream:
    """A text stream that writes to `stream` what it is given, redacted; everything else (isatty,
    fileno, encoding, the byte buffer) is the wrapped stream's, so consoles still see a terminal."""

    def __init__(self, stream: TextIO) -> None:
        self.wrapped = stream

    def write(self, text: str) -> int:
        self.wrapped.write(redact(text))
        return len(text)  # what the caller gave: a shorter count would make it write the rest again

    def writelines(self, lines: list[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.wrapped.flush()

    def __getattr__(self, name: str) -> object:
        return getattr(self.wrapped, name)
