"""The process group: accelerate's PartialState, on CPU as well as on GPUs."""

from __future__ import annotations

import functools

import torch
from accelerate import PartialState

__all__ = ["process_state"]


@functools.cache
def process_state() -> PartialState:
    """This process's rank, the number of processes and its device. Alone: one process. Under
    `accelerate launch` or `torchrun`: one per GPU, or (on a machine without CUDA) several CPU
    processes joined by gloo, which accelerate only forms when asked with cpu=True."""
    return PartialState(cpu=not torch.cuda.is_available())
