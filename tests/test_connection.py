"""A whole client connection (:class:`proxy.server.connection.ClientConnection`) over memory streams, on a fake clock.

The test is the client, on one end of ``trio.testing.memory_stream_pair()``;
the connection serves the other end. Its broker links reach fake brokers
(:mod:`tests.support.memory_broker`) through ``connect_broker``; the test
decides when, in what order and whether they answer. The :class:`Cluster`
is built without network: its topology and versions are set directly and its
loops never run. Time is trio's ``MockClock`` with autojump: waits for
max_wait or timeouts pass at once in wall time.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing

from backends.backoff import FAILURE_LOG_INTERVAL_S
from backends.cluster import Cluster
from proxy.core import Context, Identity, advertised_versions, plan_request
from proxy.core.topology import Broker, Topology
from proxy.kafka import apis, errors
from proxy.kafka.frames import MIN_RESPONSE_FRAME, FrameReader, frame
from proxy.kafka.headers import correlation_id_of, decode_response
from proxy.server.connection import ClientConnection, Limits
from tests.support.memory_broker import BrokerRequest, CountingStream, MemoryBrokers
from tests.support.messages import request_bytes
from tests.support.records import record_batch

IDENTITY = Identity(node_id=42, host="kfan.test", port=19092)
TOPIC = "events"
BROKERS = {1: Broker(1, "broker1.test", 9092), 2: Broker(2, "broker2.test", 9092)}
LEADERS = {TOPIC: {0: 1, 1: 2, 2: 1}}  # partition -> leading broker
LIST_OFFSETS_V, PRODUCE_V, FETCH_V = 7, 9, 12
TEST_DEADLINE = 100.0  # virtual seconds: every test here needs far less


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def make_cluster() -> Cluster:
    cluster = Cluster([("bootstrap.test", 9092)])
    cluster.topology = Topology(brokers=BROKERS, leaders=LEADERS, cluster_id="test-cluster", controller_id=1)
    cluster.api_versions = advertised_versions([])  # everything kfan knows
    return cluster


# Three zones, one broker in each; kfan runs in zone-b. Partition 0 is led by broker 1 (zone-a).
RACKED = {
    1: Broker(1, "broker1.test", 9092, "zone-a"),
    2: Broker(2, "broker2.test", 9092, "zone-b"),
    3: Broker(3, "broker3.test", 9092, "zone-c"),
}
READ_REPLICA_MAX_AGE = 60.0


def racked_cluster() -> Cluster:
    cluster = Cluster([("bootstrap.test", 9092)], rack="zone-b", read_replica_max_age=READ_REPLICA_MAX_AGE)
    isr = {TOPIC: {p: frozenset(RACKED) for p in LEADERS[TOPIC]}}
    cluster.topology = Topology(brokers=RACKED, leaders=LEADERS, cluster_id="test-cluster", controller_id=1, isr=isr)
    cluster.api_versions = advertised_versions([])  # everything kfan knows
    return cluster


# --- client requests and broker answers ---------------------------------------------------------


def list_offsets(cid: int, partitions: list[int]) -> bytes:
    topics = [{"name": TOPIC, "partitions": [{"partition_index": p, "current_leader_epoch": -1, "timestamp": -1} for p in partitions]}]
    return request_bytes(apis.LIST_OFFSETS, LIST_OFFSETS_V, {"replica_id": -1, "isolation_level": 0, "topics": topics}, cid)


def produce(cid: int, partitions: list[int], acks: int) -> bytes:
    data = [{"name": TOPIC, "partition_data": [{"index": p, "records": record_batch(b"p%d" % p)} for p in partitions]}]
    return request_bytes(apis.PRODUCE, PRODUCE_V, {"transactional_id": None, "acks": acks, "timeout": 5000, "topic_data": data}, cid)


def fetch(cid: int, partitions: list[int], max_wait_ms: int = 500, min_bytes: int = 1, offset: int = 0, rack: str = "") -> bytes:
    parts = [
        {
            "partition": p,
            "current_leader_epoch": -1,
            "fetch_offset": offset,
            "last_fetched_epoch": -1,
            "log_start_offset": -1,
            "partition_max_bytes": 1 << 20,
        }
        for p in partitions
    ]
    body = {
        "replica_id": -1,
        "max_wait": max_wait_ms,
        "min_bytes": min_bytes,
        "max_bytes": 50 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [{"topic": TOPIC, "partitions": parts}],
        "forgotten_topics_data": [],
        "rack_id": rack,
    }
    return request_bytes(apis.FETCH, FETCH_V, body, cid)


def partitions_asked(req: BrokerRequest) -> list[int]:
    if req.api_key == apis.PRODUCE:
        return [p["index"] for t in req.body["topic_data"] for p in t["partition_data"]]
    if req.api_key == apis.FETCH:
        return [p["partition"] for t in req.body["topics"] for p in t["partitions"]]
    return [p["partition_index"] for t in req.body["topics"] for p in t["partitions"]]


async def answer_list_offsets(req: BrokerRequest, offset: int) -> None:
    """Every partition asked: ``offset`` plus its index."""
    assert req.api_key == apis.LIST_OFFSETS
    parts = [
        {"partition_index": p, "error_code": 0, "timestamp": -1, "offset": offset + p, "leader_epoch": 0} for p in partitions_asked(req)
    ]
    await req.answer({"throttle_time": 0, "topics": [{"name": TOPIC, "partitions": parts}]})


async def answer_produce(req: BrokerRequest, base_offset: int) -> None:
    assert req.api_key == apis.PRODUCE
    parts = [
        {"index": p, "error_code": 0, "base_offset": base_offset, "record_errors": [], "error_message": None} for p in partitions_asked(req)
    ]
    await req.answer({"responses": [{"name": TOPIC, "partition_responses": parts}], "throttle_time": 0})


async def answer_fetch(
    req: BrokerRequest,
    high_watermark: int,
    data: bool,
    preferred_read_replica: int = -1,
    error_code: int = 0,
    last_stable_offset: int | None = None,
) -> None:
    """Every partition asked, with one record batch each when ``data``, else empty (an idle broker at max_wait)."""
    assert req.api_key == apis.FETCH
    parts = [
        {
            "partition_index": p,
            "error_code": error_code,
            "high_watermark": high_watermark + p,
            "last_stable_offset": high_watermark + p if last_stable_offset is None else last_stable_offset,
            "log_start_offset": 0,
            "aborted_transactions": None,
            "preferred_read_replica": preferred_read_replica,
            "records": record_batch(b"data%d" % p) if data else None,
        }
        for p in partitions_asked(req)
    ]
    await req.answer({"throttle_time": 0, "error_code": 0, "session_id": 0, "responses": [{"topic": TOPIC, "partitions": parts}]})


def by_partition(body: dict[str, Any], topics: str, partitions: str, index: str) -> dict[int, dict[str, Any]]:
    return {p[index]: p for t in body[topics] for p in t[partitions]}


# --- the connection under test ---------------------------------------------------------------------


class Client:
    """The client's end of the connection."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.reader = FrameReader(min_frame_bytes=MIN_RESPONSE_FRAME)

    async def send(self, payload: bytes) -> None:
        await self.stream.send_all(frame([payload]))

    async def _frame(self) -> bytes | None:
        while (payload := self.reader.next_frame()) is None:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.reader.feed(data)
        return payload

    async def response(self, api_key: int, version: int) -> tuple[int, dict[str, Any]]:
        """The next response: its correlation id and decoded body."""
        payload = await self._frame()
        assert payload is not None, "the connection closed instead of answering"
        return correlation_id_of(payload), decode_response(payload, api_key, version)

    async def silent_for(self, seconds: float) -> bool:
        """True when no response (and no close) comes within ``seconds``."""
        with trio.move_on_after(seconds):
            await self._frame()
            return False
        return True

    async def closed(self) -> bool:
        """True when the connection closed with no further response."""
        return await self._frame() is None


@dataclass
class Harness:
    client: Client
    conn: ClientConnection
    brokers: MemoryBrokers
    server: CountingStream  # the connection's end: how many bytes it read
    finished: trio.Event  # run() returned


@asynccontextmanager
async def serving(limits: Limits | None = None, cluster: Cluster | None = None) -> AsyncIterator[Harness]:
    """The connection, running; past :data:`TEST_DEADLINE` of virtual time the test fails rather than hangs."""
    with trio.fail_after(TEST_DEADLINE):
        async with trio.open_nursery() as nursery:
            brokers = MemoryBrokers(nursery)
            ours, theirs = trio.testing.memory_stream_pair()
            server = CountingStream(theirs)
            cluster = cluster or make_cluster()
            conn = ClientConnection(server, cluster, IDENTITY, limits or Limits(), connect_broker=brokers.connect)
            finished = trio.Event()

            async def run() -> None:
                await conn.run()
                finished.set()

            nursery.start_soon(run)
            yield Harness(Client(ours), conn, brokers, server, finished)
            nursery.cancel_scope.cancel()


def request_cost(payload: bytes) -> int:
    """What a request holds of the connection's byte budget while in flight (as the connection plans it)."""
    cluster = make_cluster()
    return plan_request(Context(IDENTITY, cluster.topology, cluster.api_versions), payload).cost


# --- the tests --------------------------------------------------------------------------------------


async def test_the_clock_is_virtual(autojump_clock: trio.testing.MockClock) -> None:
    assert trio.lowlevel.current_clock() is autojump_clock
    wall, virtual = time.monotonic(), trio.current_time()
    await trio.sleep(1000)
    assert trio.current_time() - virtual >= 1000
    took = time.monotonic() - wall
    print(f"1000 virtual seconds took {took:.3f} s of wall time")
    assert took < 1000, "the sleep waited in real time"


async def test_responses_in_request_order_when_brokers_answer_out_of_order(autojump_clock: trio.testing.MockClock) -> None:
    async with serving() as h:
        await h.client.send(list_offsets(1, [0]))  # broker 1
        await h.client.send(list_offsets(2, [1]))  # broker 2
        first, second = await h.brokers.next(1), await h.brokers.next(2)
        assert partitions_asked(first) == [0] and partitions_asked(second) == [1]
        await answer_list_offsets(second, 2000)  # the second request is answered first
        assert await h.client.silent_for(1.0), "a response was written before the one requested first"
        await answer_list_offsets(first, 1000)
        cid1, body1 = await h.client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V)
        cid2, body2 = await h.client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V)
        assert (cid1, cid2) == (1, 2)
        assert by_partition(body1, "topics", "partitions", "partition_index")[0]["offset"] == 1000
        assert by_partition(body2, "topics", "partitions", "partition_index")[1]["offset"] == 2001


async def test_acks_0_produce_is_forwarded_but_never_answered(autojump_clock: trio.testing.MockClock) -> None:
    async with serving() as h:
        await h.client.send(produce(1, [0], acks=0))
        await h.client.send(list_offsets(2, [0]))
        sent = await h.brokers.next(1)
        assert sent.api_key == apis.PRODUCE and sent.body["acks"] == 0 and partitions_asked(sent) == [0]
        asked = await h.brokers.next(1)
        assert asked.api_key == apis.LIST_OFFSETS
        await answer_list_offsets(asked, 10)
        cid, body = await h.client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V)
        assert cid == 2, "the acks=0 Produce was answered"
        assert by_partition(body, "topics", "partitions", "partition_index")[0]["offset"] == 10
        assert await h.client.silent_for(10.0)


async def test_reading_stops_while_requests_in_flight_are_at_the_limit(autojump_clock: trio.testing.MockClock) -> None:
    """Brokers holding every answer: the reader stops (bytes unread, nothing more forwarded); answers let it go on, in order."""
    limits = Limits(max_inflight=2)
    async with serving(limits) as h:
        requests = [list_offsets(cid, [0]) for cid in range(1, 9)]
        for payload in requests:  # one at a time: each read on its own
            await h.client.send(payload)
            await trio.sleep(0.1)
        forwarded, read = h.brokers.count(1), h.server.bytes_read
        assert forwarded < len(requests) and read < sum(len(r) + 4 for r in requests)
        await trio.sleep(5.0)
        assert (h.brokers.count(1), h.server.bytes_read) == (forwarded, read), "the reader went on without an answer"
        first = await h.brokers.next(1)
        await answer_list_offsets(first, 100)
        cid, _ = await h.client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V)
        assert cid == 1
        await trio.sleep(1.0)
        assert h.brokers.count(1) == forwarded + 1, "one answer written frees one place"
        for expected in range(2, len(requests) + 1):
            await answer_list_offsets(await h.brokers.next(1), 100 * expected)
            cid, body = await h.client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V)
            assert cid == expected
            assert by_partition(body, "topics", "partitions", "partition_index")[0]["offset"] == 100 * expected
        assert h.server.bytes_read == sum(len(r) + 4 for r in requests)


async def test_max_inflight_requests_are_forwarded_and_no_more(autojump_clock: trio.testing.MockClock) -> None:
    async with serving(Limits(max_inflight=2)) as h:
        requests = [list_offsets(cid, [0]) for cid in (1, 2, 3)]
        for payload in requests[:2]:
            await h.client.send(payload)
        held = [await h.brokers.next(1), await h.brokers.next(1)]
        await h.client.send(requests[2])
        await trio.sleep(1.0)
        assert h.brokers.count(1) == 2, "a third request was forwarded with max_inflight=2"
        await answer_list_offsets(held[0], 1)
        assert (await h.client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V))[0] == 1
        third = await h.brokers.next(1)
        assert partitions_asked(third) == [0]


async def test_reading_stops_while_the_connection_byte_budget_is_full(autojump_clock: trio.testing.MockClock) -> None:
    requests = [list_offsets(cid, [0]) for cid in (1, 2, 3)]
    cost = request_cost(requests[0])
    async with serving(Limits(max_connection_bytes=cost + cost // 2)) as h:  # one request fits, two do not
        await h.client.send(requests[0])
        first = await h.brokers.next(1)
        for payload in requests[1:]:  # one at a time: each read on its own
            await h.client.send(payload)
            await trio.sleep(0.1)
        await trio.sleep(10.0)
        assert h.brokers.count(1) == 1, "a second request was forwarded past the byte budget"
        # The second was read (its cost is known only once read) and waits; the third is left unread.
        assert h.server.bytes_read == 2 * (len(requests[0]) + 4)
        await answer_list_offsets(first, 1)
        assert (await h.client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V))[0] == 1
        second = await h.brokers.next(1)
        await trio.sleep(1.0)
        assert h.brokers.count(1) == 2
        await answer_list_offsets(second, 2)
        assert (await h.client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V))[0] == 2
        await answer_list_offsets(await h.brokers.next(1), 3)
        assert (await h.client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V))[0] == 3


async def test_drain_answers_what_was_read_then_closes(autojump_clock: trio.testing.MockClock) -> None:
    async with serving() as h:
        await h.client.send(list_offsets(1, [0]))
        await h.client.send(list_offsets(2, [1]))
        held1, held2 = await h.brokers.next(1), await h.brokers.next(2)
        h.conn.drain()
        await h.client.send(list_offsets(3, [0]))  # after the drain: never read
        await trio.sleep(5.0)
        assert not h.finished.is_set(), "the connection ended with requests unanswered"
        await answer_list_offsets(held2, 20)
        await answer_list_offsets(held1, 10)
        assert (await h.client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V))[0] == 1
        assert (await h.client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V))[0] == 2
        assert await h.client.closed(), "the connection answered a request sent after the drain"
        with trio.fail_after(1.0):
            await h.finished.wait()
        assert (h.brokers.count(1), h.brokers.count(2)) == (1, 1)


async def test_a_broker_failing_under_a_produce_fails_its_partitions_only(autojump_clock: trio.testing.MockClock) -> None:
    async with serving() as h:
        start = trio.current_time()
        await h.client.send(produce(1, [0, 1], acks=-1))
        failing, fine = await h.brokers.next(1), await h.brokers.next(2)
        await answer_produce(fine, 50)
        await failing.close_connection()  # it read the Produce: it may have written it
        cid, body = await h.client.response(apis.PRODUCE, PRODUCE_V)
        assert cid == 1
        assert trio.current_time() - start < 1.0, "the failure waited for a timeout"
        parts = by_partition(body, "responses", "partition_responses", "index")
        assert parts[0]["error_code"] == errors.REQUEST_TIMED_OUT
        assert (parts[1]["error_code"], parts[1]["base_offset"]) == (0, 50)
        # The connection goes on, over a new link to the broker that failed.
        await h.client.send(produce(2, [0], acks=-1))
        again = await h.brokers.next(1)
        assert again.connection.number == 2
        await answer_produce(again, 70)
        cid, body = await h.client.response(apis.PRODUCE, PRODUCE_V)
        assert cid == 2
        part = by_partition(body, "responses", "partition_responses", "index")[0]
        assert (part["error_code"], part["base_offset"]) == (0, 70)


async def test_a_broker_failing_under_a_fetch_answers_not_leader(autojump_clock: trio.testing.MockClock) -> None:
    async with serving() as h:
        start = trio.current_time()
        await h.client.send(fetch(1, [0], max_wait_ms=5000))
        failing = await h.brokers.next(1)
        await failing.close_connection()
        cid, body = await h.client.response(apis.FETCH, FETCH_V)
        assert cid == 1
        assert trio.current_time() - start < 1.0, "the failure waited for max_wait"
        assert by_partition(body, "responses", "partitions", "partition_index")[0]["error_code"] == errors.NOT_LEADER_OR_FOLLOWER
        await h.client.send(fetch(2, [0], max_wait_ms=5000))
        again = await h.brokers.next(1)
        assert again.connection.number == 2
        await answer_fetch(again, 10, data=True)
        cid, body = await h.client.response(apis.FETCH, FETCH_V)
        assert cid == 2
        part = by_partition(body, "responses", "partitions", "partition_index")[0]
        assert part["error_code"] == 0 and bytes(part["records"]) == record_batch(b"data0")


async def test_requests_a_failing_broker_fails_are_logged_once_per_interval(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker's failure fails every request out to it, from every client: one line stands for them."""
    caplog.set_level(logging.INFO, logger="kfan")

    async def failed_fetch(cid: int) -> None:
        await h.client.send(fetch(cid, [0], max_wait_ms=5000))
        await (await h.brokers.next(1)).close_connection()
        got, body = await h.client.response(apis.FETCH, FETCH_V)
        assert (
            got == cid
            and by_partition(body, "responses", "partitions", "partition_index")[0]["error_code"] == errors.NOT_LEADER_OR_FOLLOWER
        )
        await trio.sleep(2)  # past the reconnect backoff: the next Fetch opens a link and fails on it

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("client ") and "broker 1" in r.getMessage()]

    async with serving() as h:
        for cid in range(1, 5):
            await failed_fetch(cid)
        assert len(lines()) == 1, lines()
        await trio.sleep(FAILURE_LOG_INTERVAL_S)
        await failed_fetch(5)
    assert len(lines()) == 2 and lines()[1].endswith("(and 3 more failures since)"), lines()


def fetch_offsets(req: BrokerRequest) -> list[tuple[int, int]]:
    return [(p["partition"], p["fetch_offset"]) for t in req.body["topics"] for p in t["partitions"]]


async def test_a_broker_that_returned_records_is_sent_the_next_fetch_ahead_and_it_answers_that_fetch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving() as h:
        await h.client.send(fetch(1, [0], offset=0))
        await answer_fetch(await h.brokers.next(1), 10, data=True)  # one batch: offset 0
        cid, _ = await h.client.response(apis.FETCH, FETCH_V)
        ahead = await h.brokers.next(1)
        assert cid == 1 and fetch_offsets(ahead) == [(0, 1)], "sent before the client asks, from the offset after what it got"
        assert ahead.body["max_wait"] == 0
        batch = bytearray(record_batch(b"next"))
        struct.pack_into(">q", batch, 0, 1)  # the record at offset 1 (the base offset is outside the CRC)
        part = {"partition_index": 0, "error_code": 0, "high_watermark": 11, "last_stable_offset": 11, "log_start_offset": 0,
                "aborted_transactions": None, "preferred_read_replica": -1, "records": bytes(batch)}  # fmt: skip
        await ahead.answer({"throttle_time": 0, "error_code": 0, "session_id": 0, "responses": [{"topic": TOPIC, "partitions": [part]}]})
        await trio.sleep(0.01)
        # The client asks exactly that: answered from it, no sub-fetch for offset 1 goes out.
        await h.client.send(fetch(2, [0], offset=1))
        cid, body = await h.client.response(apis.FETCH, FETCH_V)
        answered = by_partition(body, "responses", "partitions", "partition_index")[0]
        assert cid == 2 and answered["high_watermark"] == 11 and bytes(answered["records"]) == bytes(batch)
        following = await h.brokers.next(1)
        assert fetch_offsets(following) == [(0, 2)], "the next one sent ahead, not offset 1 asked again"
        await answer_fetch(following, 12, data=False)
        # A client that asks other offsets is not answered from what was sent ahead.
        await h.client.send(fetch(3, [0], offset=0))
        asked = await h.brokers.next(1)
        assert fetch_offsets(asked) == [(0, 0)]
        await answer_fetch(asked, 13, data=True)
        cid, body = await h.client.response(apis.FETCH, FETCH_V)
        assert cid == 3 and by_partition(body, "responses", "partitions", "partition_index")[0]["high_watermark"] == 13


async def test_fetch_waits_on_an_idle_broker_only_until_its_watermarks_are_known(autojump_clock: trio.testing.MockClock) -> None:
    """Broker 1 has data at once; broker 2 (partition 1) is idle and long-polls. (Without fetching
    ahead: this client asks offset 0 every time, and the scripted broker answers requests in order.)"""
    async with serving(Limits(fetch_ahead_bytes=0)) as h:
        # 1. Nothing known of partition 1 yet: the Fetch waits for broker 2 up to max_wait (and its grace).
        start = trio.current_time()
        await h.client.send(fetch(1, [0, 1], max_wait_ms=500))
        await answer_fetch(await h.brokers.next(1), 10, data=True)
        poll_a = await h.brokers.next(2)
        cid, body = await h.client.response(apis.FETCH, FETCH_V)
        waited = trio.current_time() - start
        assert cid == 1 and 0.5 <= waited < 0.6
        parts = by_partition(body, "responses", "partitions", "partition_index")
        assert bytes(parts[0]["records"]) == record_batch(b"data0")
        assert parts[1]["error_code"] == 0 and not parts[1]["records"]

        # 2. The same Fetch: broker 2's sub-fetch still out is reused, not sent again. It comes
        # back empty inside this Fetch's max_wait: broker 2 is asked again, and its watermarks
        # now known, broker 1's data is answered without waiting for max_wait.
        start = trio.current_time()
        await h.client.send(fetch(2, [0, 1], max_wait_ms=500))
        await answer_fetch(await h.brokers.next(1), 10, data=True)
        await trio.sleep(0.1)
        assert h.brokers.count(2) == 1, "broker 2 was sent a second sub-fetch while one was out"
        await answer_fetch(poll_a, 5, data=False)
        poll_b = await h.brokers.next(2)
        assert partitions_asked(poll_b) == [1]
        cid, body = await h.client.response(apis.FETCH, FETCH_V)
        assert cid == 2 and trio.current_time() - start < 0.2
        parts = by_partition(body, "responses", "partitions", "partition_index")
        assert bytes(parts[0]["records"]) == record_batch(b"data0")
        assert not parts[1]["records"]
        assert parts[1]["high_watermark"] == 6, "partition 1 did not report the watermarks broker 2 last gave"

        # 3. Again: broker 2's second sub-fetch is reused; broker 1's data is answered at once.
        start = trio.current_time()
        await h.client.send(fetch(3, [0, 1], max_wait_ms=500))
        await answer_fetch(await h.brokers.next(1), 12, data=True)
        cid, body = await h.client.response(apis.FETCH, FETCH_V)
        assert cid == 3 and trio.current_time() - start < 0.01
        assert h.brokers.count(2) == 2, "broker 2 was asked again while its sub-fetch was out"
        parts = by_partition(body, "responses", "partitions", "partition_index")
        assert parts[0]["high_watermark"] == 12 and parts[1]["high_watermark"] == 6

        # 4. Broker 2's held sub-fetch brings data: the next Fetch gets it from there, without a new sub-fetch.
        await answer_fetch(poll_b, 7, data=True)
        await trio.sleep(0.05)
        await h.client.send(fetch(4, [0, 1], max_wait_ms=500))
        broker1 = await h.brokers.next(1)
        cid, body = await h.client.response(apis.FETCH, FETCH_V)
        assert cid == 4
        parts = by_partition(body, "responses", "partitions", "partition_index")
        assert bytes(parts[1]["records"]) == record_batch(b"data1") and parts[1]["high_watermark"] == 8
        assert h.brokers.count(2) == 2
        assert not broker1.answered


# --- preferred read replicas (KIP-392) -------------------------------------------------------------


async def leader_names_replica_in_rack(req: BrokerRequest, high_watermark: int) -> None:
    """A rack-aware leader: it names the broker in the sub-fetch's rack, with no records."""
    replica = next(b.node_id for b in RACKED.values() if b.rack == req.body["rack_id"])
    await answer_fetch(req, high_watermark, data=False, preferred_read_replica=replica)


async def follow_to_replica(h: Harness, cid: int, rack: str = "") -> None:
    """One Fetch to the leader (broker 1), which names a read replica: answered with no data and no broker named."""
    await h.client.send(fetch(cid, [0], rack=rack))
    await leader_names_replica_in_rack(await h.brokers.next(1), 10)
    got, body = await h.client.response(apis.FETCH, FETCH_V)
    part = by_partition(body, "responses", "partitions", "partition_index")[0]
    assert got == cid and part["error_code"] == 0 and not part["records"] and part["preferred_read_replica"] == -1


async def test_a_partition_goes_to_the_read_replica_its_leader_named_for_the_rack_and_a_clients_own_rack_wins(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(Limits(fetch_ahead_bytes=0), racked_cluster()) as h:
        # A client naming no rack: the sub-fetch carries kfan's; the leader names zone-b's broker 2.
        await follow_to_replica(h, 1)
        assert h.brokers.received[1][0].body["rack_id"] == "zone-b"
        await h.client.send(fetch(2, [0]))
        at_replica = await h.brokers.next(2)
        assert at_replica.api_key == apis.FETCH and at_replica.body["rack_id"] == "zone-b"
        await answer_fetch(at_replica, 10, data=True)
        cid, body = await h.client.response(apis.FETCH, FETCH_V)
        part = by_partition(body, "responses", "partitions", "partition_index")[0]
        assert cid == 2 and bytes(part["records"]) == record_batch(b"data0") and part["preferred_read_replica"] == -1
        assert h.brokers.count(1, apis.FETCH) == 1, "the leader was asked again"

        # A client naming zone-c: its own rack goes to the leader, and it reads from zone-c's broker 3, not kfan's.
        await follow_to_replica(h, 3, rack="zone-c")
        assert h.brokers.received[1][1].body["rack_id"] == "zone-c"
        await h.client.send(fetch(4, [0], rack="zone-c"))
        at_replica = await h.brokers.next(3)
        assert at_replica.body["rack_id"] == "zone-c"
        await answer_fetch(at_replica, 10, data=True)
        cid, _ = await h.client.response(apis.FETCH, FETCH_V)
        assert cid == 4 and h.brokers.count(2, apis.FETCH) == 1 and h.brokers.count(1, apis.FETCH) == 2


@pytest.mark.parametrize("failure", ["offset_out_of_range", "offset_not_available", "not_leader", "fenced_epoch", "link_closed"])
async def test_a_read_replica_that_errs_or_fails_sends_the_partition_back_to_its_leader_at_the_next_fetch(
    autojump_clock: trio.testing.MockClock, failure: str
) -> None:
    codes = {
        "offset_out_of_range": errors.OFFSET_OUT_OF_RANGE,  # a follower short of the offset (the mock's lagging follower)
        "offset_not_available": errors.OFFSET_NOT_AVAILABLE,
        "not_leader": errors.NOT_LEADER_OR_FOLLOWER,
        "fenced_epoch": errors.FENCED_LEADER_EPOCH,
    }
    async with serving(Limits(fetch_ahead_bytes=0), racked_cluster()) as h:
        await follow_to_replica(h, 1)
        await h.client.send(fetch(2, [0], offset=4))
        at_replica = await h.brokers.next(2)
        if failure == "link_closed":
            await at_replica.close_connection()
        else:
            await answer_fetch(at_replica, -1, data=False, error_code=codes[failure])
        # The client is told what the leader said last: no data yet, and asks again.
        cid, body = await h.client.response(apis.FETCH, FETCH_V)
        part = by_partition(body, "responses", "partitions", "partition_index")[0]
        assert cid == 2 and part["error_code"] == 0 and not part["records"]
        assert (part["high_watermark"], part["last_stable_offset"], part["log_start_offset"]) == (10, 10, 0)
        # Its next Fetch goes to the leader, from the same offset, and gets the data.
        await h.client.send(fetch(3, [0], offset=4))
        at_leader = await h.brokers.next(1)
        assert fetch_offsets(at_leader) == [(0, 4)]
        await answer_fetch(at_leader, 12, data=True)
        cid, body = await h.client.response(apis.FETCH, FETCH_V)
        part = by_partition(body, "responses", "partitions", "partition_index")[0]
        assert cid == 3 and bytes(part["records"]) == record_batch(b"data0") and part["high_watermark"] == 12
        assert h.brokers.count(2, apis.FETCH) == 1


async def test_a_replica_failing_before_kfan_knows_any_watermarks_is_a_retriable_error(autojump_clock: trio.testing.MockClock) -> None:
    cluster = racked_cluster()
    cluster.read_replicas.learn({("zone-b", TOPIC, 0): 2}, trio.current_time())  # another client's leader named it
    async with serving(Limits(fetch_ahead_bytes=0), cluster) as h:
        await h.client.send(fetch(1, [0]))
        await (await h.brokers.next(2)).close_connection()
        cid, body = await h.client.response(apis.FETCH, FETCH_V)
        assert by_partition(body, "responses", "partitions", "partition_index")[0]["error_code"] == errors.NOT_LEADER_OR_FOLLOWER
        await h.client.send(fetch(2, [0]))
        assert (await h.brokers.next(1)).api_key == apis.FETCH


async def test_a_read_replica_is_followed_until_its_age_then_the_leader_is_asked_again(autojump_clock: trio.testing.MockClock) -> None:
    async with serving(Limits(fetch_ahead_bytes=0), racked_cluster()) as h:
        await follow_to_replica(h, 1)
        await trio.sleep(READ_REPLICA_MAX_AGE - 1)
        await h.client.send(fetch(2, [0]))
        await answer_fetch(await h.brokers.next(2), 10, data=False)
        await h.client.response(apis.FETCH, FETCH_V)
        await trio.sleep(1)
        await h.client.send(fetch(3, [0]))
        assert (await h.brokers.next(1)).api_key == apis.FETCH, "the preference outlived its age"


@pytest.mark.parametrize("change", ["left_the_cluster", "left_the_isr"])
async def test_a_read_replica_that_left_the_cluster_or_the_isr_is_not_fetched_from(
    autojump_clock: trio.testing.MockClock, change: str
) -> None:
    cluster = racked_cluster()
    async with serving(Limits(fetch_ahead_bytes=0), cluster) as h:
        await follow_to_replica(h, 1)
        t = cluster.topology
        if change == "left_the_cluster":
            cluster.topology = Topology(
                {b: v for b, v in t.brokers.items() if b != 2}, t.leaders, t.topic_ids, t.cluster_id, t.controller_id, t.isr
            )
        else:
            cluster.topology = Topology(t.brokers, t.leaders, t.topic_ids, t.cluster_id, t.controller_id, {TOPIC: {0: frozenset({1, 3})}})
        await h.client.send(fetch(2, [0]))
        # The leader names it again: kfan does not follow (and a rack-aware Kafka leader would not name it).
        await leader_names_replica_in_rack(await h.brokers.next(1), 10)
        await h.client.response(apis.FETCH, FETCH_V)
        await h.client.send(fetch(3, [0]))
        assert (await h.brokers.next(1)).api_key == apis.FETCH
        assert h.brokers.count(2) == 0
        assert len(cluster.read_replicas) == 0


async def test_a_read_replicas_watermarks_never_say_more_is_stable_than_its_high_watermark(autojump_clock: trio.testing.MockClock) -> None:
    async with serving(Limits(fetch_ahead_bytes=0), racked_cluster()) as h:
        await follow_to_replica(h, 1)
        await h.client.send(fetch(2, [0]))
        # A lagging follower: high watermark 7, and the leader's end as its last stable offset (librdkafka's mock does this).
        await answer_fetch(await h.brokers.next(2), 7, data=True, last_stable_offset=10)
        _, body = await h.client.response(apis.FETCH, FETCH_V)
        part = by_partition(body, "responses", "partitions", "partition_index")[0]
        assert (part["high_watermark"], part["last_stable_offset"]) == (7, 7)
