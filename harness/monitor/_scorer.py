"""The probe side of the monitor: the monitored model's truncated forward pass and the two saved
probes, exactly as the run computed them (probes' own tokenize, length buckets, padding, layer hook,
float16 activations and `predict`), so that a bundle scores new text as the run scored its data."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from probes import (
    Conversation,
    LoadedModel,
    ProbeArtifact,
    ProbeError,
    Ragged,
    bucket_batches,
    layer_activations,
    load_model,
    load_probe,
    pad_batch,
    predict,
    tokenize,
)

from .._errors import InputError

__all__ = ["ProbeScorer", "Tokens"]


@dataclass(frozen=True)
class Tokens:
    """One conversation rendered with the model's chat template and cut to the token limit."""

    ids: tuple[int, ...]
    truncated: bool


class ProbeScorer:
    """Token ids in, (probe P(y=1), DV) out, for a batch of conversations at once."""

    def __init__(
        self, model: LoadedModel, safety: nn.Module, dv: nn.Module, reads: ProbeArtifact, batch_tokens: int
    ) -> None:
        self.model = model
        self.safety = safety
        self.dv = dv
        self.reads = reads
        self.batch_tokens = max(batch_tokens, reads.max_tokens)

    @classmethod
    def load(
        cls, safety_stem: Path, dv_stem: Path, *, model: str | None = None, batch_tokens: int = 8192
    ) -> ProbeScorer:
        """The two probes and the model they read (the one named in their record unless `model`
        names another copy of the same weights); a model, layer or template other than the probes
        were trained on is an InputError."""
        safety, reads = load_probe(safety_stem)
        dv, dv_reads = load_probe(dv_stem)
        for key in ("model_identity", "layer", "max_tokens", "template_hash", "dim"):
            if getattr(reads, key) != getattr(dv_reads, key):
                raise InputError(f"{dv_stem}: the DV probe reads a different {key} than the safety probe")
        loaded = load_model(model or reads.model)
        if loaded.identity != reads.model_identity:
            raise InputError(
                f"model {model or reads.model}: its weights ({loaded.identity}) are not those the probes "
                f"were trained on ({reads.model_identity})"
            )
        if loaded.template_hash != reads.template_hash or loaded.hidden_size != reads.dim:
            raise InputError(f"model {model or reads.model}: chat template or width differs from the probes'")
        return cls(loaded, safety, dv, reads, batch_tokens)

    def tokens(self, conversation: Conversation) -> Tokens:
        """The conversation's token ids; a conversation the chat template rejects is a ProbeError."""
        ids, truncated = tokenize(self.model.tokenizer, [conversation], self.reads.max_tokens)
        return Tokens(tuple(ids[0]), bool(truncated))

    @torch.no_grad()
    def score(self, batch: list[Tokens]) -> list[tuple[float, float]]:
        """(probe, dv) of each item, in order: one truncated forward pass per length bucket."""
        lengths = np.array([len(t.ids) for t in batch], dtype=np.int64)
        rows: list[np.ndarray | None] = [None] * len(batch)
        for bucket in bucket_batches(lengths, self.batch_tokens, max_batch=len(batch)):
            input_ids, mask = pad_batch(
                [list(batch[i].ids) for i in bucket], self.model.tokenizer.pad_token_id, self.model.device
            )
            hidden = layer_activations(self.model, self.reads.layer, input_ids, mask)  # (B, T, d)
            # As the activation store keeps them: float16, real tokens only.
            values = hidden.to(torch.float16).cpu().numpy()
            for row, i in enumerate(bucket):
                rows[i] = values[row, : lengths[i]]
        acts = Ragged.from_arrays([r for r in rows if r is not None])
        probe = predict(self.safety, acts, task="safety")
        dv = predict(self.dv, acts, task="dv")
        return [(float(p), float(d)) for p, d in zip(probe, dv, strict=True)]


def check_conversation(scorer: ProbeScorer, conversation: Conversation) -> Tokens:
    """`scorer.tokens` with the template's refusal as an InputError (a 4xx at the server)."""
    try:
        return scorer.tokens(conversation)
    except ProbeError as error:
        raise InputError(str(error).removeprefix("example 0: ")) from None
