"""`ctd score --ray`: the plan's pending shards scored by a pool of Ray actors, on this machine
(`ray.init()`) or on a Ray cluster (`--ray auto` or an address), with Ray Data's streaming
execution, actor restarts and task retries.

The job is `from_items(pending shard tasks) -> map_batches(ShardActor, batch_size=1, actor
pool)`: each actor holds one `ShardScorer` (the bundle, the model and the probes loaded once) and
turns a shard task into its `ShardDone`; the driver iterates those for the progress and the
summary. The actors write the shard files themselves, not Ray's `write_parquet`: a shard file is
named by the plan's index and written atomically by `ShardScorer`, so a resume skips exactly the
written shards and a retried task (its actor died) finds its file there and writes nothing.

`from_items` has no read tasks, so actors that take every CPU of the machine cannot starve the
job (a `ray.data.range` read beside a pool that held both CPUs of this machine deadlocked).

Ray is optional and imported only here, inside `score_ray`: `ctd score` without `--ray` and
`ctd --help` never load it."""

from __future__ import annotations

import logging
import queue
import re
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from .._errors import InputError, RunFailed
from ._defaults import DEFAULT_ACTOR_THREADS, DEFAULT_RAY_RETRIES
from ._local import PROGRESS_WHAT, Progress, ScoreSummary, summarize
from ._plan import ScorePlan, ShardTask
from ._shard import ScoreOptions, ShardDone, ShardScorer
from ._stop import RayStop

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "LOCAL_RAY",
    "RAY_EXTRA",
    "ActorShape",
    "RayOptions",
    "actor_shape",
    "check_ray_installed",
    "run_shards_on_ray",
    "score_ray",
]

LOCAL_RAY = "local"  # --ray local: start Ray on this machine
CONNECT_SECONDS = 5.0  # how long a cluster's address has to accept a connection
RAY_EXTRA = "pip install 'ctd-harness[ray]'"
STOP_MARGIN = 5.0  # seconds past the drain's grace: the actors' look at the board, their commits
HANDOVER_WAIT = 0.5  # seconds per wait for the next row (a stop signal is seen within it at most)


@dataclass(frozen=True, kw_only=True)
class RayOptions:
    """Where and how wide the Ray job runs."""

    address: str = LOCAL_RAY  # "local": Ray on this machine; "auto" or HOST:PORT: join that cluster
    actors: int | None = None  # None: one per GPU, else CPUs // DEFAULT_ACTOR_THREADS (at least 1)
    retries: int = DEFAULT_RAY_RETRIES  # restarts of a dead actor, and retries of its shard

    def __post_init__(self) -> None:
        if self.actors is not None and self.actors < 1:
            raise InputError(f"--actors {self.actors}: must be at least 1")
        if not self.address or self.address.startswith("-"):
            raise InputError(f"--ray {self.address!r}: expected an address: 'local', 'auto' or HOST:PORT")


@dataclass(frozen=True)
class ActorShape:
    """The actor pool: how many actors, what each one asks Ray for, its torch threads."""

    actors: int
    num_cpus: float
    num_gpus: float
    threads: int


def actor_shape(*, cpus: float, gpus: float, actors: int | None, threads: int | None) -> ActorShape:
    """The pool for a cluster of `cpus` CPUs and `gpus` GPUs. With GPUs: one actor per GPU (at most
    as many as GPUs: more would wait for ever). Without: each actor takes an equal share of the
    CPUs, a whole number of them where it can (an actor must fit on one node), and runs that many
    torch threads, so two actors on two cores do not fight over them."""
    whole_gpus = int(gpus)
    if whole_gpus >= 1:
        count = actors or whole_gpus
        if count > whole_gpus:
            raise InputError(
                f"--actors {count}: the Ray cluster has {whole_gpus} GPUs; at most one actor per GPU"
            )
        return ActorShape(count, num_cpus=1.0, num_gpus=1.0, threads=threads or 1)
    if cpus < 1:
        raise InputError("--ray: the Ray cluster has no CPUs and no GPUs to score on")
    count = actors or max(1, int(cpus // (threads or DEFAULT_ACTOR_THREADS)))
    share = max(1, int(cpus // count))
    return ActorShape(count, num_cpus=min(float(share), cpus / count), num_gpus=0.0, threads=threads or share)


class ShardActor:
    """A Ray Data actor: one `ShardScorer` for its life; each batch (one row: one shard task) is
    scored and written, and its `ShardDone` returned as a row. `options` is set on a subclass
    made per job (`_actor_class`)."""

    options: ClassVar[ScoreOptions]
    stop: ClassVar[RayStop]

    def __init__(self) -> None:
        self._scorer = ShardScorer(self.options, stop=self.stop)

    def __call__(self, batch: pa.Table) -> dict[str, list[Any]]:
        done = [self._scorer(ShardTask.from_row(row)) for row in batch.to_pylist()]
        return {f.name: [getattr(d, f.name) for d in done] for f in fields(ShardDone)}


def _actor_class(options: ScoreOptions, stop: RayStop) -> type[ShardActor]:
    return type("ShardActor", (ShardActor,), {"options": options, "stop": stop})


def score_ray(
    plan: ScorePlan,
    options: ScoreOptions,
    ray_options: RayOptions,
    *,
    progress: Progress | None = None,
    on_start: Callable[[str], None] | None = None,
) -> ScoreSummary:
    """`score_local`'s job on Ray: the plan's pending shards, shards done/total with rows/s as
    they come back (rows/s counted from when the pool was asked for), the job's totals."""
    started = time.perf_counter()
    total = len(plan.shards)
    finished = total - len(plan.pending())
    report = progress or (lambda *_: None)
    report(PROGRESS_WHAT, finished, total, "", "shards")
    begun = started

    def ready(line: str) -> None:
        nonlocal begun
        begun = time.perf_counter()
        (on_start or (lambda _: None))(line)

    done: list[ShardDone] = []
    rows = 0
    # Closed here, not when the generator is collected: a second Ctrl-C during its wait for the
    # actors would otherwise be an "Exception ignored" traceback.
    with plan.held(), closing(run_shards_on_ray(plan, options, ray_options, on_start=ready)) as results:
        for result in results:
            done.append(result)
            rows += result.model_rows if result.written else 0
            finished += 1
            rate = rows / max(time.perf_counter() - begun, 1e-9)
            report(PROGRESS_WHAT, finished, total, f"{rate:.1f} rows/s", "shards")
    return summarize(plan, done, time.perf_counter() - started)


def run_shards_on_ray(
    plan: ScorePlan, options: ScoreOptions, ray_options: RayOptions, *, on_start: Callable[[str], None]
) -> Iterator[ShardDone]:
    """The plan's pending shards scored on Ray, each `ShardDone` as it comes back (in any order).
    `on_start` is told, once Ray is up, what the pool is and where Ray's logs are. Ray is shut
    down (this machine's) or left (a cluster) when the iteration ends, also on Ctrl-C."""
    pending = plan.pending()
    if not pending:
        return
    ray, data = _import_ray()
    _connect(ray, ray_options.address)
    stop, finished, board = RayStop(), False, None
    try:
        board = stop.open()  # held until Ray is shut down: the board lives as long as a handle
        resources = ray.cluster_resources()
        shape = actor_shape(
            cpus=float(resources.get("CPU", 0)),
            gpus=float(resources.get("GPU", 0)),
            actors=ray_options.actors,
            threads=options.threads,
        )
        on_start(_describe(shape, ray_options.address, _logs_dir(ray)))
        actor = _actor_class(replace(options, threads=shape.threads), stop)
        rows = [task.to_row() for task in pending]
        # One block per shard: a task per shard, spread over the actors and retried on its own.
        tasks = data.from_items(rows, override_num_blocks=len(rows))
        with warnings.catch_warnings():
            # max_restarts/max_task_retries have no named parameter yet (Ray 2.60 warns).
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", message=".*ray_remote_args.*")
            scored = tasks.map_batches(
                actor,
                batch_size=1,
                batch_format="pyarrow",
                compute=data.ActorPoolStrategy(size=shape.actors),
                num_cpus=shape.num_cpus,
                num_gpus=shape.num_gpus or None,
                max_restarts=ray_options.retries,
                max_task_retries=ray_options.retries,
            )
        try:
            for row in _rows_beside(scored):
                yield ShardDone(**{f.name: row[f.name] for f in fields(ShardDone)})
            finished = True
        except Exception as error:  # Ray's, wrapping the actor's (its traceback is in Ray's logs)
            what = _actor_error(error)
            name, _, message = what.partition(": ")
            # A shard's own one line (its file changed since the plan, a --model that cannot
            # load): exit 2, as without Ray.
            if name.rsplit(".", 1)[-1] in (InputError.__name__, "ProbeError", "ConfigError"):
                raise InputError(message) from None
            raise RunFailed(f"the Ray job failed: {what}; Ray's logs: {_logs_dir(ray)}") from None
    finally:
        try:
            if not finished and board is not None:  # a stop or a failure: actors may be asking
                _let_actors_commit(ray, board)
        finally:
            ray.shutdown()


def _rows_beside(scored: Any) -> Iterator[dict[str, Any]]:
    """The rows of the Ray dataset `scored`, read by a thread of their own and handed over here.
    A stop signal lands in the main thread: here, in this wait, and never inside Ray Data's
    iterator, whose clean-up on an interruption `ray.kill`s the actors at once with their
    answers in flight, before the stop board could tell them to commit. What the iteration
    raises is raised here."""
    handed: queue.Queue[tuple[str, Any]] = queue.Queue()

    def read() -> None:
        try:
            for row in scored.iter_rows():
                handed.put(("row", row))
        except BaseException as error:  # Ray's, or the end of Ray under it once stopped
            handed.put(("error", error))
        else:
            handed.put(("end", None))

    threading.Thread(target=read, name="ctd-ray-rows", daemon=True).start()
    while True:
        try:
            kind, value = handed.get(timeout=HANDOVER_WAIT)
        except queue.Empty:
            continue
        if kind == "end":
            return
        if kind == "error":
            raise value
        yield value


def _let_actors_commit(ray: Any, board: Any) -> None:
    """Tell the actors to stop asking the expert, and give the answers they have in flight the
    time a local job's drain gives them (and the actors the time to look at the board) before Ray
    is shut down, which kills them. A second Ctrl-C cuts the wait short."""
    from experts import DRAIN_GRACE

    try:
        RayStop.stop_and_wait(board, DRAIN_GRACE + STOP_MARGIN)
    except ray.exceptions.RayError:  # the board is gone with Ray: nothing to tell
        return


def _import_ray() -> tuple[Any, Any]:
    """ray and ray.data, or one InputError line naming the extra to install."""
    try:
        import ray
        import ray.data
    except ImportError as error:
        raise InputError(f"--ray: Ray is not installed here ({error}); {RAY_EXTRA}") from None
    return ray, ray.data


def check_ray_installed() -> None:
    """One InputError line when Ray is missing, before anything is planned or written."""
    _import_ray()


def check_ray_address(address: str) -> None:
    """One InputError line when nothing listens at a cluster named HOST:PORT (or ray://HOST:PORT),
    before anything is planned or written: `ray.init` retries such an address for minutes."""
    if address in (LOCAL_RAY, "auto"):
        return
    target = urlsplit(address if "://" in address else f"//{address}")
    try:
        host, port = target.hostname, target.port
    except ValueError:  # a port that is not a number: Ray's own error names it
        return
    if not host or port is None:
        return
    try:
        socket.create_connection((host, port), timeout=CONNECT_SECONDS).close()
    except OSError as error:
        raise InputError(
            f"--ray {address}: no Ray cluster answered there ({error.strerror or error}); start one "
            "with `ray start --head`, or use --ray local"
        ) from None


def _connect(ray: Any, address: str) -> None:
    """Start Ray on this machine or join a cluster, with the terminal kept for our progress:
    Ray's console messages at ERROR only and Ray Data's off (they stay in Ray's log files), the
    workers' output not forwarded, Ray Data's own progress bars off."""
    try:
        if address == LOCAL_RAY:
            ray.init(
                address="local", include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR
            )
        else:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    except ConnectionError as error:
        raise InputError(
            f"--ray {address}: no Ray cluster answered there ({_first_line(error)}); start one with "
            "`ray start --head`, or use --ray local"
        ) from None
    from ray.data import DataContext

    context = DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    for handler in logging.getLogger("ray.data").handlers:  # its console handler; its file keeps all
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.setLevel(logging.CRITICAL)  # a failed job is our one line, naming the log folder


def _logs_dir(ray: Any) -> str:
    """This session's log folder on the driver's node (Ray's own files: raylet.out, worker logs)."""
    try:
        return str(ray._private.worker.global_worker.node.get_logs_dir_path())
    except AttributeError:  # a driver that joined a cluster from a machine that runs no node
        return "/tmp/ray/session_latest/logs (on the head node)"


def _describe(shape: ActorShape, address: str, logs: str) -> str:
    where = "Ray on this machine" if address == LOCAL_RAY else f"the Ray cluster at {address}"
    each = f"1 GPU, {shape.num_cpus:g} CPU" if shape.num_gpus else f"{shape.num_cpus:g} CPU"
    threads = f"{shape.threads} torch thread{'s' if shape.threads > 1 else ''}"
    actors = f"{shape.actors} actor{'s' if shape.actors > 1 else ''}"
    return f"{where}: {actors} ({each} each, {threads}); Ray's logs: {logs}"


_RAISED = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
_RAY_WRAPPERS = {"RayTaskError", "UserCodeException", "RayDataUserCodeException"}


def _actor_error(error: BaseException) -> str:
    """The actor's exception as "Name: message", read from the worker's traceback that Ray puts
    in the error's text (Ray Data wraps it in a UserCodeException whose cause does not cross the
    process boundary, and adds hints after it); the error's own first line when there is none."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # Ray colours its task names
    for line in reversed(text.splitlines()):
        found = _RAISED.match(line)
        if found and found.group(1).rsplit(".", 1)[-1] not in _RAY_WRAPPERS:
            return f"{found.group(1)}: {found.group(2).strip()}"
    return f"{type(error).__name__}: {_first_line(error)}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
