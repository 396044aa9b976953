"""Child processes of the tests: a free port for them, their output as it comes, stopping them."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

# Shared with `kfan bench`, which starts kfan the same way.
from proxy.tools.bench.processes import follow_output, stop_process

__all__ = ["follow_output", "free_port", "stop_process"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and that no outgoing connection will take.

    Drawn at random below the kernel's ephemeral range (``ip_local_port_range``), which is where every
    outgoing connection's local port comes from (kfan's, the JVMs', the clients'): a port found free by
    binding port 0 lies inside that range, and a connection opened before the child binds it took it (seen:
    a Kafka broker failing with "Address already in use"). Ports handed out are not handed out again
    by this process. Still only free right now against other processes doing the same: a caller that
    starts a child on it must start it again on another port when its bind fails (as
    :class:`tests.support.tansu.Tansu` and :func:`tests.support.stunnel.start_stunnel` do), or better,
    let the child bind port 0 and read back the port it got (as kfan does).

    The suite's workers (pytest-xdist) draw from separate slices of that range: a Kafka broker cannot
    be started again on another port, and two workers drawing the same port would fail one of them."""
    first, end = _slice(10000, min(_ephemeral_start(), 32768))
    for _ in range(1000):
        port = _random.randrange(first, end)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {first}..{end}")


def _slice(first: int, end: int) -> tuple[int, int]:
    """This xdist worker's part of ``first..end`` (all of it outside xdist)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2:
        return first, end
    size = (end - first) // count
    start = first + int(worker[2:]) % count * size
    return start, start + size


_random = random.Random()
_handed_out: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
