"""Which process listens on a local port: a port that is free to serve on, a free one from the
system, and on Linux whose LISTEN socket answers there (read from /proc), so that a run trusts an
answer only from the server it started and never from a neighbour's on the same port."""

from __future__ import annotations

import enum
import os
import socket
from pathlib import Path

__all__ = ["Holder", "descendants", "free_port", "port_free", "port_holder"]

PROC = Path("/proc")
_LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp{,6}


class Holder(enum.Enum):
    """Who listens on a port, as seen from here."""

    OWN = "own"  # a process of the given tree
    OTHER = "other"  # someone else: the given tree cannot bind it
    NONE = "none"  # nobody (yet)
    UNKNOWN = "unknown"  # no /proc to read (not Linux): only "it answers" can be known


def port_free(host: str, port: int) -> bool:
    """Could a server bind `host:port` now? SO_REUSEADDR as servers set it, so that a socket of
    a server that just stopped (TIME_WAIT) does not count as taken."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str) -> int:
    """A port the system says is free on `host` now (it may be taken before it is bound: the
    caller checks who listens)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_holder(port: int, pid: int, *, proc: Path = PROC) -> Holder:
    """Whether the LISTEN socket on `port` (any address, IPv4 or IPv6) belongs to process `pid`
    or one of its descendants (a server that listens in a worker process still counts)."""
    listening = _listen_inodes(port, proc)
    if listening is None:
        return Holder.UNKNOWN
    if not listening:
        return Holder.NONE
    owned = set().union(*(_socket_inodes(p, proc) for p in _tree(pid, proc)))
    return Holder.OWN if listening & owned else Holder.OTHER


def _listen_inodes(port: int, proc: Path) -> set[int] | None:
    """The inodes of the LISTEN sockets on `port`, or None where /proc/net is not there."""
    tables = [proc / "net" / name for name in ("tcp", "tcp6")]
    if not any(table.exists() for table in tables):
        return None
    inodes: set[int] = set()
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]  # the first line names the columns
        except OSError:  # tcp6 is absent where IPv6 is off
            continue
        for line in lines:
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(fields[9]))
    return inodes


def _socket_inodes(pid: int, proc: Path) -> set[int]:
    """The inodes of the sockets process `pid` holds open (none if it ended or is not ours)."""
    inodes = set()
    try:
        for fd in (proc / str(pid) / "fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:  # closed while we looked
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[len("socket:[") : -1]))
    except OSError:
        pass
    return inodes


def descendants(pid: int, *, proc: Path = PROC) -> dict[int, int]:
    """The processes below `pid` now, each with its start time (empty where /proc is not there):
    a server's workers, which must not outlive it (vLLM's engine runs in a child of its API
    server). The start time, read with the parent pid, tells a reused pid from the worker later."""
    tree = _tree(pid, proc)
    return {child: started for child, started in tree.items() if child != pid}


def _tree(pid: int, proc: Path) -> dict[int, int]:
    """`pid` and its descendants with their start times, from /proc/PID/stat (fields 4 and 22)."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            # "PID (COMMAND) STATE PPID ...": the command may hold spaces and parentheses.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            child, ppid = int(stat.parent.name), int(fields[1])
            started[child] = int(fields[19]) if len(fields) > 19 else 0
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(child)
    tree: dict[int, int] = {}
    todo = [pid]
    while todo:
        current = todo.pop()
        if current not in tree:
            tree[current] = started.get(current, 0)
            todo.extend(children.get(current, ()))
    return tree
