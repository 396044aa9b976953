"""Answers written where they are answered, while the connection's writer waits (:mod:`proxy.server.ordering`).

Over a real socket pair (the client's end of a :class:`ClientConnection`; the brokers are in-memory fakes):
an answer to the oldest request, landing while the writer waits, goes to the socket at once and the writer is
not woken for it. The client still gets its responses in request order whatever order the brokers answer in,
and when its socket is full the writer sends what was left, in order, once the client reads again.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing

from proxy.kafka import apis
from proxy.server.connection import ClientConnection
from proxy.server.limits import Limits
from tests.support.memory_broker import MemoryBrokers
from tests.test_connection import (
    IDENTITY,
    LIST_OFFSETS_V,
    TEST_DEADLINE,
    Client,
    answer_list_offsets,
    by_partition,
    list_offsets,
    make_cluster,
)


class _WriterSteps(trio.abc.Instrument):
    """Steps of the connection's writer task."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if "write_answers" in task.name:
            self.steps += 1


@asynccontextmanager
async def over_a_socket(buffer: int | None = None) -> AsyncIterator[tuple[Client, MemoryBrokers]]:
    """A connection whose client end is a socket (``buffer``: both ends' socket buffers, small to fill them)."""
    ours, theirs = socket.socketpair()
    if buffer is not None:
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    with trio.fail_after(TEST_DEADLINE):
        async with trio.open_nursery() as nursery:
            brokers = MemoryBrokers(nursery)
            server = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
            conn = ClientConnection(server, make_cluster(), IDENTITY, Limits(), connect_broker=brokers.connect)
            nursery.start_soon(conn.run)
            yield Client(trio.SocketStream(trio.socket.from_stdlib_socket(ours))), brokers
            nursery.cancel_scope.cancel()


async def test_an_answer_to_the_request_the_writer_waits_for_is_written_without_waking_it() -> None:
    steps = _WriterSteps()
    async with over_a_socket() as (client, brokers):
        await client.send(list_offsets(0, [0]))  # the first: the writer starts
        await answer_list_offsets(await brokers.next(1), 10)
        await client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V)
        trio.lowlevel.add_instrument(steps)
        try:
            for cid in range(1, 21):
                await client.send(list_offsets(cid, [cid % 2]))
                await answer_list_offsets(await brokers.next(1 + cid % 2), 100 * cid)
                got, body = await client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V)
                assert (
                    got == cid and by_partition(body, "topics", "partitions", "partition_index")[cid % 2]["offset"] == 100 * cid + cid % 2
                )
        finally:
            trio.lowlevel.remove_instrument(steps)
    assert steps.steps <= 2, f"the writer ran {steps.steps} steps for 20 answers"


async def test_answers_landing_out_of_order_are_written_in_request_order() -> None:
    async with over_a_socket() as (client, brokers):
        for cid in range(1, 7):
            await client.send(list_offsets(cid, [cid % 2]))
        held = {cid: await brokers.next(1 + cid % 2) for cid in range(1, 7)}
        for cid in (6, 4, 5, 2, 3, 1):
            await answer_list_offsets(held[cid], 100 * cid)
        for cid in range(1, 7):
            got, body = await client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V)
            assert got == cid and by_partition(body, "topics", "partitions", "partition_index")[cid % 2]["offset"] == 100 * cid + cid % 2


async def test_a_full_socket_leaves_the_rest_to_the_writer_in_order() -> None:
    n = 200
    async with over_a_socket(buffer=4096) as (client, brokers):
        for cid in range(n):
            await client.send(list_offsets(cid, [0]))
        held = [await brokers.next(1) for _ in range(n)]
        for cid, req in enumerate(held):
            await answer_list_offsets(req, 1000 + cid)  # the client reads nothing meanwhile: its socket fills
        await trio.testing.wait_all_tasks_blocked()
        for cid in range(n):
            got, body = await client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V)
            assert got == cid and by_partition(body, "topics", "partitions", "partition_index")[0]["offset"] == 1000 + cid
