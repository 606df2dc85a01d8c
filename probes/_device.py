"""Where probes train and score: the one default device, and how much of it resident data may take.

The rule: `train_probe` trains on `device` (default `default_device()`) and returns the probe there;
`predict` runs wherever the probe's parameters are. A probe loaded from disk is on the CPU until the
caller moves it.
"""

from __future__ import annotations

import torch

from ._dist import process_state

__all__ = ["default_device", "device_answers", "release_device_memory", "resident_budget"]

# A split's tokens are kept on a GPU when they take at most this fraction of the memory it has
# free. The rest is left for the batches (an attention batch of 32 x 4,096 tokens of width 4,096 is
# 2 GiB as float32, and its standardised copy and gradients as much again), for the monitored model
# the probe stage keeps loaded, and for other processes sharing the GPU.
RESIDENT_FRACTION = 0.5


def default_device() -> torch.device:
    """The process's GPU when CUDA is available (under `accelerate launch`, cuda:local_rank), else
    the CPU. Never MPS: its float64 support, which the feature statistics need, is partial."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device(process_state().device)
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def device_answers(devices: set[torch.device]) -> bool:
    """Whether every CUDA device of `devices` still runs work, after a failed pass: a synchronize
    and a one-element sum on each. An illegal memory access or a device-side assert leaves the
    process's CUDA context unusable (every later call fails with the same error, and only a new
    process clears it); a recoverable error (an allocation outside the caching allocator, a bad
    launch configuration) does not, and out of memory never does. True on the CPU."""
    for device in devices:
        if device.type != "cuda":
            continue
        try:
            torch.cuda.synchronize(device)
            if torch.ones(1, device=device).sum().item() != 1.0:
                return False
        except torch.cuda.OutOfMemoryError:  # full, but the context works
            continue
        except Exception:
            return False
    return True


def resident_budget(device: torch.device) -> int:
    """Bytes of token activations that may be kept on `device` for a whole training run. 0 on the
    CPU: there the memory-mapped store already is the resident copy, and batches are cut from it."""
    if device.type != "cuda":
        return 0
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)  # ours to reuse
    return int(RESIDENT_FRACTION * (free + cached))


def release_device_memory() -> None:
    """Give back to the driver the GPU memory this process's probe work cached: the resident splits
    and torch's caching allocator's free blocks. A run calls it before it starts a local vLLM
    server, which refuses to start when less than its `--gpu-memory-utilization` share is free."""
    import gc

    from ._batches import _RESIDENT

    _RESIDENT.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
