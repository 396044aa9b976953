"""An idempotent producer's batches reach a broker in the order kfan read them, whichever connection they came on.

With ``--broker-ids cluster`` a client sends a partition's Produce on the
connection of the leader it believes in; when a leader moves, batches sent to
the old leader's id and to the new one's meet at kfan, and kfan sends both to
the real leader on two links. A broker orders one connection's requests only,
so kfan holds the later batch until the earlier one is answered
(:mod:`backends.sequences`). Two whole client connections over memory
streams share one :class:`Cluster` and fake brokers (as in
``tests/test_connection.py``); the test decides when the broker answers.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from backends import sequences
from backends.backoff import FAILURE_LOG_INTERVAL_S
from backends.cluster import Cluster
from backends.pending import Pending
from backends.sequences import KEPT_S, ProducerSequences, Turn, out_of_order, wait_for
from proxy.core import Context, Forward, ProducerBatchesNotSent, plan_request
from proxy.core.topology import Topology
from proxy.kafka import apis, errors
from proxy.kafka.records import record_batch
from proxy.server.connection import ClientConnection, Limits
from tests.support.core_inputs import ALL_VERSIONS
from tests.support.core_inputs import IDENTITY as CORE_IDENTITY
from tests.support.memory_broker import BrokerRequest, MemoryBrokers
from tests.support.messages import request_bytes
from tests.test_connection import (
    BROKERS,
    IDENTITY,
    LEADERS,
    PRODUCE_V,
    TEST_DEADLINE,
    TOPIC,
    Client,
    answer_produce,
    by_partition,
    make_cluster,
)

PID = 4711


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def produce(cid: int, batches: dict[int, tuple[int, int]], epoch: int = 0, timeout_ms: int = 5000) -> bytes:
    """acks=all; per partition, one record from (producer id, base sequence) of producer ``epoch``, -1: no producer."""
    data = [
        {
            "name": TOPIC,
            "partition_data": [
                {"index": p, "records": record_batch([b"v"], of_producer=(pid, epoch, seq))} for p, (pid, seq) in batches.items()
            ],
        }
    ]
    return request_bytes(apis.PRODUCE, PRODUCE_V, {"transactional_id": None, "acks": -1, "timeout": timeout_ms, "topic_data": data}, cid)


def base_sequences(req: BrokerRequest) -> dict[int, int]:
    out = {}
    for t in req.body["topic_data"]:
        for p in t["partition_data"]:
            out[p["index"]] = int.from_bytes(bytes(p["records"])[53:57], "big", signed=True)
    return out


@asynccontextmanager
async def two_clients() -> AsyncIterator[tuple[Client, Client, MemoryBrokers, Cluster]]:
    """Two client connections of one kfan process (one cluster view, one set of brokers)."""
    with trio.fail_after(TEST_DEADLINE):
        async with trio.open_nursery() as nursery:
            brokers = MemoryBrokers(nursery)
            cluster = make_cluster()
            clients = []
            for _ in range(2):
                ours, theirs = trio.testing.memory_stream_pair()
                nursery.start_soon(ClientConnection(theirs, cluster, IDENTITY, Limits(), connect_broker=brokers.connect).run)
                clients.append(Client(ours))
            yield clients[0], clients[1], brokers, cluster
            nursery.cancel_scope.cancel()


async def produced(client: Client, cid: int) -> dict[int, int]:
    got, body = await client.response(apis.PRODUCE, PRODUCE_V)
    assert got == cid
    return {p: r["error_code"] for p, r in by_partition(body, "responses", "partition_responses", "index").items()}


async def test_a_later_batch_on_another_connection_waits_for_the_earlier_answer(autojump_clock: trio.testing.MockClock) -> None:
    async with two_clients() as (a, b, brokers, _):
        await a.send(produce(1, {0: (PID, 0)}))  # partition 0: broker 1
        first = await brokers.next(1)
        await b.send(produce(2, {0: (PID, 1)}))
        await trio.sleep(sequences.HOLD_S - 1)
        assert brokers.count(1, apis.PRODUCE) == 1, "the later batch reached the broker before the earlier one was answered"
        await answer_produce(first, 0)
        second = await brokers.next(1)
        assert second.connection is not first.connection and base_sequences(second) == {0: 1}
        await answer_produce(second, 1)
        assert await produced(a, 1) == {0: errors.NONE}
        assert await produced(b, 2) == {0: errors.NONE}


async def test_other_producers_partitions_and_the_same_connection_do_not_wait(autojump_clock: trio.testing.MockClock) -> None:
    async with two_clients() as (a, b, brokers, _):
        await a.send(produce(1, {0: (PID, 0)}))  # the producer's first batch on a's link: answered first (see the next test)
        await answer_produce(await brokers.next(1), 0)
        assert await produced(a, 1) == {0: errors.NONE}
        await a.send(produce(2, {0: (PID, 1)}))
        first = await brokers.next(1)
        await a.send(produce(3, {0: (PID, 2)}))  # the same link: the broker keeps this order itself
        await b.send(produce(4, {0: (PID + 1, 0)}))  # another producer
        await b.send(produce(5, {2: (PID, 0)}))  # another partition (broker 1 too)
        await b.send(produce(6, {0: (-1, -1)}))  # no producer id: nothing to order
        others = [await brokers.next(1) for _ in range(4)]
        assert not first.answered, "nothing was answered: none of them waited"
        assert sorted(base_sequences(r).popitem() for r in others) == [(0, -1), (0, 0), (0, 2), (2, 0)]
        for n, req in enumerate([first, *others]):
            await answer_produce(req, n + 1)
        for client, cid, partition in ((a, 2, 0), (a, 3, 0), (b, 4, 0), (b, 5, 2), (b, 6, 0)):
            assert await produced(client, cid) == {partition: errors.NONE}


async def the_next_held_then_refused(first: BrokerRequest, client: Client, brokers: MemoryBrokers, cids: tuple[int, int]) -> None:
    """The client pipelines sequence 1 behind ``first`` (sequence 0, out at broker 1, request ``cids[0]``): it is
    held until the broker refuses ``first`` as not the leader, then answered as not written, never sent."""
    sent = brokers.count(1, apis.PRODUCE)
    await client.send(produce(cids[1], {0: (PID, 1)}))
    await trio.sleep(1.0)
    assert brokers.count(1, apis.PRODUCE) == sent, "the next batch went out before the one before it was answered"
    await answer_refused(first, errors.NOT_LEADER_OR_FOLLOWER)
    assert await produced(client, cids[0]) == {0: errors.NOT_LEADER_OR_FOLLOWER}
    assert await produced(client, cids[1]) == {0: errors.NOT_LEADER_OR_FOLLOWER}, "written, it would be taken as the producer's first"
    assert brokers.count(1, apis.PRODUCE) == sent


async def test_a_producers_first_batch_on_a_link_holds_back_the_next_there(autojump_clock: trio.testing.MockClock) -> None:
    """A broker that kfan knows as the new leader before it knows it itself refuses the first batch, and may take
    the next as the producer's first a moment later: the first, sent again, would then fail for good."""
    async with two_clients() as (a, _, brokers, _):
        await a.send(produce(1, {0: (PID, 0)}))
        await the_next_held_then_refused(await brokers.next(1), a, brokers, (1, 2))
        await a.send(produce(3, {0: (PID, 0)}))  # the client sends both again, in order: the first opens the link again
        again = await brokers.next(1)
        await a.send(produce(4, {0: (PID, 1)}))
        await trio.sleep(1.0)
        assert brokers.count(1, apis.PRODUCE) == 2
        await answer_produce(again, 0)
        await answer_produce(await brokers.next(1), 1)
        assert await produced(a, 3) == {0: errors.NONE}
        assert await produced(a, 4) == {0: errors.NONE}


async def test_while_the_broker_refuses_the_first_batch_the_next_waits_for_each_retry(autojump_clock: trio.testing.MockClock) -> None:
    """The first batch goes alone and is refused (the broker is not yet the leader); the client sends it again with
    the next pipelined behind it. The broker may refuse the retry too and, a moment later, take the next as the
    producer's first: the next waits for the retry's answer. Once the broker has written one, the link is the
    producer's, and the batches after go on at once."""
    async with two_clients() as (a, _, brokers, _):
        await a.send(produce(1, {0: (PID, 0)}))
        await answer_refused(await brokers.next(1), errors.NOT_LEADER_OR_FOLLOWER)
        assert await produced(a, 1) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        await a.send(produce(2, {0: (PID, 0)}))  # sent again, the next pipelined behind it
        await the_next_held_then_refused(await brokers.next(1), a, brokers, (2, 3))
        await a.send(produce(4, {0: (PID, 0)}))  # both again, in order
        written = await brokers.next(1)
        await a.send(produce(5, {0: (PID, 1)}))
        await trio.sleep(1.0)
        assert brokers.count(1, apis.PRODUCE) == 3
        await answer_produce(written, 0)
        second = await brokers.next(1)
        await a.send(produce(6, {0: (PID, 2)}))  # the broker wrote the first: it keeps this order itself
        third = await brokers.next(1)
        assert not second.answered and base_sequences(third) == {0: 2}, "the batch after a written one waited"
        await answer_produce(second, 1)
        await answer_produce(third, 2)
        assert [await produced(a, cid) for cid in (4, 5, 6)] == [{0: errors.NONE}] * 3


async def test_a_split_produce_waits_only_where_its_producer_has_a_batch_out(autojump_clock: trio.testing.MockClock) -> None:
    async with two_clients() as (a, b, brokers, _):
        await a.send(produce(1, {0: (PID, 0)}))  # broker 1
        first = await brokers.next(1)
        await b.send(produce(2, {1: (PID, 0), 0: (PID, 1)}))  # partition 1 to broker 2 (free), partition 0 to broker 1 (waits)
        on_two = await brokers.next(2)
        assert base_sequences(on_two) == {1: 0}
        await trio.sleep(sequences.HOLD_S - 1)
        assert brokers.count(1, apis.PRODUCE) == 1
        await answer_produce(on_two, 0)
        await answer_produce(first, 0)
        await answer_produce(await brokers.next(1), 1)
        assert await produced(a, 1) == {0: errors.NONE}
        assert await produced(b, 2) == {0: errors.NONE, 1: errors.NONE}


async def test_a_batch_held_past_its_deadline_is_retriable_and_never_sent(autojump_clock: trio.testing.MockClock) -> None:
    async with two_clients() as (a, b, brokers, _):
        await a.send(produce(1, {0: (PID, 0)}))
        first = await brokers.next(1)  # never answered
        await b.send(produce(2, {0: (PID, 1)}))
        assert await produced(b, 2) == {0: errors.NOT_LEADER_OR_FOLLOWER}, "not written: the client sends it again"
        assert brokers.count(1, apis.PRODUCE) == 1, "the held batch was sent after all"
        assert not first.answered


async def test_a_batch_held_for_the_bound_is_retriable_and_its_connection_goes_on(autojump_clock: trio.testing.MockClock) -> None:
    """The earlier batch waits at its leader (acks=all, a dead follower still in the ISR): the later one is held
    :data:`~backends.sequences.HOLD_S`, not until its own 30 s timeout, since its connection's later answers (a
    Metadata among them) wait behind it, and Kafka's clients give up on a request after 30 s."""
    async with two_clients() as (a, b, brokers, _):
        await a.send(produce(1, {0: (PID, 0)}, timeout_ms=30_000))
        first = await brokers.next(1)
        start = trio.current_time()
        await b.send(produce(2, {0: (PID, 1)}, timeout_ms=30_000))
        await b.send(request_bytes(apis.API_VERSIONS, 0, {}, 3))
        assert await produced(b, 2) == {0: errors.NOT_LEADER_OR_FOLLOWER}, "not written: the client sends it again"
        assert (await b.response(apis.API_VERSIONS, 0))[0] == 3
        assert trio.current_time() - start == pytest.approx(sequences.HOLD_S), "the connection waited past the bound"
        await b.send(produce(4, {0: (PID, 1)}, timeout_ms=30_000))  # sent again while the earlier is still out
        await trio.sleep(sequences.HOLD_S - 1)
        assert brokers.count(1, apis.PRODUCE) == 1, "sent again ahead of the batch it waited for"
        await answer_produce(first, 0)
        assert await produced(a, 1) == {0: errors.NONE}
        again = await brokers.next(1)
        assert base_sequences(again) == {0: 1}
        await answer_produce(again, 1)
        assert await produced(b, 4) == {0: errors.NONE}


async def test_the_batch_after_one_held_for_the_bound_is_refused_at_once(autojump_clock: trio.testing.MockClock) -> None:
    """The client sends the held batch again, so the next is out of order whatever the earlier one's answer: held
    again meanwhile, each request a client pipelines would add a bound to the wait of every answer after it."""
    async with two_clients() as (a, b, brokers, _):
        await a.send(produce(1, {0: (PID, 0)}, timeout_ms=30_000))
        await brokers.next(1)  # out until the test ends
        await b.send(produce(2, {0: (PID, 1)}, timeout_ms=30_000))
        await b.send(produce(3, {0: (PID, 2)}, timeout_ms=30_000))  # pipelined behind it
        start = trio.current_time()
        assert await produced(b, 2) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        assert await produced(b, 3) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        assert trio.current_time() - start == pytest.approx(sequences.HOLD_S), "the next batch was held again"
        assert brokers.count(1, apis.PRODUCE) == 1


async def test_the_retry_of_a_batch_held_for_the_bound_is_not_sent_when_the_earlier_was_not_written(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with two_clients() as (a, b, brokers, _):
        await a.send(produce(1, {0: (PID, 0)}, timeout_ms=30_000))
        first = await brokers.next(1)
        await b.send(produce(2, {0: (PID, 1)}, timeout_ms=30_000))
        assert await produced(b, 2) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        await b.send(produce(3, {0: (PID, 1)}, timeout_ms=30_000))
        await trio.sleep(1.0)
        await answer_refused(first, errors.NOT_ENOUGH_REPLICAS)
        assert await produced(a, 1) == {0: errors.NOT_ENOUGH_REPLICAS}
        assert await produced(b, 3) == {0: errors.NOT_LEADER_OR_FOLLOWER}, "written first, it would fail the earlier for good"
        assert brokers.count(1, apis.PRODUCE) == 1


async def answer_refused(req: BrokerRequest, code: int) -> None:
    parts = [{"index": p, "error_code": code, "base_offset": -1, "record_errors": [], "error_message": None} for p in base_sequences(req)]
    await req.answer({"responses": [{"name": TOPIC, "partition_responses": parts}], "throttle_time": 0})


async def test_a_later_batch_is_not_sent_when_the_earlier_was_not_written(autojump_clock: trio.testing.MockClock) -> None:
    async with two_clients() as (a, b, brokers, _):
        await a.send(produce(1, {0: (PID, 0)}))
        first = await brokers.next(1)
        await b.send(produce(2, {0: (PID, 1)}))
        await trio.sleep(1.0)
        await answer_refused(first, errors.NOT_LEADER_OR_FOLLOWER)
        assert await produced(a, 1) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        assert await produced(b, 2) == {0: errors.NOT_LEADER_OR_FOLLOWER}, "written first, it would fail the earlier batch for good"
        assert brokers.count(1, apis.PRODUCE) == 1
        await b.send(produce(3, {0: (PID, 2)}))  # later still: held back too, the earlier is not yet written
        assert await produced(b, 3) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        await a.send(produce(4, {0: (PID, 0)}))  # the client sends them again, in order
        again = await brokers.next(1)
        assert base_sequences(again) == {0: 0}
        await b.send(produce(5, {0: (PID, 1)}))
        await trio.sleep(1.0)
        assert brokers.count(1, apis.PRODUCE) == 2
        await answer_produce(again, 0)
        await answer_produce(await brokers.next(1), 1)
        assert await produced(a, 4) == {0: errors.NONE}
        assert await produced(b, 5) == {0: errors.NONE}
        await b.send(produce(6, {0: (PID + 1, 5)}))  # another producer: never held back by this one's
        await answer_produce(await brokers.next(1), 2)
        assert await produced(b, 6) == {0: errors.NONE}


async def test_batches_held_back_are_logged_once_per_interval(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A leader's move holds back every idempotent producer's pipelined batches at once: one line stands for them."""
    caplog.set_level(logging.INFO, logger="kfan")

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if "a Produce not sent" in r.getMessage()]

    async with two_clients() as (a, b, brokers, _):
        await a.send(produce(1, {0: (PID, 0)}))
        await answer_refused(await brokers.next(1), errors.NOT_LEADER_OR_FOLLOWER)
        assert await produced(a, 1) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        for cid in (2, 3, 4):  # later batches while the first is not written: none is sent
            await b.send(produce(cid, {0: (PID, cid - 1)}))
            assert await produced(b, cid) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        assert len(lines()) == 1, lines()
        await trio.sleep(FAILURE_LOG_INTERVAL_S)
        await b.send(produce(5, {0: (PID, 4)}))
        assert await produced(b, 5) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        assert brokers.count(1, apis.PRODUCE) == 1
    assert len(lines()) == 2 and lines()[1].endswith("(and 2 more failures since)"), lines()


async def test_a_batch_refused_for_good_does_not_hold_back_the_next(autojump_clock: trio.testing.MockClock) -> None:
    """The client does not send a batch refused with an error it does not retry: the next goes on, as to a broker."""
    async with two_clients() as (a, b, brokers, _):
        await a.send(produce(1, {0: (PID, 0)}))
        await answer_refused(await brokers.next(1), errors.INVALID_RECORD)
        assert await produced(a, 1) == {0: errors.INVALID_RECORD}
        await b.send(produce(2, {0: (PID, 1)}))
        await answer_produce(await brokers.next(1), 0)
        assert await produced(b, 2) == {0: errors.NONE}


async def test_a_new_producer_epoch_starts_afresh(autojump_clock: trio.testing.MockClock) -> None:
    async with two_clients() as (a, b, brokers, _):
        await a.send(produce(1, {0: (PID, 7)}))
        await answer_refused(await brokers.next(1), errors.NOT_LEADER_OR_FOLLOWER)
        assert await produced(a, 1) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        await b.send(produce(2, {0: (PID, 0)}, epoch=1))  # the producer bumped its epoch (KIP-360): sequences restart
        await answer_produce(await brokers.next(1), 0)
        assert await produced(b, 2) == {0: errors.NONE}


async def test_one_connection_whose_partition_moved_keeps_its_order(autojump_clock: trio.testing.MockClock) -> None:
    """kfan's view of the leader changes between two requests of one connection: the earlier went to the old leader."""
    async with two_clients() as (a, _, brokers, cluster):
        await a.send(produce(1, {0: (PID, 0)}))
        first = await brokers.next(1)
        cluster.topology = Topology(brokers=BROKERS, leaders={TOPIC: {**LEADERS[TOPIC], 0: 2}}, cluster_id="test-cluster", controller_id=1)
        await a.send(produce(2, {0: (PID, 1)}))
        await trio.sleep(1.0)
        assert brokers.count(2, apis.PRODUCE) == 0, "sent to the new leader before the old one answered the earlier batch"
        await answer_refused(first, errors.NOT_LEADER_OR_FOLLOWER)
        assert await produced(a, 1) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        assert await produced(a, 2) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        assert brokers.count(2, apis.PRODUCE) == 0


async def test_after_one_held_past_its_deadline_the_next_on_that_link_is_not_sent(autojump_clock: trio.testing.MockClock) -> None:
    async with two_clients() as (a, b, brokers, _):
        await a.send(produce(1, {0: (PID, 0)}))
        await brokers.next(1)  # never answered
        await b.send(produce(2, {0: (PID, 1)}))
        assert await produced(b, 2) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        await b.send(produce(3, {0: (PID, 2)}))  # b's link: its own earlier batch was never sent
        assert await produced(b, 3) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        assert brokers.count(1, apis.PRODUCE) == 1


async def test_a_first_batch_answered_for_want_of_a_leader_holds_back_the_next(autojump_clock: trio.testing.MockClock) -> None:
    """kfan knows no leader for the partition when the producer's first batch comes, and finds it before the
    next: that one, written, would be taken as the producer's first, and the first would fail for good."""
    async with two_clients() as (a, _, brokers, cluster):
        cluster.topology = Topology(brokers=BROKERS, leaders={TOPIC: {**LEADERS[TOPIC], 0: 9}}, cluster_id="test-cluster", controller_id=1)
        await a.send(produce(1, {0: (PID, 0)}))
        assert await produced(a, 1) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        cluster.topology = Topology(brokers=BROKERS, leaders=LEADERS, cluster_id="test-cluster", controller_id=1)
        await a.send(produce(2, {0: (PID, 1)}))  # pipelined by the client before the first was answered
        assert await produced(a, 2) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        assert brokers.count(1, apis.PRODUCE) == 0, "the later batch was written before the earlier one"
        await a.send(produce(3, {0: (PID, 0)}))  # the client sends both again, in order
        await answer_produce(await brokers.next(1), 0)
        assert await produced(a, 3) == {0: errors.NONE}
        await a.send(produce(4, {0: (PID, 1)}))
        await answer_produce(await brokers.next(1), 1)
        assert await produced(a, 4) == {0: errors.NONE}


async def test_a_first_batch_whose_leader_is_down_holds_back_the_next_to_a_new_leader(autojump_clock: trio.testing.MockClock) -> None:
    """The leader is down and kfan backs off from it: the first batch waits for the backoff, and the broker
    leaves the cluster meanwhile (fenced, Metadata no longer lists it), so the batch is not sent. A new leader
    is elected, and the next batch, pipelined behind the first, is for it."""
    async with two_clients() as (a, b, brokers, cluster):
        brokers.refusing.add(1)
        await b.send(produce(9, {0: (-1, -1)}))  # another client's request finds broker 1 down: kfan backs off
        assert await produced(b, 9) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        await a.send(produce(1, {0: (PID, 0)}))
        await a.send(produce(2, {0: (PID, 1)}))
        await trio.sleep(0.01)  # the first waits out kfan's backoff from broker 1
        fenced = {n: broker for n, broker in BROKERS.items() if n != 1}
        cluster.topology = Topology(brokers=fenced, leaders={TOPIC: {0: 2, 1: 2, 2: 2}}, cluster_id="test-cluster", controller_id=2)
        assert await produced(a, 1) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        assert await produced(a, 2) == {0: errors.NOT_LEADER_OR_FOLLOWER}
        assert brokers.count(2, apis.PRODUCE) == 0, "the later batch was written at the new leader before the earlier one"
        await a.send(produce(3, {0: (PID, 0)}))  # the client sends both again, in order
        again = await brokers.next(2)
        assert base_sequences(again) == {0: 0}
        await answer_produce(again, 0)
        assert await produced(a, 3) == {0: errors.NONE}


def test_the_core_hands_over_the_idempotent_batches_it_answers_itself() -> None:
    """What the planner answers for want of a leader, it names for the table (applied before the next request is
    planned); batches it sends, and batches of no producer, it does not."""
    topology = Topology(brokers=BROKERS, leaders={TOPIC: {0: 1, 1: 9, 2: 9}}, cluster_id="test-cluster", controller_id=1)
    ctx = Context(CORE_IDENTITY, topology, ALL_VERSIONS)
    plan = plan_request(ctx, produce(1, {0: (PID, 0), 1: (PID, 3), 2: (-1, -1)}, epoch=2))
    assert isinstance(plan, Forward) and set(plan.subs) == {1}
    assert plan.at_plan == [ProducerBatchesNotSent({(PID, TOPIC, 1): (2, 3)})]
    routed = plan_request(dataclasses.replace(ctx, topology=make_cluster().topology), produce(2, {0: (PID, 0), 1: (PID, 3)}))
    assert isinstance(routed, Forward) and routed.at_plan == []


# --- the bookkeeping alone ---------------------------------------------------------------------


def never_written(_: bytes | memoryview) -> set[tuple[str, int]] | None:
    return {(TOPIC, 0)}


def all_written(_: bytes | memoryview) -> set[tuple[str, int]] | None:
    return set()


async def test_turns_wait_for_other_links_until_answered(autojump_clock: trio.testing.MockClock) -> None:
    seqs = ProducerSequences()
    link_a, link_b = object(), object()
    key = (PID, TOPIC, 0)
    first, before = seqs.take_turn({key: (0, 0)}, link_a, all_written)
    assert before == []
    pending_first = Pending()
    first.sent(pending_first)
    second, before = seqs.take_turn({key: (0, 1)}, link_a, all_written)
    assert before == [(key, first)], "the producer's first batch on this link: the next there waits for its answer"
    pending_first.set(b"answer")  # the second went once the first was answered, and the first was written
    second.sent(Pending())
    same, before = seqs.take_turn({key: (0, 2)}, link_a, all_written)
    assert before == [], "in flight on the same link after one written: the broker keeps that order"
    pending = Pending()
    same.sent(pending)
    other, before = seqs.take_turn({key: (0, 3)}, link_b, all_written)
    assert before == [(key, same)], "the latest turn is the one to wait for"
    assert not await wait_for(before, trio.current_time() + 1.0), "over before its answer came"
    pending.set(b"answer")
    assert await wait_for(before, trio.current_time() + 1.0)
    assert not out_of_order(other, before), "the earlier batch was written"
    other.sent(None)
    later, before = seqs.take_turn({key: (0, 4)}, link_a, all_written)
    assert out_of_order(later, before), "the turn before was never sent"
    later.sent(None)
    retried, before = seqs.take_turn({key: (0, 3)}, link_a, all_written)
    assert before == [(key, later)], "kfan did not send the one before on this link"
    assert not out_of_order(retried, before), "an earlier sequence again: the client's retry"
    accepted = Pending()
    accepted.set(b"answer")
    retried.sent(accepted)
    after, before = seqs.take_turn({key: (0, 4)}, link_a, never_written)
    assert before == [(key, retried)], "the one before opened the link again: the turn before it was not sent"
    refused = Pending()
    refused.set(b"refused")
    after.sent(refused)
    _, before = seqs.take_turn({key: (0, 5)}, link_a, never_written)
    assert before == [], "on the same link the broker refuses the later batch itself: no answer is read"


async def test_a_turn_after_a_refused_opening_one_opens_the_link_too() -> None:
    seqs = ProducerSequences()
    link = object()
    key = (PID, TOPIC, 0)
    opening, _ = seqs.take_turn({key: (0, 0)}, link, never_written)
    refused = Pending()
    opening.sent(refused)
    retry, before = seqs.take_turn({key: (0, 0)}, link, never_written)
    assert before == [(key, opening)]
    _, before = seqs.take_turn({key: (0, 1)}, link, all_written)
    assert before == [(key, retry)], "the opening turn is not answered yet: the retry may be the producer's first"
    refused.set(b"refused")
    retry.sent(Pending())
    again, _ = seqs.take_turn({key: (0, 0)}, object(), never_written)  # a turn on another link opens that one
    answered = Pending()
    answered.set(b"answer")
    again.sent(answered)
    after, before = seqs.take_turn({key: (0, 1)}, again.link, all_written)
    assert before == [(key, again)] and after.follows == {key: again}
    after.sent(Pending())
    _, before = seqs.take_turn({key: (0, 2)}, again.link, all_written)
    assert before == [(key, after)], "the opening turn was refused: the one after it may be the producer's first"
    assert after.follows == {}, "a turn no longer the latest lets go of the one it followed"


async def test_a_turn_not_yet_sent_is_waited_for() -> None:
    seqs = ProducerSequences()
    key = (PID, TOPIC, 0)
    waiting, _ = seqs.take_turn({key: (0, 0)}, object(), all_written)
    _, before = seqs.take_turn({key: (0, 1)}, object(), all_written)
    assert before == [(key, waiting)]
    done = trio.Event()

    async def waiter() -> None:
        await wait_for(before, trio.current_time() + 10.0)
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(0.05)
        assert not done.is_set()
        waiting.sent(None)
        await done.wait()


def answered_turn(seqs: ProducerSequences, key: tuple[int, str, int], link: object) -> Turn:
    turn, _ = seqs.take_turn({key: (0, 0)}, link, all_written)
    answered = Pending()
    answered.set(b"answer")
    turn.sent(answered)
    return turn


async def test_the_table_keeps_turns_in_progress_and_recent_ones(autojump_clock: trio.testing.MockClock) -> None:
    seqs = ProducerSequences()
    link = object()
    live: list[Turn] = []
    for n in range(3 * ProducerSequences.SWEEP_FROM):
        if n % 100 == 0:
            live.append(seqs.take_turn({(n, TOPIC, 0): (0, 0)}, link, all_written)[0])  # never settled
        else:
            answered_turn(seqs, (n, TOPIC, 0), link)
    assert len(seqs) == 3 * ProducerSequences.SWEEP_FROM, "a recent turn was forgotten"
    await trio.sleep(KEPT_S + 1)
    size = len(seqs)
    for n in range(2 * size):
        answered_turn(seqs, (-n - 1, TOPIC, 0), link)
        if len(seqs) < size + n + 1:
            break  # swept
    # Kept: the turns in progress, and those taken since the sleep (recent).
    assert len(seqs) == len(live) + n + 1, "a sweep after their time kept turns over"


async def test_the_table_keeps_at_most_max_kept_turns_over(autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sequences, "MAX_KEPT", 1500)
    seqs = ProducerSequences()
    link = object()
    for n in range(10 * ProducerSequences.SWEEP_FROM):
        answered_turn(seqs, (n, TOPIC, 0), link)
        assert len(seqs) <= 2 * 1500 + 1, f"{len(seqs)} turns kept"
    newest = answered_turn(seqs, (-1, TOPIC, 0), link)
    assert seqs.take_turn({(-1, TOPIC, 0): (0, 1)}, object(), all_written)[1] == [((-1, TOPIC, 0), newest)], "the newest was forgotten"
