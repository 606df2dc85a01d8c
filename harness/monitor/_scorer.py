"""The probe side of the monitor: the monitored model's truncated forward pass and the two saved
probes, computing what the run computed (probes' own tokenize, padding and layer hook, float16
activations, and the probe inputs `predict` builds from them), so that a bundle scores new text as
the run scored its data, up to float rounding.

Everything stays on the model's device: the probes are moved there at load, and the hidden states
go into them without a copy to the host; only the two scores per conversation come back."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from probes import (
    BATCH_TOKENS,
    Conversation,
    LoadedModel,
    ProbeArtifact,
    ProbeError,
    bucket_batches,
    device_answers,
    encode,
    identity_matches,
    is_legacy_identity,
    layer_activations,
    load_model,
    load_probe,
    pad_batch,
    render_each,
    tokenize,
)

from .._errors import InputError

__all__ = ["PassCost", "ProbeScorer", "Tokens", "forward_passes"]

# `ProbeScorer.fit_pass_cost` stops timing larger passes once one takes this long: it runs at every
# monitor start (and in each `ctd score` process), where a CPU pass of 16 conversations of 512
# tokens at a deep layer takes seconds.
FIT_PASS_SECONDS = 0.05


@dataclass(frozen=True)
class PassCost:
    """What one forward pass of the scorer costs, fitted on this machine (`ProbeScorer.fit_pass_cost`):
    seconds = per_pass + per_token * (conversations x the pass's longest, in tokens)."""

    per_pass: float
    per_token: float

    def seconds(self, conversations: np.ndarray, width: np.ndarray) -> np.ndarray:
        return self.per_pass + self.per_token * conversations * width


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
        # On the model's device, so that hidden states reach them without a copy to the host.
        self.safety = safety.to(model.device).eval()
        self.dv = dv.to(model.device).eval()
        self.reads = reads
        self.batch_tokens = max(batch_tokens, reads.max_tokens)
        self.pass_cost: PassCost | None = None  # None: as few passes as the budget allows

    @classmethod
    def load(
        cls, safety_stem: Path, dv_stem: Path, *, model: str | None = None, batch_tokens: int = BATCH_TOKENS
    ) -> ProbeScorer:
        """The two probes and the model they read (the one named in their record unless `model`
        names another copy of the same weights); a model, layer or template other than the probes
        were trained on is an InputError."""
        safety, reads = load_probe(safety_stem)
        dv, dv_reads = load_probe(dv_stem)
        for key in ("model_identity", "layer", "max_tokens", "template_hash", "dim", "dtype"):
            if getattr(reads, key) != getattr(dv_reads, key):
                raise InputError(f"{dv_stem}: the DV probe reads a different {key} than the safety probe")
        # In the dtype the probes were trained in (bfloat16 from a GPU run, on a CPU too): the
        # certified scores were computed so. A record without one: the device's default.
        loaded = load_model(model or reads.model, dtype=getattr(torch, reads.dtype) if reads.dtype else None)
        if not identity_matches(reads.model_identity, loaded) and is_legacy_identity(reads.model_identity):
            raise InputError(
                f"model {model or reads.model}: the probes record the folder identity of an older ctd "
                f"({reads.model_identity}: a path and file times, not content), which this folder does "
                "not match; serve the model from that folder unchanged, or re-run `ctd eval` and "
                "`ctd monitor calibrate` to record its content hash"
            )
        if not identity_matches(reads.model_identity, loaded):
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

    def tokens_each(self, conversations: Sequence[Conversation]) -> list[Tokens | InputError]:
        """`tokens` of each conversation, those the template renders encoded in one batch call, or
        the InputError (a 4xx at the server) of one the chat template rejects."""
        limit, texts = self.reads.max_tokens, render_each(self.model.tokenizer, conversations)
        # One token over the limit marks a cut conversation; the cut ids are those of `tokens`.
        ids, _ = encode(self.model.tokenizer, [t for t in texts if isinstance(t, str)], limit + 1)
        encoded = iter(ids)
        out: list[Tokens | InputError] = []
        for text in texts:
            if isinstance(text, ProbeError):
                out.append(InputError(str(text)))
            else:
                e = next(encoded)
                out.append(Tokens(tuple(e[:limit]), len(e) > limit))
        return out

    @torch.no_grad()
    def score(self, batch: list[Tokens]) -> list[tuple[float, float]]:
        """(probe, dv) of each item, in order (`forward_passes` says how many passes)."""
        lengths = np.array([len(t.ids) for t in batch], dtype=np.int64)
        device = self.model.device  # the probes'; with device_map="auto", hidden may sit elsewhere
        raw = torch.empty((2, len(batch)), dtype=torch.float32, device=device)  # (safety, dv) x items
        for rows in forward_passes(lengths, self.batch_tokens, self.pass_cost):
            input_ids, mask = pad_batch(
                [list(batch[i].ids) for i in rows], self.model.tokenizer.pad_token_id, self.model.device
            )
            hidden = layer_activations(self.model, self.reads.layer, input_ids, mask)  # (B, T, d)
            index = torch.tensor(rows, device=device)
            for k, probe in enumerate((self.safety, self.dv)):
                raw[k, index] = probe(*probe_inputs(hidden.to(device), mask.to(device), pooled=probe.pooled))
        safety, dv = raw.double().cpu()  # the one copy to the host: two numbers per conversation
        return [(float(p), float(d)) for p, d in zip(torch.sigmoid(safety), dv, strict=True)]

    def device_answers(self) -> bool:
        """Whether the devices of the model and the probes still run work (`probes.device_answers`):
        asked after a failed pass, whose error may have left the CUDA context unusable."""
        devices = {parameter.device for parameter in self.model.model.parameters()}
        return device_answers(devices | {torch.device(self.model.device)})

    def fit_pass_cost(self, max_batch: int) -> PassCost:
        """Fit `PassCost` through the time of a pass of one short conversation and of the largest
        pass timed, and cut micro-batches by it from now on. The large pass grows by doubling from
        one conversation of the probes' full width to a micro-batch of `max_batch`, or until a pass
        takes FIT_PASS_SECONDS (on a CPU the cost is linear long before that; a GPU gets there fast).
        Each size runs once untimed first (allocation, kernel choice); the times of the short and
        the largest pass are the faster of two runs."""
        filler = self.tokens("warm-up").ids[-1]
        wide = self.reads.max_tokens
        short = min(16, wide)
        most = max(1, min(max_batch, self.batch_tokens // wide))
        batch = [Tokens((filler,) * short, False)]
        self.score(batch)
        small, t_small = short, min(self._timed(batch) for _ in range(2))
        n = 1
        while True:
            batch = [Tokens((filler,) * wide, False)] * n
            self.score(batch)
            large, t_large = n * wide, self._timed(batch)
            if n == most or t_large >= FIT_PASS_SECONDS:
                break
            n = min(2 * n, most)
        t_large = min(t_large, self._timed(batch))  # one slow run must not make tokens look dear
        per_token = max((t_large - t_small) / (large - small), 0.0) if large > small else 0.0
        # The short pass is nearly all per-pass cost; a floor keeps noise from pricing passes at
        # nothing, which would cut a pass per distinct length.
        self.pass_cost = PassCost(max(t_small - per_token * small, t_small / 2), per_token)
        return self.pass_cost

    def _timed(self, batch: list[Tokens]) -> float:
        started = time.perf_counter()
        self.score(batch)  # ends with the scores' copy to the host: the device's work is done
        return time.perf_counter() - started


def forward_passes(
    lengths: np.ndarray, batch_tokens: int, cost: PassCost | None = None
) -> tuple[tuple[int, ...], ...]:
    """The forward passes of one micro-batch (item indices, longest first), each at most
    `batch_tokens` padded tokens: the cut of the items in length order that costs least under `cost`
    (no other grouping costs less: a pass is as wide as its longest item), or without one, as few
    passes as the budget allows, whatever the padding.

    Neither rule suits every machine and data set (issue 25, 2 cores): on the built-in split's 45 to
    123 tokens one pass per micro-batch of 32 ran 117 conversations/s against 170 with passes cut at
    25% padding, and on McKenzie-length ones (up to 512) 135 against 218; on a GPU a pass is a launch
    and a sync, and a padded token nearly free until the pass is compute-bound."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if cost is None:
        return bucket_batches(lengths, batch_tokens, max_batch=len(lengths), max_padding=1.0)
    order = np.argsort(-lengths, kind="stable")
    width = lengths[order].astype(np.float64)  # longest first: a pass from i on is width[i] wide
    n = len(order)
    best = np.zeros(n + 1)  # best[j]: the least cost of the first j items in passes
    start = np.zeros(n + 1, dtype=np.int64)  # where the last pass of that cut starts
    for j in range(1, n + 1):
        first = np.arange(j)  # a last pass of items first..j-1, as wide as item `first`
        size = j - first
        total = best[:j] + cost.seconds(size, width[:j])
        total[(size > 1) & (size * width[:j] > batch_tokens)] = np.inf  # one item always fits
        start[j] = int(np.argmin(total))  # the first of equals: the larger pass
        best[j] = total[start[j]]
    passes = []
    j = n
    while j > 0:
        passes.append(tuple(int(i) for i in order[start[j] : j]))
        j = start[j]
    return tuple(reversed(passes))


def probe_inputs(hidden: Tensor, mask: Tensor, *, pooled: bool) -> tuple[Tensor, Tensor]:
    """What `probes.predict` feeds a probe, built on the hidden states' device: the real tokens
    as float16 (as the activation store keeps them), then float32 with zeros at padding, or, for a
    pooled probe, their mean accumulated in float64 (as `Ragged.mean_pooled`) as one token.

    hidden (B, T, d) in the model's dtype, mask (B, T) 1 at real tokens -> x (B, T or 1, d) float32,
    mask (B, T or 1) bool."""
    real = mask.bool()  # (B, T)
    stored = torch.where(real[..., None], hidden.to(torch.float16), 0.0)  # (B, T, d) float16
    if not pooled:
        return stored.float(), real
    mean = stored.double().sum(dim=1) / real.sum(dim=1, keepdim=True)  # (B, d) / (B, 1) -> (B, d)
    x = mean.float()[:, None, :]  # (B, d) -> (B, 1, d), one "token": the mean
    return x, torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)  # (B, 1)
