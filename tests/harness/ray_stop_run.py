"""A Ray job's stop board with one actor that dies mid-call and one that asks on, in a process
of its own (Ray's start and shutdown stay out of the test process):

    python ray_stop_run.py

Both actors are started and ready first. The live one registers on the board and holds its
call for `LIVE_SECONDS`; the other registers and kills itself (SIGKILL: no `finally` runs, as
for a machine lost). The driver then says stop and waits up to `WAIT` seconds, as `ctd score
--ray` does, and prints one JSON line: how many calls it found still asking at the end, how long
it waited, and whether the live call had ended by then."""

from __future__ import annotations

import json
import logging
import os
import signal
import time

import ray

# Private: the stop board itself, driven as `ctd score --ray` drives it (no command exposes it).
from harness.score._stop import RayStop

LIVE_SECONDS = 6.0  # longer than the board's BEAT_STALE: only its beats keep it registered
WAIT = 10.0  # the driver's wait in `ctd score --ray` (the drain's grace plus its margin)


def main() -> None:
    ray.init(
        address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR
    )
    stop = RayStop()
    board = stop.open()

    @ray.remote(num_cpus=0, max_restarts=0)
    class Asker:
        def ready(self) -> bool:
            return True

        def ask(self, seconds: float) -> float:
            with stop.asking():
                time.sleep(seconds)
            return seconds

        def die_asking(self) -> None:
            with stop.asking():
                os.kill(os.getpid(), signal.SIGKILL)

    live, dying = Asker.remote(), Asker.remote()
    ray.get([live.ready.remote(), dying.ready.remote()])
    asked = live.ask.remote(LIVE_SECONDS)
    while ray.get(board.still_asking.remote()) < 1:
        time.sleep(0.05)
    died = dying.die_asking.remote()
    ray.wait([died], timeout=60)  # ready once the actor is dead
    start = time.monotonic()
    left = RayStop.stop_and_wait(board, WAIT)
    waited = time.monotonic() - start
    live_ended = bool(ray.wait([asked], timeout=0)[0])
    print(json.dumps({"left": left, "waited": round(waited, 2), "live_ended": live_ended}), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
