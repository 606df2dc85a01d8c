"""One labelled example of a data set, and the one-line preview of its input that the report shows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from experts import Conversation

if TYPE_CHECKING:
    from experts import Item

__all__ = ["PREVIEW_CHARS", "Example", "SplitName"]

SplitName = Literal["train", "dev", "test"]

PREVIEW_CHARS = 600
_ROLE_TAGS = {"system": "[Sys]", "user": "[User]", "assistant": "[Asst]"}


@dataclass(frozen=True)
class Example:
    """One labelled example: `label` is 1 for high-stakes, 0 for low-stakes; `conversation` is a
    plain string (one user turn) or a list of {"role", "content"} messages."""

    id: str
    group: str
    split: SplitName
    label: int
    conversation: Conversation

    def item(self) -> Item:
        """The expert's view of the example: its id and conversation."""
        # The expert client (aiohttp, sqlmodel) loads with the first data set, not on --help
        from experts import Item

        return Item(self.id, self.conversation)

    def preview(self) -> str:
        """The start of the input as one line, "[Sys] ... [User] ... [Asst] ...", at most
        PREVIEW_CHARS characters (an ellipsis marks a cut): kept beside the expert's score for
        the report's case studies."""
        if isinstance(self.conversation, str):
            text = f"[User] {self.conversation}"
        else:
            text = " ".join(
                f"{_ROLE_TAGS.get(m.get('role', ''), '[' + str(m.get('role')) + ']')} {m.get('content', '')}"
                for m in self.conversation
            )
        text = " ".join(text.split())
        return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
