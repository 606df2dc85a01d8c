"""The probe stage's one error type: bad input it can name in one line (model, layer, file)."""

from __future__ import annotations

__all__ = ["ProbeError"]


class ProbeError(Exception):
    """A problem with the user's input to the probe stage; the message is one line that says what
    is wrong and where (option, file)."""
