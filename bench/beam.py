"""The RabbitMQ nodes' Erlang VMs behind a broker URL, and their CPU time, from ``/proc``.

A URL may be a failover list (``amqp://a:5700//;amqp://b:5701//;amqp://c:5702//``, a
cluster of nodes on this machine): each node is found by the port it listens on (the
socket's inode in ``/proc/net/tcp``, then the process holding it), so that a cluster's
CPU per job is the sum of its three VMs, and the machine's own node (another ``beam.smp``)
is not counted with them.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

#: ``/proc/net/tcp``'s state of a listening socket
LISTEN = "0A"


def ports(url: str) -> list[int]:
    """The AMQP ports a (failover) URL names, 5672 where it names none."""
    return [urlsplit(part.strip()).port or 5672 for part in url.split(";") if part.strip()]


def _listening_inodes(port: int) -> set[str]:
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def pid_listening(port: int) -> int | None:
    """The process that listens on ``port`` (None: nobody, or not ours to read)."""
    inodes = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not inodes:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(entry.name)
        except OSError:
            continue
    return None


def pids(url: str) -> list[int]:
    """The VM of every node the URL names that listens on this machine."""
    return [pid for pid in map(pid_listening, ports(url)) if pid is not None]


def stat_fields(pid: int | str) -> list[str]:
    """``/proc/<pid>/stat`` after the process's name: ``[state, ppid, ...]``."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu(pid: int | None) -> float | None:
    """Seconds of CPU (user + system) the process has used."""
    if pid is None:
        return None
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_of(found: list[int]) -> float | None:
    """The processes' CPU seconds, summed (None when there is none)."""
    if not found:
        return None
    return sum(cpu(pid) or 0.0 for pid in found)
