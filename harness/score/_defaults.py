"""`ctd score`'s defaults, spelled once (the command's options read them; nothing heavy here)."""

from __future__ import annotations

__all__ = ["DEFAULT_MICRO_BATCH", "DEFAULT_SHARD_ROWS"]

DEFAULT_SHARD_ROWS = 1000  # rows per shard file: on a CPU a shard is a minute or two of work
DEFAULT_MICRO_BATCH = 32  # conversations per forward-pass group, as the monitor's max_batch
