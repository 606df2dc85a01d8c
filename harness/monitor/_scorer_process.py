"""What runs in the monitor's scorer process (`harness.monitor._engine.ProcessScorer` starts it):
load the model and the probes, warm up, then tokenise the batches that arrive down the pipe and
run their forward passes one batch behind, answering each with its outcomes or its failure.

Kept apart from `_engine`, which the server's process runs: nothing here runs there."""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing
import os
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._engine import DEVICE_LOST, forward_stage, tokenize_stage, warm_up

if TYPE_CHECKING:
    from ._scorer import ProbeScorer

__all__ = ["ScorerLoad", "serve_scorer"]

log = logging.getLogger("ctd.monitor")
# After a SIGTERM a scorer process waits this long for the monitor's word by the pipe: longer than
# the server's graceful stop (up to 15 s), so that the checks in flight are still scored.
TERM_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class ScorerLoad:
    """What the scorer process loads (picklable: it crosses to the spawned process)."""

    safety: Path
    dv: Path
    model: str | None
    batch_tokens: int
    max_batch: int


def serve_scorer(connection: Connection, load: ScorerLoad) -> None:
    """The scorer process: load and warm up, say ready (or the error that stopped it), then score
    batches until told to stop or the monitor's end of the pipe closes. Tokenising happens in this
    thread as batches arrive; the forward passes in another, one batch behind."""
    _exit_with_parent()
    # Ctrl-C and a service manager's SIGTERM reach the whole process group: the monitor stops this
    # process itself, after the checks in flight, by the pipe. A SIGTERM that is the only word
    # ends it after a grace period.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_later)

    from ._scorer import ProbeScorer  # torch: seconds, with the signals above already set

    try:
        scorer = ProbeScorer.load(load.safety, load.dv, model=load.model, batch_tokens=load.batch_tokens)
        warm_up(scorer, load.max_batch)
    except Exception as error:
        connection.send(("error", _picklable(error)))
        return
    # The model and torch live as long as this process: out of the collector's full scans, which
    # hold the GIL for a fifth of a second over them (`ctd monitor serve` does the same).
    gc.collect()
    gc.freeze()
    connection.send(("ready", scorer.pass_cost))
    sending = threading.Lock()  # both threads answer down the one pipe

    def send(reply: tuple[int, str, Any]) -> None:
        with sending:
            connection.send(reply)

    tokenised: queue.Queue[tuple[int, tuple[list[Any], float]] | None] = queue.Queue(maxsize=2)
    forward = threading.Thread(target=_forward_loop, args=(scorer, tokenised, send), name="ctd-forward")
    forward.start()
    try:
        while True:
            try:
                message = connection.recv()
            except (EOFError, OSError):  # the monitor is gone
                break
            if message is None:
                break
            number, conversations = message
            try:
                tokenised.put((number, tokenize_stage(scorer, conversations)))
            except Exception as error:
                log.exception("the scorer process failed to tokenise a batch")
                send((number, "failed", f"{type(error).__name__}: {error}"))
    finally:
        tokenised.put(None)
        forward.join()


def _exit_with_parent() -> None:
    """Exit the moment the monitor's process is gone, however it went: a SIGKILLed server must not
    leave a process holding the GPU's memory, even one still loading the model."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(1)

    threading.Thread(target=watch, name="ctd-parent-watch", daemon=True).start()


def _exit_later(signum: int, frame: Any) -> None:
    timer = threading.Timer(TERM_GRACE_SECONDS, os._exit, (0,))
    timer.daemon = True  # a stop by the pipe meanwhile is not held up by it
    timer.start()


def _forward_loop(
    scorer: ProbeScorer, tokenised: queue.Queue, send: Callable[[tuple[int, str, Any]], None]
) -> None:
    """The forward thread: score each tokenised batch and send its outcomes, or its failure. A
    failure after which the GPU no longer answers ends the process (`DEVICE_LOST`)."""
    while (item := tokenised.get()) is not None:
        number, tokens = item
        failed = False
        try:
            reply: tuple[int, str, Any] = (number, "scored", forward_stage(scorer, tokens))
        except Exception as error:
            log.exception("the scorer process failed a forward pass")
            reply, failed = (number, "failed", f"{type(error).__name__}: {error}"), True
        # The monitor is gone: go on taking batches (dropped), so that the receiving thread,
        # which sees the pipe's end next, is never stuck on a full queue.
        with contextlib.suppress(OSError, ValueError):
            send(reply)  # before the check below, which a hung GPU may never finish
        if failed and not scorer.device_answers():
            # The CUDA context is lost: every later pass would fail while the monitor looks
            # alive. The process ends, and the monitor starts another (`RestartingScorer`).
            log.error("the GPU no longer answers in this process; ending it")
            os._exit(DEVICE_LOST)


def _picklable(error: Exception) -> Exception:
    """The error itself when it crosses the pipe intact (InputError does), else a RuntimeError
    with its message."""
    import pickle

    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error
