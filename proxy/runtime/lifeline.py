"""The lifeline of kfan's child processes (the demo's `kfan cluster`, each `kfan serve --workers` worker):
they stop when the kfan that started them is gone, however it ended."""

from __future__ import annotations

import logging
import os
import sys

import trio

log = logging.getLogger("kfan")

# Set in a child's environment (the demo's `kfan cluster`, each `kfan serve
# --workers` worker): the child then stops when its stdin reaches end of file.
# The kfan that started it holds the other end of that pipe, and the kernel
# closes it however kfan ends, SIGKILL included, so children never outlive it.
# (Not PR_SET_PDEATHSIG: that fires when the *thread* that forked the child
# exits, and trio forks from a worker thread that exits when idle.)
LIFELINE_ENV = "KFAN_LIFELINE"
LIFELINE_CLOSED = "lifeline closed"  # the stop reason :func:`watch_lifeline` gives


async def watch_lifeline(stop: trio.MemorySendChannel[str]) -> None:
    """A child of another kfan (LIFELINE_ENV): stop when stdin, a pipe from that kfan, reaches end of file (it is gone)."""
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    try:
        async with stdin:
            while await stdin.receive_some(4096):
                pass
    except (OSError, trio.BrokenResourceError):
        pass
    log.warning("the kfan that started this process is gone (its pipe closed)")
    stop.send_nowait(LIFELINE_CLOSED)
