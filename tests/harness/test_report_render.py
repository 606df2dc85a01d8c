"""The report's figure workers: a figure drawn by a worker is byte-identical to one drawn in this
process, a figure's error and a worker's death come back as one `FigureError` at `wait`, a call
that cannot be pickled fails where it is made, and a script that builds a report without a
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
from harness.report._render import FigureError, FigurePool


def mean_value_args(path: Path) -> tuple[tuple, dict]:
    rng = np.random.default_rng(0)
    fractions = np.linspace(0.05, 0.5, 10)
    signals = {name: rng.normal(size=(3, 10)) for name in ("dv", "uncertainty", "oracle")}
    return (fractions, signals, 0.1), {"title": "mean v", "path": path}


def test_a_worker_draws_the_same_bytes_as_this_process(tmp_path: Path) -> None:
    args, kwargs = mean_value_args(tmp_path / "here.png")
    fig.mean_value_figure(*args, **kwargs)
    pool = FigurePool()
    for i in range(3):  # more figures than some machines have workers
        pool.draw(fig.mean_value_figure, *args, **{**kwargs, "path": tmp_path / f"worker-{i}.png"})
    pool.wait()
    here = (tmp_path / "here.png").read_bytes()
    assert all((tmp_path / f"worker-{i}.png").read_bytes() == here for i in range(3))


def test_a_failing_figure_is_raised_at_wait_with_its_traceback(tmp_path: Path) -> None:
    pool = FigurePool()
    pool.draw(os.rmdir, str(tmp_path / "missing"))
    args, kwargs = mean_value_args(tmp_path / "after.png")
    pool.draw(fig.mean_value_figure, *args, **kwargs)
    with pytest.raises(FigureError, match=r"FileNotFoundError: .*missing"):
        pool.wait()
    assert (tmp_path / "after.png").is_file()  # the others were drawn (or waited for) first


def test_a_pool_draws_again_after_a_wait(tmp_path: Path) -> None:
    pool = FigurePool()
    for name in ("first", "second"):
        args, kwargs = mean_value_args(tmp_path / f"{name}.png")
        pool.draw(fig.mean_value_figure, *args, **kwargs)
        pool.wait()
        assert (tmp_path / f"{name}.png").is_file()


def test_what_a_worker_prints_never_gets_into_its_answers(tmp_path: Path, monkeypatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('noise on stdout ' * 100, flush=True)\n")
    monkeypatch.syspath_prepend(str(site))  # the workers' import path is this process's
    args, kwargs = mean_value_args(tmp_path / "a.png")
    pool = FigurePool()
    pool.draw(fig.mean_value_figure, *args, **kwargs)
    pool.draw(os.rmdir, str(tmp_path / "missing"))  # its error must come back as it is
    with pytest.raises(FigureError, match=r"FileNotFoundError: .*missing"):
        pool.wait()
    assert (tmp_path / "a.png").is_file()


def test_a_worker_that_dies_is_an_error_not_a_hang() -> None:
    pool = FigurePool()
    pool.draw(os._exit, 3)
    with pytest.raises(FigureError, match=r"a figure worker ended \(exit code 3\)"):
        pool.wait()


def test_a_call_that_cannot_be_pickled_fails_where_it_is_made(tmp_path: Path) -> None:
    pool = FigurePool()
    with pytest.raises(Exception, match="pickle"):  # PicklingError or AttributeError by version
        pool.draw(lambda: None)
    pool.close()


def test_a_script_without_a_main_guard_builds_its_figures_once(tmp_path: Path) -> None:
    """multiprocessing's spawn would run such a script again in every worker."""
    script = tmp_path / "plot.py"
    marker = tmp_path / "runs.txt"
    script.write_text(
        "import numpy as np\n"
        "import harness.report._figures as fig\n"
        "from harness.report._render import FigurePool\n"
        f"open({str(marker)!r}, 'a').write('ran\\n')\n"
        "pool = FigurePool()\n"
        "rng = np.random.default_rng(0)\n"
        "signals = {name: rng.normal(size=(3, 4)) for name in ('dv', 'uncertainty', 'oracle')}\n"
        f"pool.draw(fig.mean_value_figure, np.linspace(0.1, 0.4, 4), signals, 0.0, title='t', "
        f"path={str(tmp_path / 'a.png')!r})\n"
        "pool.wait()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "ran\n" and (tmp_path / "a.png").is_file()
