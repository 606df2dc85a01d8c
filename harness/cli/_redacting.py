"""The CLI's last line of defence against printing a secret: stderr, where every error line,
warning and traceback goes, passes through the experts' redactor (`experts.redact`). The expert
stage already redacts what servers say where it enters; this catches whatever reaches a print
by another road."""

from __future__ import annotations

from experts import redact

from ._starting import StreamWrapper

__all__ = ["RedactingStream"]


class RedactingStream(StreamWrapper):
    """A text stream that writes to `stream` what it is given, redacted."""

    def write(self, text: str) -> int:
        self.wrapped.write(redact(text))
        return len(text)  # what the caller gave: a shorter count would make it write the rest again
