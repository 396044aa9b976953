"""A client connection takes turns with the rest of the process however much its client pipelines, and a broker
link however many answers arrive at once.

Serving a request takes no pass of the scheduler when nothing has to wait
(its room in the response order, its slot, its answer), so the response
order makes the connection's reader yield every YIELD_EVERY slots it places;
a link's reader, which may merge and answer each answer it hands over, yields
as often.
"""

from __future__ import annotations

import struct
from collections import Counter

import trio
import trio.testing

from backends.link import Link
from proxy.core import SubRequest
from proxy.kafka import apis
from proxy.kafka.frames import FrameReader, frame
from proxy.kafka.headers import peek_request
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


async def test_a_broker_answering_many_requests_in_one_read_does_not_hold_the_event_loop() -> None:
    """Each answer a link hands over may be merged and answered right there (proxy.server.deadlines): the link's
    reader yields every YIELD_EVERY answers of one read."""
    steps = _Steps()
    handed_in_step: list[int] = []
    n = 5 * YIELD_EVERY
    ours, broker = trio.testing.memory_stream_pair()

    async def connect() -> trio.abc.Stream:
        return ours

    trio.lowlevel.add_instrument(steps)
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                link = Link(1, "broker.test", 9092, connect=connect)
                nursery.start_soon(link.run)
                pendings = [link.submit(SubRequest(apis.API_VERSIONS, 0, [b""], True)) for _ in range(n)]
                for p in pendings:
                    p.on_done = lambda _: handed_in_step.append(steps.step)
                reader, cids = FrameReader(), []
                while len(cids) < n:
                    reader.feed(await broker.receive_some())
                    while (payload := reader.next_frame()) is not None:
                        cids.append(peek_request(payload)[2])
                await broker.send_all(b"".join(frame([struct.pack(">i", cid), b"\0\0"]) for cid in cids))  # one read
                for p in pendings:
                    await p.answered()
                nursery.cancel_scope.cancel()
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert len(handed_in_step) == n
    most_in_one_step = max(Counter(handed_in_step).values())
    assert most_in_one_step <= YIELD_EVERY, f"the link's reader handed over {most_in_one_step} answers without letting others run"
