"""Expensive login work in worker threads, a few at a time.

SASLprep (pure Python in scramp), PBKDF2 (a PLAIN password checked against a
stored SCRAM credential, kfan's own SCRAM logins to brokers), SCRAM proofs and
JWT signature checks cost milliseconds each. On the event loop, 650 wrong
PLAIN logins a second took every other client's p50 latency from 0.6 to 836 ms;
in a thread they cost the loop a hand-off. hashlib's PBKDF2 and the signature
checks of ``cryptography`` release the GIL, so the loop keeps serving while
they run. One limiter per process caps how many run at once: a login flood
queues here, behind half the cores, rather than taking all of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")

_limiter: trio.CapacityLimiter | None = None


def threads() -> int:
    """How many login computations may run at once: half the cores, at least one."""
    return max(1, (os.cpu_count() or 1) // 2)


def limiter() -> trio.CapacityLimiter:
    """The process's limiter of login work (made at first use)."""
    global _limiter
    if _limiter is None:
        _limiter = trio.CapacityLimiter(threads())
    return _limiter


async def run(work: Callable[..., T], *args: object) -> T:
    """``work(*args)`` in a worker thread, once the limiter lets it; not abandoned if cancelled (its inputs are bounded)."""
    return await trio.to_thread.run_sync(work, *args, limiter=limiter())
