"""One run's query stage in a process of its own, as `ctd eval` runs it on the default expert
(the embedded smollm2, `--serve auto`): the run's one endpoint check (`ResolvedExpert.preflight`), then
`QueryStage`, which starts the run's own local llama.cpp server when the check found none. The
rest of `ctd eval` (probes, calibration, report) costs minutes on 2 cores and has no part in
which server a run talks to, so it is left out.

    python query_run.py NAME LIMIT HOLD

NAME is the run folder under $CTD_RUNS_DIR; LIMIT examples per split of the built-in data; after
the check the run writes HOLD.checked and waits until the file HOLD exists, so that a test can
let two runs check before either starts its server, then start them in the order it wants."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from harness.data import load_data
from harness.expert import resolve_expert
from harness.run import Manifests, Roots, RunConfig, RunContext, StageProgress
from harness.stages import QueryStage
from probes import ModelInfo


def main(name: str, limit: int, hold: Path) -> int:
    data = load_data(None, limit=limit)
    expert = resolve_expert("smollm2", named="the default expert smollm2")
    start_server = expert.preflight(serve=True)
    hold.with_suffix(".checked").write_text(str(start_server))
    while not hold.exists():
        time.sleep(0.05)
    layout = Roots.resolve().run(name)
    ctx = RunContext(
        config=RunConfig(name=name, limit=limit),
        roots=Roots.resolve(),
        layout=layout,
        manifests=Manifests(layout),
        data=data,
        expert=expert,
        model=ModelInfo(identity="unused by the query stage", n_layers=1, config=None),
        progress=StageProgress(enabled=False),
    )
    stage = QueryStage(ctx, start_server=start_server, may_serve=True)
    result = stage.run()
    stage.check_outputs()
    print(result.detail)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])))
