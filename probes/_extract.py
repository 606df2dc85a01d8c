"""Activation extraction: chat template, truncation, length-bucketed batches, a forward pass that
stops after the chosen layer, and streaming of the real tokens' vectors into the store.

Hook point: layer L is `hidden_states[L]` of a transformers forward pass with
`output_hidden_states=True`, i.e. the output of decoder block L (1-based). A forward hook on that
block captures its output and raises, so the blocks above it (and the LM head) never run. For
L = number of layers the hook sits on the final norm, which transformers applies to the last entry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ._dist import process_state
from ._errors import ProbeError
from ._model import LoadedModel, decoder_layers
from ._store import ActivationStore, Plan, StoreKey

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

Conversation = str | list[dict[str, str]]  # a plain string is one user turn


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


def render(tokenizer, conversation: Conversation) -> str:
    """The conversation as the monitored model sees it: its chat template, no generation prompt;
    a tokenizer without a template gets "role: content" lines."""
    messages = [{"role": "user", "content": conversation}] if isinstance(conversation, str) else conversation
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def tokenize(
    tokenizer, conversations: Sequence[Conversation], max_tokens: int
) -> tuple[list[list[int]], int]:
    """Token ids of each rendered conversation, cut to its first `max_tokens`; and how many were cut.
    The template already holds the special tokens, so none are added."""
    ids: list[list[int]] = []
    truncated = 0
    for number, conversation in enumerate(conversations):
        try:
            text = render(tokenizer, conversation)
        except Exception as error:  # jinja's TemplateError, e.g. a template without a system role
            raise ProbeError(f"example {number}: the model's chat template rejects it ({error})") from None
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
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
        base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    except _Stop:
        pass
    finally:
        handle.remove()
    return captured[0]


def pad_batch(ids: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, T) input ids and attention mask of token lists, T the longest of them."""
    width = max(len(t) for t in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, tokens in enumerate(ids):
        input_ids[row, : len(tokens)] = torch.tensor(tokens)
        attention_mask[row, : len(tokens)] = 1
    return input_ids.to(device), attention_mask.to(device)


_pad = pad_batch  # its former private name, which tests/test_probes_extract.py imports


def extract(
    loaded: LoadedModel,
    conversations: Sequence[Conversation],
    *,
    layer: int,
    max_tokens: int,
    data_hash: str,
    store_root,
    batch_tokens: int = 8192,
    max_batch: int = 64,
    chunk_tokens: int = 32768,
    on_batch: Callable[[int, int], None] | None = None,
) -> tuple[ActivationStore, ExtractStats]:
    """Extract `layer` activations of every conversation into the store keyed by the model, layer,
    template, token limit, dtype and `data_hash`; a complete store is reused as is, an incomplete
    one resumes. Under `accelerate launch` each process extracts every world-th batch into its own
    shard and the main process joins them. `on_batch(done_tokens, total_tokens)` reports progress."""
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
        extracted = _extract_into(store, state, loaded, ids, lengths, batches, layer, chunk_tokens, on_batch)
    return store, stats(extracted)


def _extract_into(
    store: ActivationStore,
    state,
    loaded: LoadedModel,
    ids: list[list[int]],
    lengths: np.ndarray,
    batches: tuple[tuple[int, ...], ...],
    layer: int,
    chunk_tokens: int,
    on_batch: Callable[[int, int], None] | None,
) -> int:
    """Run this process's unfinished batches into its shard, then join; returns batches run."""
    if state.is_main_process:
        store.start(Plan(lengths, batches, loaded.hidden_size))
    state.wait_for_everyone()
    writer = store.shard_writer(state.process_index, state.num_processes)
    total = int(sum(lengths[list(batches[b])].sum() for b in writer.batches))
    done_tokens = total - int(sum(lengths[list(batches[b])].sum() for b in writer.todo))
    pending_tokens = extracted = 0
    for b in writer.todo:
        batch_ids = [ids[i] for i in batches[b]]
        input_ids, attention_mask = pad_batch(batch_ids, loaded.tokenizer.pad_token_id, loaded.device)
        hidden = layer_activations(loaded, layer, input_ids, attention_mask)  # (B, T, d)
        real = attention_mask.to(hidden.device).bool()  # device_map="auto": the layer may sit elsewhere
        rows = hidden[real]  # (real tokens, d), example by example, in batch order
        writer.write(b, rows.to(torch.float16).cpu().numpy())
        extracted += 1
        n = len(rows)
        done_tokens, pending_tokens = done_tokens + n, pending_tokens + n
        if pending_tokens >= chunk_tokens:
            writer.commit()
            pending_tokens = 0
        if on_batch is not None:
            on_batch(done_tokens, total)
    writer.commit()
    state.wait_for_everyone()
    if state.is_main_process:
        store.join(state.num_processes)
    state.wait_for_everyone()
    return extracted
