"""Activation extraction: chat template, truncation, length-bucketed batches, a forward pass that
stops after the chosen layer, and streaming of the real tokens' vectors into the store.

Hook point: layer L is `hidden_states[L]` of a transformers forward pass with
`output_hidden_states=True`, i.e. the output of decoder block L (1-based). A forward hook on that
block captures its output and raises, so the blocks above it (and the LM head) never run. For
L = number of layers the hook sits on the final norm, which transformers applies to the last entry.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ._config import BATCH_TOKENS
from ._dist import process_state
from ._errors import ProbeError, RejectedExample
from ._model import LoadedModel, decoder_layers
from ._store import ActivationStore, Plan, StoreKey
from ._stream import CommitCadence, ShardStream

__all__ = [
    "Conversation",
    "ExtractStats",
    "bucket_batches",
    "extract",
    "layer_activations",
    "pad_batch",
    "render",
    "tokenize",
]

Conversation = str | Sequence[Mapping[str, str]]
"""An input: a plain string (one user turn) or a list of {"role": ..., "content": ...} messages. The
same type as `experts.Conversation` (the libraries import nothing of each other; a test keeps the
two the same). Read, never changed."""

TOKENIZE_CHUNK = 1024  # texts per tokenizer call: a fast tokenizer encodes a batch in Rust threads
# Attention kernels a forward pass may use: all of torch's but cuDNN's, which builds an execution
# plan for each new input shape (on an H200 with a Llama-3.2-1B-shaped model, 2026-11-26: a pass
# over one conversation of a shape not seen before took 70 ms against 12 ms without cuDNN, and
# one of 32 conversations 173 ms against 64 ms), and nearly every batch here is a new shape. Where
# a shape repeats it was 8% faster (59 ms against 64 ms). The CPU never used it: no change there.
ATTENTION_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass(frozen=True)
class ExtractStats:
    examples: int
    tokens: int  # real tokens stored
    truncated: int  # examples cut to max_tokens
    batches: int
    padded_tokens: int  # tokens processed including padding, over all batches of the plan
    extracted_batches: int  # batches run by this call (0 when the store was complete)
    seconds: float
    store: str

    @property
    def padding_fraction(self) -> float:
        return 1 - self.tokens / self.padded_tokens if self.padded_tokens else 0.0


def _messages(conversation: Conversation) -> Sequence[Mapping[str, str]]:
    return [{"role": "user", "content": conversation}] if isinstance(conversation, str) else conversation


def render(tokenizer, conversation: Conversation) -> str:
    """The conversation as the monitored model sees it: its chat template, no generation prompt;
    a tokenizer without a template gets "role: content" lines."""
    messages = _messages(conversation)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def _render_all(tokenizer, conversations: Sequence[Conversation]) -> list[str]:
    """`render` of each conversation; with a template, one call for them all (the template is
    compiled once), and on a failure one call each to name the example the template rejects."""
    if getattr(tokenizer, "chat_template", None) and conversations:
        try:
            return list(
                tokenizer.apply_chat_template(
                    [_messages(c) for c in conversations], tokenize=False, add_generation_prompt=False
                )
            )
        except Exception:
            pass  # found again below, example by example
    texts = []
    for number, text in enumerate(render_each(tokenizer, conversations)):
        if isinstance(text, ProbeError):
            raise RejectedExample(number, str(text))
        texts.append(text)
    return texts


def render_each(tokenizer, conversations: Sequence[Conversation]) -> list[str | ProbeError]:
    """`render` of each conversation, or the ProbeError of one the chat template rejects."""
    texts: list[str | ProbeError] = []
    for conversation in conversations:
        try:
            texts.append(render(tokenizer, conversation))
        except Exception as error:  # jinja's TemplateError, e.g. a template without a system role
            texts.append(ProbeError(f"the model's chat template rejects it ({error})"))
    return texts


def tokenize(
    tokenizer, conversations: Sequence[Conversation], max_tokens: int
) -> tuple[list[list[int]], int]:
    """Token ids of each rendered conversation, cut to its first `max_tokens`; and how many were cut.
    The template already holds the special tokens, so none are added."""
    return encode(tokenizer, _render_all(tokenizer, conversations), max_tokens)


def encode(tokenizer, texts: Sequence[str], max_tokens: int) -> tuple[list[list[int]], int]:
    """`tokenize`'s second half: token ids of rendered conversations, cut to their first
    `max_tokens`; and how many were cut."""
    ids: list[list[int]] = []
    truncated = 0
    for start in range(0, len(texts), TOKENIZE_CHUNK):
        chunk = texts[start : start + TOKENIZE_CHUNK]
        encoded = tokenizer(chunk, add_special_tokens=False, return_attention_mask=False)["input_ids"]
        for tokens in encoded:
            if len(tokens) > max_tokens:
                tokens, truncated = tokens[:max_tokens], truncated + 1
            if not tokens:
                tokens = [tokenizer.pad_token_id]  # an empty text without a template: keep one token
            ids.append(tokens)
    return ids, truncated


def bucket_batches(
    lengths: np.ndarray, batch_tokens: int, max_batch: int, max_padding: float = 0.1
) -> tuple[tuple[int, ...], ...]:
    """Batches of example indices, longest first, each at most `batch_tokens` padded tokens and
    `max_batch` examples. Neighbours in length order share a batch, and a batch closes before an
    example shorter than (1 - max_padding) of its width, so padding stays under `max_padding`."""
    order = np.argsort(-lengths, kind="stable")
    batches: list[tuple[int, ...]] = []
    current: list[int] = []
    width = 0
    for i in order:
        width = width or int(lengths[i])  # the first (longest) example sets the batch width
        full = len(current) + 1 > max_batch or (len(current) + 1) * width > batch_tokens
        if current and (full or lengths[i] < (1 - max_padding) * width):
            batches.append(tuple(current))
            current, width = [], int(lengths[i])
        current.append(int(i))
    if current:
        batches.append(tuple(current))
    return tuple(batches)


class _Stop(Exception):
    """Raised by the hook to end the forward pass once the layer's output is captured."""


def _hook_module(loaded: LoadedModel, layer: int) -> nn.Module:
    if layer == loaded.n_layers:
        base = getattr(loaded.model, loaded.model.base_model_prefix, loaded.model)
        norm = getattr(base, "norm", None)
        if norm is None:
            raise ProbeError(
                f"--layer {layer}: this architecture's final norm is not found; use 1..{layer - 1}"
            )
        return norm
    return decoder_layers(loaded.model)[layer - 1]


@torch.no_grad()
def layer_activations(
    loaded: LoadedModel, layer: int, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """(B, T, d) activations at `layer` for a right-padded batch, blocks above `layer` skipped."""
    captured: list[torch.Tensor] = []

    def hook(module: nn.Module, args: tuple, output: torch.Tensor | tuple) -> None:
        captured.append(output[0] if isinstance(output, tuple) else output)
        raise _Stop

    handle = _hook_module(loaded, layer).register_forward_hook(hook)
    base = getattr(loaded.model, loaded.model.base_model_prefix, loaded.model)
    try:
        with sdpa_kernel(ATTENTION_KERNELS):
            base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    except _Stop:
        pass
    finally:
        handle.remove()
    return captured[0]


def _padded(ids: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded (B, T) int64 ids and bool mask, T the longest of `ids`; no loop over rows."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    mask = np.arange(int(lengths.max())) < lengths[:, None]  # (B, T)
    input_ids = np.full(mask.shape, pad_id, dtype=np.int64)
    flat = itertools.chain.from_iterable(ids)
    input_ids[mask] = np.fromiter(flat, dtype=np.int64, count=int(lengths.sum()))  # row-major: row by row
    return input_ids, mask


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """On CUDA from pinned memory without blocking: the copy queues ahead of the forward pass."""
    tensor = torch.from_numpy(array)
    if torch.device(device).type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def pad_batch(ids: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, T) input ids and attention mask of token lists, T the longest of them."""
    input_ids, mask = _padded(ids, pad_id)
    return _to_device(input_ids, device), _to_device(mask.astype(np.int64), device)


_pad = pad_batch  # its former private name, which tests/test_probes_extract.py imports


def extract(
    loaded: LoadedModel,
    conversations: Sequence[Conversation],
    *,
    layer: int,
    max_tokens: int,
    data_hash: str,
    store_root,
    batch_tokens: int = BATCH_TOKENS,
    max_batch: int = 64,
    commit: CommitCadence | None = None,
    on_batch: Callable[[int, int], None] | None = None,
) -> tuple[ActivationStore, ExtractStats]:
    """Extract `layer` activations of every conversation into the store keyed by the model, layer,
    template, token limit, dtype and `data_hash`; a complete store is reused as is, an incomplete
    one resumes. Under `accelerate launch` each process extracts every world-th batch into its own
    shard and the main process joins them. `on_batch(done_tokens, total_tokens)` reports progress
    (tokens through the forward pass; all of them are in the store when this returns); `commit`
    (default `CommitCadence()`) bounds what a killed run redoes."""
    started = time.perf_counter()
    if not conversations:
        raise ProbeError("no examples to extract")
    state = process_state()
    key = StoreKey(
        model=loaded.identity,
        layer=layer,
        template=loaded.template_hash,
        max_tokens=max_tokens,
        dtype=str(loaded.dtype).removeprefix("torch."),
        data=data_hash,
    )
    store = ActivationStore.open(store_root, key)
    ids, truncated = tokenize(loaded.tokenizer, conversations, max_tokens)
    lengths = np.array([len(t) for t in ids], dtype=np.int64)
    batches = bucket_batches(lengths, batch_tokens, max_batch)
    padded = sum(len(b) * int(lengths[list(b)].max()) for b in batches)

    def stats(extracted: int) -> ExtractStats:
        return ExtractStats(
            examples=len(ids),
            tokens=int(lengths.sum()),
            truncated=truncated,
            batches=len(batches),
            padded_tokens=padded,
            extracted_batches=extracted,
            seconds=time.perf_counter() - started,
            store=str(store.folder),
        )

    # One run at a time extracts into a store; a second waits, then finds it complete. Under
    # `accelerate launch` only the main process takes the lock; the others follow it.
    with store.lock() if state.is_main_process else nullcontext():
        state.wait_for_everyone()
        if store.is_complete:
            return store, stats(0)
        cadence = commit or CommitCadence()
        extracted = _extract_into(store, state, loaded, ids, lengths, batches, layer, cadence, on_batch)
    return store, stats(extracted)


def _extract_into(
    store: ActivationStore,
    state,
    loaded: LoadedModel,
    ids: list[list[int]],
    lengths: np.ndarray,
    batches: tuple[tuple[int, ...], ...],
    layer: int,
    commit: CommitCadence,
    on_batch: Callable[[int, int], None] | None,
) -> int:
    """Run this process's unfinished batches into its shard, then join; returns batches run.
    The writes overlap the next batch's forward pass (`ShardStream`)."""
    if state.is_main_process:
        store.start(Plan(lengths, batches, loaded.hidden_size))
    state.wait_for_everyone()
    writer = store.shard_writer(state.process_index, state.num_processes)
    total = int(sum(lengths[list(batches[b])].sum() for b in writer.batches))
    done_tokens = total - int(sum(lengths[list(batches[b])].sum() for b in writer.todo))
    extracted = 0
    with ShardStream(writer, layer, commit) as stream:
        for b in writer.todo:
            input_ids, mask = _padded([ids[i] for i in batches[b]], loaded.tokenizer.pad_token_id)
            hidden = layer_activations(
                loaded,
                layer,
                _to_device(input_ids, loaded.device),
                _to_device(mask.astype(np.int64), loaded.device),
            )  # (B, T, d)
            # Real tokens as flat (row * T + column) positions, example by example in batch order;
            # built on the host, so the device never syncs to count them (as a bool mask would).
            stream.put(b, hidden, np.flatnonzero(mask))
            extracted += 1
            done_tokens += int(mask.sum())
            if on_batch is not None:
                on_batch(done_tokens, total)
    state.wait_for_everyone()
    if state.is_main_process:
        store.join(state.num_processes)
    state.wait_for_everyone()
    return extracted
