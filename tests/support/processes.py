"""Child processes of the tests: a free port for them, their output as it comes, stopping them."""

from __future__ import annotations

import socket

# Shared with `kfan bench`, which starts kfan the same way.
from proxy.bench.processes import follow_output, stop_process

__all__ = ["follow_output", "free_port", "stop_process"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    Only right now: another process may bind it before the child given it does. A caller
    that starts a child on it must start it again on another port when its bind fails
    (as :class:`tests.support.tansu.Tansu` and :func:`tests.support.stunnel.start_stunnel` do),
    or better, let the child bind port 0 and read back the port it got (as kfan does)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
