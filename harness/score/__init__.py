"""Bulk scoring (`ctd score`): the monitor's scorer run as a batch job over files of
conversations, one Parquet shard per slice of rows, resumable. `plan_score` cuts the job and
writes its manifest, `ShardScorer` scores one shard (what a worker or a Ray actor holds), and
`score_local` runs the plan in this process, `score_ray` on a pool of Ray actors (Ray is
imported by it alone: an optional extra).

Imported on first use (PEP 562): `ctd --help` must not load torch or pyarrow."""

from __future__ import annotations

from .._lazy import lazy_exports

# Every public name and the module that defines it.
_EXPORTS: dict[str, str] = {
    "DEFAULT_ACTOR_THREADS": "._defaults",
    "DEFAULT_MICRO_BATCH": "._defaults",
    "DEFAULT_RAY_RETRIES": "._defaults",
    "DEFAULT_SHARD_ROWS": "._defaults",
    "OUTPUT_COLUMNS": "._shard",
    "ScoreLayout": "._layout",
    "LOCAL_RAY": "._ray",
    "RayOptions": "._ray",
    "ScoreOptions": "._shard",
    "ScorePlan": "._plan",
    "ScoreSummary": "._local",
    "ShardDone": "._shard",
    "ShardScorer": "._shard",
    "ShardTask": "._plan",
    "actor_shape": "._ray",
    "check_ray_address": "._ray",
    "check_ray_installed": "._ray",
    "output_schema": "._shard",
    "plan_score": "._plan",
    "score_local": "._local",
    "score_ray": "._ray",
    "shard_record": "._plan",
    "summarize": "._local",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
