"""A client connection takes turns with the rest of the process however much its client pipelines.

Serving a request takes no pass of the scheduler when nothing has to wait
(its room in the response order, its slot, its answer), so the response
order makes the connection's reader yield every YIELD_EVERY slots it places.
"""

from __future__ import annotations

from collections import Counter

import trio

from proxy.kafka import apis
from proxy.kafka.frames import frame
from proxy.runtime.frame_io import YIELD_EVERY
from proxy.server.forwarder import Forwarder
from tests.support.messages import request_bytes
from tests.test_connection import serving


class _Steps(trio.abc.Instrument):
    """Counts task steps: requests served in one step of the reader share its number."""

    def __init__(self) -> None:
        self.step = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.step += 1


async def test_a_client_pipelining_many_requests_in_one_read_does_not_hold_the_event_loop(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    steps = _Steps()
    served_in_step: list[int] = []
    take = Forwarder.take

    async def counted(self: Forwarder, payload: bytes | memoryview) -> None:
        served_in_step.append(steps.step)
        await take(self, payload)

    monkeypatch.setattr(Forwarder, "take", counted)
    n = 5 * YIELD_EVERY
    body = {"client_software_name": "kfan-test", "client_software_version": "1"}
    pipelined = b"".join(frame([request_bytes(apis.API_VERSIONS, 3, body, correlation_id=cid)]) for cid in range(n))
    trio.lowlevel.add_instrument(steps)
    try:
        async with serving() as h:
            await h.client.stream.send_all(pipelined)  # all of them arrive in one read
            for cid in range(n):
                got, _ = await h.client.response(apis.API_VERSIONS, 3)
                assert got == cid
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert len(served_in_step) == n
    most_in_one_step = max(Counter(served_in_step).values())
    assert most_in_one_step <= YIELD_EVERY, f"the reader served {most_in_one_step} requests without letting others run"
