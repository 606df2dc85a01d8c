"""`ctd score`'s defaults, spelled once (the command's options read them; nothing heavy here)."""

from __future__ import annotations

__all__ = ["DEFAULT_ACTOR_THREADS", "DEFAULT_MICRO_BATCH", "DEFAULT_RAY_RETRIES", "DEFAULT_SHARD_ROWS"]

DEFAULT_SHARD_ROWS = 1000  # rows per shard file: on a CPU a shard is a minute or two of work
DEFAULT_MICRO_BATCH = 32  # conversations per forward-pass group, as the monitor's max_batch
DEFAULT_ACTOR_THREADS = 4  # `--ray` on CPUs: torch threads per actor, so actors = CPUs // 4 (at least 1)
# `--ray`: an actor that dies (out of memory, killed) is restarted, and its shard retried, this many
# times; a shard that kills every actor it meets then fails the job instead of looping for ever.
DEFAULT_RAY_RETRIES = 3
