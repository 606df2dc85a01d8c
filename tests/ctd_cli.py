"""Running the real `ctd` entry point in a subprocess, checking its one-line errors, and
finding the llama.cpp servers it starts (and a free port for them)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

CTD = "import sys; from harness.cli import main; sys.argv = ['ctd', *sys.argv[1:]]; main()"


def start_ctd(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`ctd ARGS` in the background, stdout and stderr captured as text, SIGINT at its default
    (tests that signal it)."""
    return subprocess.Popen(
        [sys.executable, "-c", CTD, *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_interrupts_by_default,
    )


def _interrupts_by_default() -> None:
    """In the child before exec: SIGINT back to its default, so that the test's Ctrl-C reaches
    `ctd` even when pytest was started as a background job (`nohup ... &`), which ignores it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_ctd(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CTD, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit code 2, stderr one line starting 'error: ', no traceback, each fragment in it."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# The modules `ctd` runs llama.cpp servers as: llama.cpp's own (xllamacpp), llama-cpp-python's.
LLAMA_SERVER_MODULES = (b"experts._llamacpp_server", b"llama_cpp.server")


def llama_servers_on(port: int) -> list[int]:
    """Pids of llama.cpp servers on `port`, from /proc (Linux), so a test sees a leaked child."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:  # the process ended while we looked
            continue
        if any(m in argv for m in LLAMA_SERVER_MODULES) and str(port).encode() in argv:
            found.append(int(cmdline.parent.name))
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
