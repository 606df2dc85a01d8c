"""The probe stage's one error type: bad input it can name in one line (model, layer, file)."""

from __future__ import annotations

__all__ = ["ProbeError", "RejectedExample"]


class ProbeError(Exception):
    """A problem with the user's input to the probe stage; the message is one line that says what
    is wrong and where (option, file)."""


class RejectedExample(ProbeError):
    """An example the model's chat template rejects. `index` is its position in the conversations
    given, so that the caller, which knows where the example came from, can name it."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"example {index}: {reason}")
        self.index = index
        self.reason = reason
