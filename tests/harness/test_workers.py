"""Worker processes (`harness._workers`), as the report draws its figures and an export writes its
logs with them: a figure drawn by a worker is byte-identical to one drawn in this process, a
call's error and a worker's death come back at `wait` (an OSError as itself, anything else as a
`WorkerError`), a pool that stops on errors skips what is left, a call that cannot be pickled
fails where it is made, and a script that builds a report without a
`__main__` guard is not run again by the workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# Private: the pool and one figure function it draws.
import harness.report._figures as fig
from harness._workers import WorkerError, WorkerPool


def mean_value_args(path: Path) -> tuple[tuple, dict]:
    rng = np.random.default_rng(0)
    fractions = np.linspace(0.05, 0.5, 10)
    signals = {name: rng.normal(size=(3, 10)) for name in ("dv", "uncertainty", "oracle")}
    return (fractions, signals, 0.1), {"title": "mean v", "path": path}


def test_a_worker_draws_the_same_bytes_as_this_process(tmp_path: Path) -> None:
    args, kwargs = mean_value_args(tmp_path / "here.png")
    fig.mean_value_figure(*args, **kwargs)
    pool = WorkerPool(preload=fig.MATPLOTLIB)
    for i in range(3):  # more figures than some machines have workers
        pool.submit(fig.mean_value_figure, *args, **{**kwargs, "path": tmp_path / f"worker-{i}.png"})
    pool.wait()
    here = (tmp_path / "here.png").read_bytes()
    assert all((tmp_path / f"worker-{i}.png").read_bytes() == here for i in range(3))


def test_a_pool_started_ahead_keeps_its_workers_for_the_calls(tmp_path: Path) -> None:
    """`start()` before the first call (the report's workers import matplotlib while `ctd eval`
    calibrates): once only, and the calls then run in those workers."""
    pool = WorkerPool(preload=fig.MATPLOTLIB, workers=2)
    pool.start()
    started = [worker.process.pid for worker in pool._workers]
    pool.start()
    assert (
        len(started) == min(2, len(os.sched_getaffinity(0)))
        and [worker.process.pid for worker in pool._workers] == started
    )
    args, kwargs = mean_value_args(tmp_path / "drawn.png")
    pool.submit(fig.mean_value_figure, *args, **kwargs)
    assert [worker.process.pid for worker in pool._workers] == started
    pool.wait()
    assert (tmp_path / "drawn.png").is_file() and not pool._workers


def test_a_failing_figure_is_raised_at_wait_with_its_traceback(tmp_path: Path) -> None:
    pool = WorkerPool(preload=fig.MATPLOTLIB)
    pool.submit(int, "not a number")
    args, kwargs = mean_value_args(tmp_path / "after.png")
    pool.submit(fig.mean_value_figure, *args, **kwargs)
    with pytest.raises(WorkerError, match=r"(?s)Traceback.*ValueError: invalid literal"):
        pool.wait()
    assert (tmp_path / "after.png").is_file()  # the others were drawn (or waited for) first


def test_the_machines_or_the_inputs_error_comes_back_as_itself(tmp_path: Path) -> None:
    """An OSError (a missing file, a full disk) is raised as itself, so that the command line
    says it in one line; the worker's traceback is its note."""
    pool = WorkerPool()
    pool.submit(os.rmdir, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError) as raised:
        pool.wait()
    assert raised.value.filename == str(tmp_path / "missing")
    assert "in a worker process" in raised.value.__notes__[0] and "Traceback" in raised.value.__notes__[0]


def test_after_a_failure_a_stopping_pool_skips_the_calls_not_started(tmp_path: Path) -> None:
    done: list[int] = []
    pool = WorkerPool(workers=1, stop_on_error=True, done=lambda: done.append(1))
    pool.submit(os.mkdir, str(tmp_path / "first"))
    pool.submit(os.rmdir, str(tmp_path / "missing"))
    for name in ("later", "last"):
        pool.submit(os.mkdir, str(tmp_path / name))
    with pytest.raises(FileNotFoundError):
        pool.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first"] and done == [1]


def test_a_pool_draws_again_after_a_wait(tmp_path: Path) -> None:
    pool = WorkerPool(preload=fig.MATPLOTLIB)
    for name in ("first", "second"):
        args, kwargs = mean_value_args(tmp_path / f"{name}.png")
        pool.submit(fig.mean_value_figure, *args, **kwargs)
        pool.wait()
        assert (tmp_path / f"{name}.png").is_file()


def test_what_a_worker_prints_never_gets_into_its_answers(tmp_path: Path, monkeypatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('noise on stdout ' * 100, flush=True)\n")
    monkeypatch.syspath_prepend(str(site))  # the workers' import path is this process's
    args, kwargs = mean_value_args(tmp_path / "a.png")
    pool = WorkerPool(preload=fig.MATPLOTLIB)
    pool.submit(fig.mean_value_figure, *args, **kwargs)
    pool.submit(int, "not a number")  # its error must come back as it is
    with pytest.raises(WorkerError, match=r"ValueError: invalid literal"):
        pool.wait()
    assert (tmp_path / "a.png").is_file()


def test_a_worker_that_dies_is_an_error_not_a_hang() -> None:
    pool = WorkerPool(preload=fig.MATPLOTLIB)
    pool.submit(os._exit, 3)
    with pytest.raises(WorkerError, match=r"a worker process ended \(exit code 3\)"):
        pool.wait()


def test_a_call_that_cannot_be_pickled_fails_where_it_is_made(tmp_path: Path) -> None:
    pool = WorkerPool(preload=fig.MATPLOTLIB)
    with pytest.raises(Exception, match="pickle"):  # PicklingError or AttributeError by version
        pool.submit(lambda: None)
    pool.close()


def test_a_script_without_a_main_guard_builds_its_figures_once(tmp_path: Path) -> None:
    """multiprocessing's spawn would run such a script again in every worker."""
    script = tmp_path / "plot.py"
    marker = tmp_path / "runs.txt"
    script.write_text(
        "import numpy as np\n"
        "import harness.report._figures as fig\n"
        "from harness._workers import WorkerPool\n"
        f"open({str(marker)!r}, 'a').write('ran\\n')\n"
        "pool = WorkerPool(preload=fig.MATPLOTLIB)\n"
        "rng = np.random.default_rng(0)\n"
        "signals = {name: rng.normal(size=(3, 4)) for name in ('dv', 'uncertainty', 'oracle')}\n"
        f"pool.submit(fig.mean_value_figure, np.linspace(0.1, 0.4, 4), signals, 0.0, title='t', "
        f"path={str(tmp_path / 'a.png')!r})\n"
        "pool.wait()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "ran\n" and (tmp_path / "a.png").is_file()
