"""The decision log's contract (harness/monitor/_decisions.py): a record is reserved before it is
paid for, written whole or not at all, and a torn tail is cut when the log is opened. The full disk
is a real one: a small tmpfs (the `small_disk` fixture); where it cannot be mounted, that test is skipped."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from monitor_bundle import write_untrained_bundle
from monitor_run import fill

from harness import InputError

# Private: the decision log, unit-tested.
from harness.monitor import Monitor, _decisions
from harness.monitor._decisions import DecisionLog, record_bound
from harness.monitor._errors import LogUnavailable

RECORD = {"event": "decision", "request_id": "r" * 24, "probe": 0.25, "dv": 0.5, "reason": "not-delegated"}


def _lines(path: Path) -> list[dict]:
    """Every line of the log, each one whole JSON (a torn line fails here)."""
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


async def _write(log: DecisionLog, record: dict) -> None:
    bound = record_bound(None)
    log.reserve(bound)
    await log.write(record, reserved=bound)


def test_a_full_disk_refuses_before_the_record_and_space_coming_back_heals(small_disk: Path) -> None:
    async def scenario() -> None:
        log = DecisionLog(small_disk / "decisions.jsonl")
        await _write(log, {**RECORD, "n": 0})
        # Fill the disk but a few records' worth.
        filler = small_disk / "filler"
        fill(filler)
        written, refused = 1, 0
        bound = record_bound(None)
        for n in range(1, 400):
            try:
                log.reserve(bound)  # the refusal comes here, before anything would be paid ...
            except LogUnavailable as error:
                refused += 1
                assert "No space left on device" in str(error) and error.retry_after >= 1
                continue
            await log.write({**RECORD, "n": n, "pad": "p" * 600}, reserved=bound)  # ... never here
            written += 1
        assert refused > 0 and not log.healthy and "No space left" in str(log.problem)
        assert [r["n"] for r in _lines(log.path)] == list(range(written))  # nothing torn, nothing lost
        filler.unlink()  # space comes back: the log says so when asked, before any record
        assert log.recheck() and log.healthy
        await _write(log, {**RECORD, "n": "after"})
        assert log.healthy and log.problem is None
        assert [r["n"] for r in _lines(log.path)] == [*range(written), "after"]
        await log.aclose()

    asyncio.run(scenario())


def test_a_failed_write_leaves_no_torn_line_to_swallow_the_next_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write
    failures = {"left": 1}

    def half_then_eio(fd: int, data: bytes) -> int:
        if failures["left"]:
            failures["left"] -= 1
            real_write(fd, bytes(data[: len(data) // 2]))  # a partial write, then the device fails
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_write(fd, data)

    async def scenario() -> None:
        log = DecisionLog(tmp_path / "decisions.jsonl")
        await _write(log, {**RECORD, "n": 0})
        monkeypatch.setattr(_decisions.os, "write", half_then_eio)
        with pytest.raises(LogUnavailable, match="Input/output error"):
            await _write(log, {**RECORD, "n": 1})
        assert not log.healthy
        # Cutting the failed write back freed what was reserved past the end: the next record
        # reserves again (so a full disk still refuses before anything is paid).
        reserved: list[int] = []
        real = _decisions._fallocate
        monkeypatch.setattr(_decisions, "_fallocate", lambda *a: (reserved.append(a[2]), real(*a)))
        await _write(log, {**RECORD, "n": 2})
        assert reserved
        assert log.healthy
        await log.aclose()

    asyncio.run(scenario())
    assert [r["n"] for r in _lines(tmp_path / "decisions.jsonl")] == [0, 2]


def test_a_torn_tail_from_a_crash_is_cut_at_open_and_kept_aside(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    path.write_text(json.dumps({"n": 0}) + "\n" + '{"n": 1, "probe": 0.')  # died mid-write
    log = DecisionLog(path)
    log.write_sync({"n": 2})
    log.close()
    assert [r["n"] for r in _lines(path)] == [0, 2]
    assert (tmp_path / "decisions.jsonl.torn").read_text() == '{"n": 1, "probe": 0.\n'


def test_reserving_past_the_file_size_limit_refuses_at_once(tmp_path: Path) -> None:
    """The process's own limit (ulimit -f) is a full disk too, checked before anything is paid."""
    script = (
        "import resource, signal, asyncio\n"
        "from harness.monitor._decisions import DecisionLog\n"
        "from harness.monitor._errors import LogUnavailable\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))\n"
        f"log = DecisionLog({str(tmp_path / 'd.jsonl')!r})\n"
        "log.reserve(2048); log.write_sync({'n': 0}); log.release(2048)\n"
        "try:\n    log.reserve(4096)\nexcept LogUnavailable as e:\n    print('refused:', e)\n"
    )
    done = subprocess.run(
        ["python", "-c", script], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2]
    )
    assert done.returncode == 0, done.stderr
    assert "refused: decision log full" in done.stdout and "ulimit -f" in done.stdout


def test_a_log_path_that_is_a_folder_is_an_os_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError) as raised:
        DecisionLog(tmp_path)
    assert raised.value.filename == str(tmp_path)


def test_a_second_writer_of_one_log_is_refused_at_open(tmp_path: Path) -> None:
    """Two monitors on one log would cut each other's records (recovery, close): one writer only."""
    first = DecisionLog(tmp_path / "decisions.jsonl")
    with pytest.raises(InputError, match="another monitor is writing this decision log"):
        DecisionLog(tmp_path / "decisions.jsonl")
    first.close()
    DecisionLog(tmp_path / "decisions.jsonl").close()  # free again once the first is closed


def test_reopen_after_a_rename_goes_on_in_a_new_file_and_carries_the_reservations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Log rotation by rename (logrotate's default), then `reopen` (SIGHUP): every record is whole
    in exactly one of the two files, and a record reserved before the switch, written after it,
    was reserved again in the new file (so a full disk there still refuses before a payment)."""
    path = tmp_path / "decisions.jsonl"

    async def scenario() -> None:
        log = DecisionLog(path)
        for n in range(3):
            await _write(log, {**RECORD, "n": n})
        bound = record_bound(None)
        log.reserve(bound)  # a request in flight: reserved, its expert not yet answered
        path.rename(tmp_path / "decisions.jsonl.1")
        reserved: list[tuple[int, int]] = []
        real = _decisions._fallocate
        monkeypatch.setattr(_decisions, "_fallocate", lambda *a: (reserved.append(a[:2]), real(*a)))
        log.reopen()
        await asyncio.sleep(0.1)  # the switch runs on the writer task, with nothing to write
        assert path.is_file() and reserved and reserved[0][1] == 0  # the new file, from its start
        await log.write({**RECORD, "n": 3}, reserved=bound)
        await _write(log, {**RECORD, "n": 4})
        log.reopen()  # not renamed this time: it stays in the same file
        await _write(log, {**RECORD, "n": 5})
        await log.aclose()

    asyncio.run(scenario())
    assert [r["n"] for r in _lines(tmp_path / "decisions.jsonl.1")] == [0, 1, 2]
    assert [r["n"] for r in _lines(path)] == [3, 4, 5]


def test_a_log_cut_short_by_another_program_is_not_padded_with_zeros(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """logrotate's copytruncate empties the file under the writer: the records after it start the
    file, closing the log does not grow it back to its former length, and the blocks reserved
    past the old end, gone with the cut, are reserved again before the next expert is paid."""
    path = tmp_path / "decisions.jsonl"

    async def scenario() -> None:
        log = DecisionLog(path)
        for n in range(20):
            await _write(log, {**RECORD, "n": n})
        reserved: list[int] = []
        real = _decisions._fallocate
        monkeypatch.setattr(_decisions, "_fallocate", lambda *a: (reserved.append(a[1]), real(*a)))
        os.truncate(path, 0)  # as copytruncate does, after copying the file away
        await _write(log, {**RECORD, "n": "after"})
        await _write(log, {**RECORD, "n": "next"})
        assert reserved and reserved[0] < 1000  # from the new end, not from past the old one
        await log.aclose()

    asyncio.run(scenario())
    assert b"\0" not in path.read_bytes()
    assert [r["n"] for r in _lines(path)] == ["after", "next"]


def test_an_unforeseen_error_in_the_writer_refuses_every_waiting_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever ends the writer task, no request is left waiting for its record for ever."""

    async def scenario() -> None:
        log = DecisionLog(tmp_path / "decisions.jsonl")
        monkeypatch.setattr(log, "_append", lambda data: 1 / 0)
        writes = [asyncio.ensure_future(_write(log, {**RECORD, "n": n})) for n in range(3)]
        done, pending = await asyncio.wait(writes, timeout=10)
        assert not pending
        assert all(isinstance(w.exception(), LogUnavailable) for w in done)
        monkeypatch.undo()
        await _write(log, {**RECORD, "n": 3})  # the next record starts a new writer
        await log.aclose()

    asyncio.run(scenario())
    assert [r["n"] for r in _lines(tmp_path / "decisions.jsonl")] == [3]


def test_a_writer_cancelled_mid_write_answers_what_reached_the_disk_and_leaves_one_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelling the writer task cannot stop the thread doing the write: the task waits for it,
    answers the records it wrote as written (they are in the file), and only then ends, so that
    the next writer never runs beside it."""

    async def scenario() -> None:
        log = DecisionLog(tmp_path / "decisions.jsonl")
        real = log._append
        started = threading.Event()

        def slow_append(data: bytes) -> tuple[int, int]:
            started.set()
            time.sleep(0.3)
            return real(data)

        monkeypatch.setattr(log, "_append", slow_append)
        writes = [asyncio.ensure_future(_write(log, {**RECORD, "n": n})) for n in range(3)]
        while not started.is_set():
            await asyncio.sleep(0.01)
        assert log._writer is not None
        log._writer.cancel()
        results = await asyncio.gather(*writes, return_exceptions=True)
        assert results == [None, None, None]  # on disk, so answered as written
        monkeypatch.undo()
        await _write(log, {**RECORD, "n": 3})
        await log.aclose()

    asyncio.run(scenario())
    assert [r["n"] for r in _lines(tmp_path / "decisions.jsonl")] == [0, 1, 2, 3]


def test_a_monitor_that_fails_to_load_lets_go_of_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load that fails after the log was opened (here: its warm-up) closes the log, lock and
    all, so that the next load in the same process may write it."""
    bundle = write_untrained_bundle(tmp_path / "bundle")
    path = tmp_path / "decisions.jsonl"

    async def no_warm_up(self: Monitor, passes: int = 2) -> None:
        raise RuntimeError("warm-up failed")

    with monkeypatch.context() as patched:
        patched.setattr(Monitor, "warm_up", no_warm_up)
        with pytest.raises(RuntimeError, match="warm-up failed"):
            asyncio.run(Monitor.load(bundle, expert=False, log_path=path))
    DecisionLog(path).close()  # not "another monitor is writing this decision log"
