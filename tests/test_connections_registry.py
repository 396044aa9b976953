"""The process's open client connections (proxy/server/registry.py): what a graceful stop drains.

A connection accepted before a stop but counted only after the stop began
draining (a TLS handshake comes before it is counted) must be drained as it
is counted; else the stop waits for it until its own timeouts (seen as a
kfan that took more than 15 s to stop under a full suite's load).
"""

from __future__ import annotations

from typing import Any, cast

import trio

from proxy.server.registry import Connections


class _Connection:
    def __init__(self) -> None:
        self.drained = 0

    def drain(self, at: float | None = None) -> None:
        self.drained += 1


def test_a_connection_counted_after_the_drain_began_is_drained_at_once() -> None:
    connections = Connections()
    before, after = _Connection(), _Connection()
    connections.add(cast(Any, before))
    assert before.drained == 0, "nothing drains a connection of a kfan that is not stopping"
    connections.draining = True  # as Server.shutdown does, then drains those it lists
    connections.add(cast(Any, after))
    assert after.drained == 1


async def test_the_stop_waits_only_for_connections_still_open() -> None:
    connections = Connections()
    conn = _Connection()
    with connections.track(cast(Any, conn)):
        with trio.move_on_after(0.01) as waiting:
            await connections.wait_empty()
        assert waiting.cancelled_caught, "one connection is open"
    with trio.fail_after(1):
        await connections.wait_empty()
