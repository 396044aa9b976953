"""A link's small requests written by their submitter while the writer waits (:mod:`backends.link`), over real sockets.

On a plain socket with nothing queued, :meth:`Link.submit` writes a small request itself, at once; what the
socket does not take goes to the writer, ahead of everything submitted later. These tests pin both halves:
the request is out before the submitter yields, and, when the broker stops reading so that the socket fills
part way through a frame, every request still reaches the broker whole and in submission order.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing

from backends.link import Link
from proxy.core import SubRequest
from proxy.kafka.frames import FrameReader
from proxy.kafka.headers import peek_request

API_KEY, API_VERSION = 3, 1  # any: the link does not read bodies
BODY = 12_000  # under the size written at once, several per socket buffer
REQUESTS = 300


def request(i: int, expect_response: bool = False) -> SubRequest:
    return SubRequest(API_KEY, API_VERSION, [b"%06d" % i + b"." * BODY], expect_response)


def _read_now(stream: trio.SocketStream) -> bytes:
    """What the broker's socket holds, read without yielding; then a pause for the sender's kernel to refill it."""
    with socket.socket(fileno=os.dup(stream.socket.fileno())) as raw:
        raw.setblocking(False)
        data = raw.recv(1 << 20)
    time.sleep(0.05)  # (blocking on purpose: no other task may run meanwhile)
    return data


async def _read_frames(stream: trio.SocketStream, n: int, early: bytes = b"") -> list[tuple[int, bytes]]:
    reader, out = FrameReader(1 << 20), []
    reader.feed(early)
    while len(out) < n:
        while (payload := reader.next_frame()) is not None:
            out.append((peek_request(payload)[2], bytes(payload[8:])))
        if len(out) < n:
            data = await stream.receive_some()
            assert data, "the link closed its stream"
            reader.feed(data)
    return out


@asynccontextmanager
async def link_to_a_broker() -> AsyncIterator[tuple[Link, trio.SocketStream]]:
    """A link to a broker over real sockets, its writer waiting for a request, and the broker's end of it."""
    accepted_send, accepted = trio.open_memory_channel[trio.SocketStream](1)

    async def hand_over(stream: trio.SocketStream) -> None:
        await accepted_send.send(stream)
        await trio.sleep_forever()  # the stream stays open while the test reads it

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            (listener,) = await nursery.start(functools.partial(trio.serve_tcp, hand_over, 0, host="127.0.0.1"))
            port = listener.socket.getsockname()[1]

            async def connect() -> trio.abc.Stream:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 * 1024)  # fills after a few requests
                return stream

            link = Link(1, "127.0.0.1", port, connect=connect)
            nursery.start_soon(link.run)
            await link.ready.wait()
            broker = await accepted.receive()
            await trio.testing.wait_all_tasks_blocked()  # the writer waits for a request
            yield link, broker
            nursery.cancel_scope.cancel()


async def test_a_small_request_is_out_before_its_submitter_yields() -> None:
    async with link_to_a_broker() as (link, broker):
        pending = link.submit(request(0, expect_response=True))
        assert pending.written and pending.sent.is_set(), "written by the writer task, a step later"
        assert await _read_frames(broker, 1) == [(0, request(0).tail[0])]


async def test_a_full_socket_keeps_the_requests_whole_and_in_order() -> None:
    async with link_to_a_broker() as (link, broker):
        broker.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
        # Submitted without yielding, the broker reading nothing: the first go out at once, one in part, the
        # rest wait for the writer.
        pendings = [link.submit(request(i)) for i in range(REQUESTS)]
        direct = sum(p.sent.is_set() for p in pendings)
        assert 0 < direct < REQUESTS, direct
        assert pendings[direct].written and not pendings[direct].sent.is_set(), "the one the socket took in part"
        # The broker reads some (the writer has not run yet): a request submitted now finds room in the socket,
        # and must still wait behind the rest of the one written in part.
        early = _read_now(broker)
        pendings.append(link.submit(request(REQUESTS)))
        assert not pendings[-1].written, "written ahead of the requests queued before it"
        frames = await _read_frames(broker, REQUESTS + 1, early)
        assert [cid for cid, _ in frames] == list(range(REQUESTS + 1))
        assert [body for _, body in frames] == [request(i).tail[0] for i in range(REQUESTS + 1)]
        # And once the writer has drained the queue, a submitter writes directly again.
        await trio.testing.wait_all_tasks_blocked()
        assert all(p.sent.is_set() for p in pendings)
        assert link.submit(request(REQUESTS + 1)).sent.is_set()
