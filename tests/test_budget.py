"""The memory budgets of :mod:`proxy.runtime.budget`, driven directly under trio, and what a
whole connection counts against them (over memory streams, on trio's MockClock).

A connection's reader waits while its connection holds its limit (one
request larger than the limit still passes alone); the process-wide pool
stops connections holding 64 KiB or more while the process is over its cap,
lets lighter ones read, and wakes the waiting ones when bytes are given back.
Brokers' answers count from their arrival: one that comes after its Fetch was
answered is held at most FETCH_AHEAD_TTL, or not at all when there is no room;
a client that does not read its answers is not sent more Fetches.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from proxy.core.fetch_wait import InflightFetches
from proxy.kafka import apis
from proxy.kafka.frames import FrameReader
from proxy.runtime.budget import POOL_FLOOR, Budget, MemoryPool
from proxy.server.connection import ClientConnection, Limits
from proxy.server.fetches import FETCH_AHEAD_TTL
from tests.support.memory_broker import BrokerRequest, MemoryBrokers
from tests.support.records import record_batch
from tests.test_connection import FETCH_V, IDENTITY, TEST_DEADLINE, TOPIC, Client, fetch, make_cluster

MiB = 1 << 20


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class PeakPool(MemoryPool):
    """A pool that remembers the most it held."""

    peak = 0

    def add(self, n: int) -> None:
        super().add(n)
        self.peak = max(self.peak, self.used)


@asynccontextmanager
async def connection(limits: Limits, lockstep: bool = False) -> AsyncIterator[tuple[Client, MemoryBrokers, PeakPool]]:
    """A connection with a pool of its own; ``lockstep``: the client's stream holds nothing the client has not read."""
    pool = PeakPool(limits.max_buffered_bytes)
    with trio.fail_after(TEST_DEADLINE):
        async with trio.open_nursery() as nursery:
            brokers = MemoryBrokers(nursery)
            ours, theirs = trio.testing.lockstep_stream_pair() if lockstep else trio.testing.memory_stream_pair()
            conn = ClientConnection(theirs, make_cluster(), IDENTITY, limits, pool=pool, connect_broker=brokers.connect)
            nursery.start_soon(conn.run)
            yield Client(ours), brokers, pool
            nursery.cancel_scope.cancel()


async def answer_records(req: BrokerRequest, size: int) -> None:
    """Partition 0's answer: one batch of ``size`` bytes of value."""
    part = {"partition_index": 0, "error_code": 0, "high_watermark": 1, "last_stable_offset": 1, "log_start_offset": 0,
            "aborted_transactions": None, "preferred_read_replica": -1, "records": record_batch(b"x" * size)}  # fmt: skip
    await req.answer({"throttle_time": 0, "error_code": 0, "session_id": 0, "responses": [{"topic": TOPIC, "partitions": [part]}]})


async def test_a_connection_waits_while_its_budget_is_full_and_an_oversized_request_passes_alone() -> None:
    pool = MemoryPool(1 << 40)
    budget = Budget(100, pool)
    await budget.acquire(500)  # larger than the whole budget: alone, it passes
    assert budget.used == 500 and pool.used == 500
    got = trio.Event()

    async def second() -> None:
        await budget.acquire(10)
        got.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert not got.is_set(), "read on while the connection holds more than its budget"
        budget.release(500)
        await got.wait()
    assert budget.used == 10 and pool.used == 10
    budget.add(30)  # a response: counted at once, never waited for
    budget.release_all()
    assert budget.used == 0 and pool.used == 0


async def test_the_pool_stops_heavy_connections_over_the_cap_and_wakes_them_when_bytes_go() -> None:
    pool = MemoryPool(1000)
    pool.add(1500)
    assert pool.may_read(POOL_FLOOR - 1), "a light connection is still read"
    assert not pool.may_read(POOL_FLOOR)
    woke = trio.Event()

    async def heavy() -> None:
        await pool.wait_to_read(POOL_FLOOR)
        woke.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(heavy)
        await trio.testing.wait_all_tasks_blocked()
        pool.sub(100)  # still over the cap: it keeps waiting
        await trio.testing.wait_all_tasks_blocked()
        assert not woke.is_set()
        pool.sub(500)
        await woke.wait()
    assert pool.used == 900


async def test_room_set_aside_for_answers_waits_for_what_the_connection_holds_and_is_not_in_the_pool() -> None:
    pool = MemoryPool(1 << 40)
    budget = Budget(100, pool)
    assert await budget.reserve(500, own=0) == 100, "alone, it passes: set aside up to the whole limit"
    assert budget.reserved == 100 and pool.used == 0, "set aside is not held: the pool counts bytes held"
    budget.unreserve(100)
    budget.add(10)  # the Fetch's own request
    assert await budget.reserve(90, own=10) == 90
    got = trio.Event()

    async def second() -> None:
        budget.add(5)
        await budget.reserve(60, own=5)
        got.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert not got.is_set(), "a second Fetch was let through while the first one's answers may fill the budget"
        budget.unreserve(90)
        await got.wait()
    budget.release_all()
    assert budget.used == 0 and pool.used == 0
    budget.release(7)  # an answer given back after the connection ended: already given back
    budget.add(7)
    assert budget.used == 0 and pool.used == 0


async def test_an_answer_that_comes_after_its_fetch_was_answered_is_counted_then_dropped_after_its_ttl(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with connection(Limits(fetch_ahead_bytes=0)) as (client, brokers, pool):
        await client.send(fetch(1, [0], max_wait_ms=0))
        late = await brokers.next(1)
        cid, body = await client.response(apis.FETCH, FETCH_V)
        assert cid == 1 and not body["responses"][0]["partitions"][0]["records"], "answered without the broker's answer"
        await answer_records(late, 4 * MiB)
        await trio.sleep(FETCH_AHEAD_TTL / 2)
        assert pool.used >= 4 * MiB, f"a late answer held by nobody's count ({pool.used} bytes counted)"
        await trio.sleep(FETCH_AHEAD_TTL)
        assert pool.used == 0, f"{pool.used} bytes still counted after the answer's ttl, the connection idle"
        # Gone, not only uncounted: the next Fetch asks the broker again.
        await client.send(fetch(2, [0], max_wait_ms=0))
        await answer_records(await brokers.next(1), 10)
        assert (await client.response(apis.FETCH, FETCH_V))[0] == 2
        assert brokers.count(1, apis.FETCH) == 2


async def test_a_late_answer_with_no_room_left_is_dropped_at_once(autojump_clock: trio.testing.MockClock) -> None:
    async with connection(Limits(fetch_ahead_bytes=0, max_connection_bytes=MiB)) as (client, brokers, pool):
        await client.send(fetch(1, [0], max_wait_ms=0))
        late = await brokers.next(1)
        assert (await client.response(apis.FETCH, FETCH_V))[0] == 1
        await answer_records(late, 2 * MiB)
        await trio.sleep(FETCH_AHEAD_TTL / 10)
        assert pool.used == 0 and pool.peak < 3 * MiB, "held past the connection's budget"
        # The same Fetch, well within the ttl, is not answered from what was dropped: asked afresh.
        await client.send(fetch(2, [0], max_wait_ms=0))
        await answer_records(await brokers.next(1), 10)
        cid, body = await client.response(apis.FETCH, FETCH_V)
        assert cid == 2 and len(body["responses"][0]["partitions"][0]["records"]) < 1000


async def test_a_client_that_does_not_read_its_answers_is_not_sent_more_fetches(autojump_clock: trio.testing.MockClock) -> None:
    limit, answer = 3 * MiB, 900 * 1024  # each Fetch may bring 1 MiB (its partition_max_bytes)
    async with connection(Limits(fetch_ahead_bytes=0, max_connection_bytes=limit), lockstep=True) as (client, brokers, pool):

        async def pipeline() -> None:
            for cid in range(1, 11):
                await client.send(fetch(cid, [0], max_wait_ms=5000, offset=cid))  # each asks anew

        async def broker() -> None:
            # Answers only once no more Fetches come: every Fetch read so far is in flight at once.
            while True:
                waiting = [await brokers.next(1)]
                with trio.move_on_after(1.0):
                    while True:
                        waiting.append(await brokers.next(1))
                for req in waiting:
                    await answer_records(req, answer)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipeline)
            nursery.start_soon(broker)
            await trio.sleep(10.0)
            sent = brokers.count(1, apis.FETCH)
            assert sent == 3, f"{sent} Fetches sent for a client that read none of its answers (room for 3)"
            assert pool.peak <= limit + answer, f"{pool.peak / MiB:.1f} MiB counted, over the budget and one answer"
            for cid in range(1, 11):  # the client reads: every Fetch is answered, in order
                assert (await client.response(apis.FETCH, FETCH_V))[0] == cid
            nursery.cancel_scope.cancel()
        assert brokers.count(1, apis.FETCH) == 10


def test_kept_sub_fetches_dropped_unused_go_to_on_evict_and_expire_after_their_ttl() -> None:
    answered: dict[str, float | None] = {"a": None, "b": None, "c": None}
    evicted: list[str] = []
    kept = InflightFetches[str](answered.get, ttl=1.0, on_evict=evicted.append)
    kept.record(1, "k1", "a", now=0.0)
    kept.record(1, "k2", "b", now=0.5)  # replaces a: nobody will read a's answer
    assert evicted == ["a"] and kept.kept(1, "b")
    assert kept.expires_at(1, "b") is None, "no answer yet: nothing to expire"
    answered["b"] = 2.0
    assert not kept.expire(1, "b", now=2.5) and kept.kept(1, "b")
    assert kept.expire(1, "b", now=3.0) and evicted == ["a", "b"] and not kept.holds(1)
    kept.record(2, "k3", "c", now=3.0)
    assert kept.reusable(2, "other", now=3.1, hung_after=30.0) is None  # asks otherwise: c goes
    assert evicted == ["a", "b", "c"]


def test_a_frame_skipped_unread_is_never_buffered_and_the_next_one_reads_whole() -> None:
    reader = FrameReader(min_frame_bytes=4)
    big = struct.pack(">ii", 4 + 3 * MiB, 7) + b"x" * 1000
    reader.feed(big)
    assert reader.next_frame() is None
    assert reader.frame_head(4) == (4 + 3 * MiB, struct.pack(">i", 7))
    reader.skip()
    assert reader.buffered() == 0
    reader.feed(b"y" * (3 * MiB - 1010))
    assert reader.buffered() == 0, "bytes of a skipped frame were kept"
    reader.feed(b"y" * 10 + struct.pack(">ii", 4, 8))  # its last bytes, then the next frame whole
    assert bytes(reader.next_frame() or b"") == struct.pack(">i", 8)


async def test_room_set_aside_counts_against_the_process_and_goes_back_when_a_connection_ends() -> None:
    """Answers on their way count against the process's cap too: a second connection that already expects an
    answer waits while the process has no room; a connection that ends gives back the room it had set aside."""
    pool = MemoryPool(100)
    first, second = Budget(1000, pool), Budget(1000, pool)
    assert await first.reserve(80) == 80, "alone, it passes"
    assert pool.reserved == 80 and pool.used == 0
    assert await second.reserve(15) == 15, "a connection expecting nothing passes"
    got = trio.Event()

    async def another() -> None:
        await second.reserve(50)
        got.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(another)
        await trio.testing.wait_all_tasks_blocked()
        assert not got.is_set(), "past the process's cap, a connection already expecting an answer waits"
        first.release_all()  # the first connection ends with its answer still on the way
        await got.wait()
    assert pool.reserved == 65
    first.unreserve(80)  # that answer's room, given back late: already given back
    assert pool.reserved == 65
    second.release_all()
    assert pool.reserved == 0 and pool.used == 0
