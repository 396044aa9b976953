"""A process's TCP sockets as the kernel lists them (/proc), for tests that check what kfan or a broker holds.

A socket belongs to a process when one of the process's descriptors points at
its inode; /proc/net/tcp and tcp6 give each inode's addresses and state.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ESTABLISHED = "01"
LISTEN = "0A"


@dataclass(frozen=True)
class TcpSocket:
    local_port: int
    remote_port: int
    state: str  # the kernel's hex code: ESTABLISHED, LISTEN, ...

    def __str__(self) -> str:
        return f"{self.local_port} -> {self.remote_port} state {self.state}"


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds descriptors to."""
    inodes: set[str] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def tcp_sockets(pid: int) -> list[TcpSocket]:
    """The TCP sockets (IPv4 and IPv6) of process ``pid``."""
    inodes = socket_inodes(pid)
    out: list[TcpSocket] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[9] in inodes:
                out.append(TcpSocket(int(cols[1].rsplit(":", 1)[1], 16), int(cols[2].rsplit(":", 1)[1], 16), cols[3]))
    return out
