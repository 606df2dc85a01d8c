"""What the run saw of each test example: its conversation and whether the monitored model's
view of it was truncated.

The conversation is read again from the data the run's config.toml names (the run folder keeps
only its start, beside the expert's score); where those files are gone or no longer hold the
example as the run scored it, the start the query stage kept stands in, and the sample says so.
Truncation comes from the test split's activation store (probe/stores.json names it): its plan
holds each example's token count after truncation at max_tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from experts import Conversation
from probes import ActivationStore, StoreKey

from .._errors import InputError
from ..data import load_data, read_json, read_table
from ..run import RunLayout, load_run_config

__all__ = ["ExampleInput", "InputSource", "Inputs", "read_inputs"]

InputSource = Literal["data", "preview"]  # the conversation from the data files, or the kept start


@dataclass(frozen=True)
class ExampleInput:
    """One test example's input as exported."""

    conversation: Conversation
    source: InputSource
    tokens: int | None  # the monitored model's tokens after truncation; None when unknown
    max_tokens: int | None

    @property
    def truncated(self) -> bool | None:
        """Whether the probe saw a cut conversation (its token count reached max_tokens)."""
        if self.tokens is None or self.max_tokens is None:
            return None
        return self.tokens >= self.max_tokens


@dataclass(frozen=True)
class Inputs:
    """Every test example's input, and a note for the log when some are not what the run saw."""

    by_id: dict[str, ExampleInput]
    note: str | None  # why some inputs are only the kept start, or truncation is unknown

    def get(self, example_id: str) -> ExampleInput:
        return self.by_id.get(example_id, ExampleInput("", "preview", None, None))


def _previews(layout: RunLayout) -> dict[str, str]:
    """id -> the start of the input the query stage kept (test split)."""
    path = layout.query.expert_scores
    if not path.is_file():
        return {}
    c = read_table(path).columns
    if "text" not in c:
        return {}
    splits = c["split"].astype(str) if "split" in c else None
    return {
        str(i): str(t)
        for n, (i, t) in enumerate(zip(c["id"].astype(str), c["text"].astype(str), strict=True))
        if splits is None or splits[n] == "test"
    }


def _lengths(layout: RunLayout) -> list[int] | None:
    """The test split's token counts in the store's (id) order; None without a readable store."""
    if not layout.probe.stores.is_file():
        return None
    try:
        entry = read_json(layout.probe.stores)["splits"]["test"]
        store = ActivationStore(Path(entry["folder"]), StoreKey(**entry["key"]))
        return [int(n) for n in store.plan().lengths]
    except (InputError, OSError, KeyError, TypeError, ValueError):
        return None


def read_inputs(run_dir: Path, labels: dict[str, int]) -> Inputs:
    """Each test example's conversation and truncation; `labels` (id -> label, from the scores
    table) tells whether the data files still hold the example the run scored."""
    layout = RunLayout(run_dir)
    previews = _previews(layout)
    examples = None
    max_tokens = None
    note = None
    if layout.config.is_file():
        try:
            config = load_run_config(layout.config, {})
            max_tokens = config.max_tokens
            examples = load_data(config.data, limit=config.limit).test
        except InputError as exc:
            note = f"the run's data cannot be read again ({exc}); inputs are the start the run kept"
    else:
        note = f"no {layout.config.name}; inputs are the start the run kept"
    by_id: dict[str, ExampleInput] = {}
    if examples is not None:
        lengths = _lengths(layout)
        if lengths is not None and len(lengths) != len(examples):
            lengths = None
        if lengths is None:
            note = "no activation store of the test split; truncation unknown"
        for n, example in enumerate(examples):
            if labels.get(example.id) != example.label:
                continue  # not in the scores table, or the file changed since the run
            tokens = lengths[n] if lengths is not None else None
            by_id[example.id] = ExampleInput(example.conversation, "data", tokens, max_tokens)
    stand_ins = [i for i in labels if i not in by_id]
    for example_id in stand_ins:
        by_id[example_id] = ExampleInput(previews.get(example_id, ""), "preview", None, max_tokens)
    if stand_ins and note is None:
        note = (
            f"{len(stand_ins)} of {len(labels)} test examples are no longer in the run's data as it "
            "scored them; their inputs are the start the run kept"
        )
    return Inputs(by_id, note)
