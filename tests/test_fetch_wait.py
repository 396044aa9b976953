"""When a Fetch is answered: the pure :class:`proxy.core.fetch_wait.FetchWait` and
:class:`InflightFetches`, driven by hand with times passed as floats; and the
thin trio loop over them (:func:`proxy.server.gather.gather_fetch`) on trio's MockClock.

The Fetch asks partition 0 (led by broker 1) and partition 1 (broker 2), with
max_wait 0.5 s and a grace of 0.02 s for sub-fetches sent for it.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing

from backends.link import Pending
from proxy.core import (
    NOT_YET,
    Context,
    Destination,
    Failed,
    FetchAhead,
    FetchForward,
    Identity,
    Response,
    Watermarks,
    advertised_versions,
    plan_request,
)
from proxy.core.fetch import fetch_key, records_end
from proxy.core.fetch_wait import AskAgain, FetchWait, InflightFetches, Reuse
from proxy.core.layout import Layout, TopicPartition
from proxy.core.topology import Broker, Topology
from proxy.kafka import apis, errors, schema
from proxy.server.gather import gather_fetch
from tests.support.messages import answer_bytes, request_bytes
from tests.support.records import record_batch

TOPIC = "events"
FETCH_V = 12
TOPOLOGY = Topology(brokers={1: Broker(1, "broker1.test", 9092), 2: Broker(2, "broker2.test", 9092)}, leaders={TOPIC: {0: 1, 1: 2}})
IDENTITY = Identity(42, "kfan.test", 19092)
MAX_WAIT, GRACE = 0.5, 0.02
P0, P1 = (TOPIC, 0), (TOPIC, 1)
KNOWN: dict[TopicPartition, Watermarks] = {P0: (10, 10, 0), P1: (5, 5, 0)}


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def fetch_plan(
    partitions: tuple[int, ...] = (0, 1),
    min_bytes: int = 1,
    watermarks: Mapping[TopicPartition, Watermarks] | None = None,
    version: int = FETCH_V,
    max_bytes: int = 50 << 20,
    offsets: Mapping[int, int] | None = None,
    fetch_ahead_bytes: int = 0,
    topology: Topology = TOPOLOGY,
) -> FetchForward:
    parts = [{"partition": p, "fetch_offset": (offsets or {}).get(p, 0), "partition_max_bytes": 1 << 20} for p in partitions]
    body = {"max_wait": int(MAX_WAIT * 1000), "min_bytes": min_bytes, "max_bytes": max_bytes, "session_id": 0, "session_epoch": -1}
    body["topics"] = [{"topic": TOPIC, "partitions": parts}]
    payload = request_bytes(apis.FETCH, version, body, correlation_id=3)
    ctx = Context(IDENTITY, topology, advertised_versions([]), watermarks=dict(watermarks or {}), fetch_ahead_bytes=fetch_ahead_bytes)
    plan = plan_request(ctx, payload)
    assert isinstance(plan, FetchForward)
    return plan


def fetch_answer(partitions: tuple[int, ...], high_watermark: int, records: bytes | None = None, error_code: int = 0) -> Response:
    """A broker's Fetch answer: each partition with ``records`` (None: empty), its high watermark ``high_watermark + p``."""
    parts = [
        {
            "partition_index": p,
            "error_code": error_code,
            "high_watermark": high_watermark + p,
            "last_stable_offset": high_watermark + p,
            "log_start_offset": 0,
            "aborted_transactions": None,
            "preferred_read_replica": -1,
            "records": records,
        }
        for p in partitions
    ]
    body = {"throttle_time": 0, "error_code": 0, "session_id": 0, "responses": [{"topic": TOPIC, "partitions": parts}]}
    return Response(answer_bytes(apis.FETCH, FETCH_V, body))


DATA = record_batch(b"x" * 100)


def data(broker: int) -> Response:
    return fetch_answer((broker - 1,), 10, DATA)


def empty(broker: int) -> Response:
    return fetch_answer((broker - 1,), 5)


def wait_for(plan: FetchForward, outstanding: set[Destination], fresh: set[Destination], **kw: Any) -> FetchWait:
    return FetchWait(plan, 0.0, MAX_WAIT, GRACE, outstanding, fresh, **kw)


# --- FetchWait -----------------------------------------------------------------------------------


def test_nothing_in_waits_until_max_wait_then_the_grace_for_fresh_sub_fetches() -> None:
    w = wait_for(fetch_plan(watermarks=KNOWN), {1, 2}, {1, 2})
    assert w.wake_at(0.0) == MAX_WAIT
    assert w.wake_at(0.3) == MAX_WAIT
    assert w.wake_at(MAX_WAIT) == MAX_WAIT + GRACE
    assert w.wake_at(MAX_WAIT + GRACE) is None
    assert w.final() == {1: NOT_YET, 2: NOT_YET}


def test_min_bytes_met_answers_now() -> None:
    w = wait_for(fetch_plan(watermarks=KNOWN), {1, 2}, {1, 2})
    assert w.answered(1, data(1), 0.01) is None
    assert w.wake_at(0.01) is None
    assert w.final() == {1: data(1), 2: NOT_YET}


def test_min_bytes_not_met_keeps_waiting() -> None:
    w = wait_for(fetch_plan(min_bytes=10_000, watermarks=KNOWN), {1, 2}, {1, 2})
    assert w.answered(1, data(1), 0.01) is None  # about 100 bytes of records
    assert w.wake_at(0.01) == MAX_WAIT
    assert w.answered(2, data(2), 0.02) is None
    assert w.wake_at(0.02) is None  # every sub-fetch is in


def test_an_error_answers_now_whatever_min_bytes() -> None:
    w = wait_for(fetch_plan(min_bytes=10_000, watermarks=KNOWN), {1, 2}, {1, 2})
    w.answered(1, fetch_answer((0,), 0, error_code=errors.FENCED_LEADER_EPOCH), 0.01)
    assert w.wake_at(0.01) is None


def test_a_failed_broker_answers_now() -> None:
    w = wait_for(fetch_plan(min_bytes=10_000, watermarks=KNOWN), {2}, {2}, answers={1: Failed(errors.NOT_LEADER_OR_FOLLOWER)})
    assert w.wake_at(0.0) is None
    assert w.final() == {1: Failed(errors.NOT_LEADER_OR_FOLLOWER), 2: NOT_YET}


def test_data_waits_for_partitions_whose_watermarks_are_unknown() -> None:
    """At first nothing is known of the idle broker's partitions: the answer waits for all (up to max_wait)."""
    w = wait_for(fetch_plan(watermarks={P0: KNOWN[P0]}), {1, 2}, {1, 2})
    w.answered(1, data(1), 0.01)
    assert w.wake_at(0.01) == MAX_WAIT
    assert w.wake_at(MAX_WAIT) == MAX_WAIT + GRACE
    assert w.wake_at(MAX_WAIT + GRACE) is None


def test_after_max_wait_old_sub_fetches_get_no_grace() -> None:
    w = wait_for(fetch_plan(watermarks=KNOWN), {1, 2}, set())  # both still out from an earlier Fetch
    assert w.wake_at(0.2) == MAX_WAIT
    assert w.wake_at(MAX_WAIT) is None
    assert w.final() == {1: NOT_YET, 2: NOT_YET}


def test_one_fresh_sub_fetch_out_keeps_the_grace() -> None:
    w = wait_for(fetch_plan(watermarks=KNOWN), {1, 2}, {2})
    assert w.wake_at(MAX_WAIT) == MAX_WAIT + GRACE
    w.answered(2, empty(2), MAX_WAIT + 0.01)
    assert w.wake_at(MAX_WAIT + 0.01) is None  # only the old one is out now


def test_an_old_sub_fetch_back_empty_before_max_wait_is_asked_again() -> None:
    w = wait_for(fetch_plan(), {1, 2}, {1})
    again = w.answered(2, empty(2), 0.1)
    assert again == AskAgain(2, {P1: (6, 6, 0)})
    assert w.final()[2] is NOT_YET, "an answer asked again for stood as the answer"
    assert 2 not in w.outstanding
    w.asked_again(2)
    assert 2 in w.outstanding and 2 in w.fresh
    assert w.wake_at(0.1) == MAX_WAIT
    # Asked again, it is fresh: its empty answer now stands.
    assert w.answered(2, empty(2), 0.2) is None
    assert w.final()[2] == empty(2)


def test_an_old_sub_fetch_back_with_data_or_after_max_wait_stands() -> None:
    w = wait_for(fetch_plan(), {1, 2}, set())
    assert w.answered(1, data(1), 0.1) is None
    assert w.answered(2, empty(2), MAX_WAIT) is None
    assert w.final() == {1: data(1), 2: empty(2)}


def test_a_fresh_sub_fetch_back_empty_before_max_wait_stands() -> None:
    w = wait_for(fetch_plan(), {1, 2}, {1, 2})
    assert w.answered(2, empty(2), 0.1) is None
    assert w.final()[2] == empty(2)


def test_keep_when_it_cannot_be_asked_again() -> None:
    w = wait_for(fetch_plan(watermarks=KNOWN), {2}, set(), answers={1: data(1)})
    again = w.answered(2, empty(2), 0.1)
    assert isinstance(again, AskAgain)
    w.keep(2, empty(2))
    assert w.wake_at(0.1) is None
    assert w.final() == {1: data(1), 2: empty(2)}


# --- InflightFetches ------------------------------------------------------------------------------


@dataclass
class Handle:
    name: str
    done_at: float | None = None


def inflight() -> InflightFetches[Handle]:
    return InflightFetches(lambda h: h.done_at, ttl=1.0)


def test_a_sub_fetch_out_is_reused_for_the_same_key_only() -> None:
    fetches = inflight()
    assert fetches.reusable(1, "k", 0.0, 30.0) is None
    a = Handle("a")
    fetches.record(1, "k", a, 0.0)
    assert fetches.reusable(2, "k", 0.1, 30.0) is None  # another broker
    assert fetches.reusable(1, "k", 0.1, 30.0) == Reuse(a, hung=False)
    assert len(fetches) == 1
    assert fetches.reusable(1, "other", 0.2, 30.0) is None
    assert len(fetches) == 0, "a sub-fetch for other offsets was kept"
    assert fetches.reusable(1, "k", 0.3, 30.0) is None


def test_an_answered_sub_fetch_is_reused_within_its_ttl_only() -> None:
    fetches = inflight()
    a = Handle("a")
    fetches.record(1, "k", a, 0.0)
    a.done_at = 2.0
    assert fetches.reusable(1, "k", 2.9, 30.0) == Reuse(a, hung=False)
    assert fetches.reusable(1, "k", 3.0, 30.0) is None
    assert len(fetches) == 0


def test_a_sub_fetch_out_past_hung_after_is_hung_once() -> None:
    fetches = inflight()
    a = Handle("a")
    fetches.record(1, "k", a, 0.0)
    assert fetches.reusable(1, "k", 30.0, 30.0) == Reuse(a, hung=False)
    assert fetches.reusable(1, "other", 30.5, 30.0) == Reuse(a, hung=True)  # whatever it is asked for
    assert fetches.reusable(1, "k", 30.6, 30.0) is None
    b = Handle("b", done_at=1.0)  # answered: never hung however old
    fetches.record(1, "k", b, 0.0)
    assert fetches.reusable(1, "k", 1.5, 0.1) == Reuse(b, hung=False)


def test_settle_spends_answered_sub_fetches_and_keeps_those_still_out() -> None:
    fetches = inflight()
    a, b = Handle("a", done_at=0.1), Handle("b")
    fetches.record(1, "k1", a, 0.0)
    fetches.record(2, "k2", b, 0.0)
    fetches.settle({1: a, 2: b}, {1: data(1), 2: NOT_YET})
    assert fetches.reusable(1, "k1", 0.2, 30.0) is None, "a sub-fetch whose answer went to the client was reused"
    assert fetches.reusable(2, "k2", 0.2, 30.0) == Reuse(b, hung=False)


def test_settle_leaves_a_newer_sub_fetch_alone() -> None:
    fetches = inflight()
    a, b = Handle("a", done_at=0.1), Handle("b")
    fetches.record(1, "k", b, 0.2)  # recorded after `a` was used
    fetches.settle({1: a, 2: Failed(errors.NOT_LEADER_OR_FOLLOWER)}, {1: data(1), 2: Failed(errors.NOT_LEADER_OR_FOLLOWER)})
    assert fetches.reusable(1, "k", 0.3, 30.0) == Reuse(b, hung=False)


# --- the trio loop: gather_fetch ------------------------------------------------------------------


async def receive(destination: Destination, pending: Pending) -> Response:
    return Response(await pending.wait())


async def answer_later(pending: Pending, delay: float, answer: Response) -> None:
    await trio.sleep(delay)
    pending.set(bytes(answer.payload))


async def test_gather_fetch_asks_an_idle_broker_again(autojump_clock: trio.testing.MockClock) -> None:
    """Broker 2's sub-fetch, out from an earlier Fetch, comes back empty at 0.1 s: sent again, it brings data at 0.3 s."""
    plan = fetch_plan((1,))
    old, new = Pending(), Pending()
    asked: list[Destination] = []

    def ask_again(d: Destination) -> Pending | None:
        asked.append(d)
        return new

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            start = trio.current_time()
            nursery.start_soon(answer_later, old, 0.1, empty(2))
            nursery.start_soon(answer_later, new, 0.3, data(2))
            wait = FetchWait(plan, start, MAX_WAIT, GRACE, {2}, set())
            answers, used, learned = await gather_fetch(wait, {2: old}, receive, ask_again)
            took = trio.current_time() - start
    assert asked == [2]
    assert learned == {P1: (6, 6, 0)}, "the empty answer's watermarks are returned, for the connection to remember"
    assert answers == {2: data(2)}
    assert used[2] is new
    assert took == pytest.approx(0.3)


async def test_gather_fetch_keeps_the_empty_answer_when_it_cannot_ask_again(autojump_clock: trio.testing.MockClock) -> None:
    plan = fetch_plan((1,))
    old = Pending()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            start = trio.current_time()
            nursery.start_soon(answer_later, old, 0.1, empty(2))
            wait = FetchWait(plan, start, MAX_WAIT, GRACE, {2}, set())
            answers, used, _ = await gather_fetch(wait, {2: old}, receive, lambda d: None)
            took = trio.current_time() - start
    assert answers == {2: empty(2)} and used[2] is old
    assert took == pytest.approx(0.1)


async def test_gather_fetch_answers_not_yet_at_max_wait_and_grace(autojump_clock: trio.testing.MockClock) -> None:
    plan = fetch_plan((1,))
    out = Pending()  # never answered
    start = trio.current_time()
    with trio.fail_after(10):
        answers, used, _ = await gather_fetch(FetchWait(plan, start, MAX_WAIT, GRACE, {2}, {2}), {2: out}, receive, lambda d: None)
    assert answers == {2: NOT_YET} and used[2] is out
    assert trio.current_time() - start == pytest.approx(MAX_WAIT + GRACE)


def test_a_sub_fetch_stands_in_only_for_fetches_of_its_own_version() -> None:
    """An answer is read by its request's version: Fetch v0's lacks v1's throttle time, so a
    v0 sub-fetch still out cannot answer the v1 Fetch that follows with the same partitions."""
    assert fetch_plan(version=1).keys == fetch_plan(version=1).keys
    v0, v1 = fetch_plan(version=0).keys, fetch_plan(version=1).keys
    assert v0.keys() == v1.keys() and all(v0[d] != v1[d] for d in v0)


@pytest.mark.parametrize("version", [0, 2, 3, 4, FETCH_V])
def test_the_merged_fetch_keeps_the_clients_max_bytes_from_v3_and_every_message_set_before(version: int) -> None:
    """v3 brought max_bytes for the whole answer (KIP-74): the first non-empty partition goes
    whole, later ones past the budget come back empty. Before v3 each partition's bytes are
    its broker's to bound, so the merged answer carries all of them."""
    plan = fetch_plan(version=version, max_bytes=150)
    big = record_batch(b"x" * 100)  # 161 bytes: alone past the budget

    def answer(partition: int) -> Response:
        spec = schema.response_spec(apis.FETCH, version).field("responses").struct.field("partitions").struct  # type: ignore[union-attr]
        entry = {**spec.blank(), "partition_index": partition, "error_code": 0, "high_watermark": 1, "records": big}
        return Response(answer_bytes(apis.FETCH, version, {"responses": [{"topic": TOPIC, "partitions": [entry]}]}))

    body = b"".join(bytes(p) for p in plan.merge(plan, {1: answer(0), 2: answer(1)}).body)
    merged = schema.decode_body(schema.response_spec(apis.FETCH, version), body)
    records = {p["partition_index"]: bytes(p["records"] or b"") for t in merged["responses"] for p in t["partitions"]}
    assert records[0] == big, "the first non-empty partition always goes"
    assert records[1] == (big if version < 3 else b"")


# --- fetch ahead ---------------------------------------------------------------------


def batch_at(base_offset: int, value: bytes = b"x" * 100) -> bytes:
    """A one-record v2 batch at ``base_offset`` (the base offset is outside the CRC)."""
    batch = bytearray(record_batch(value))
    struct.pack_into(">q", batch, 0, base_offset)
    return bytes(batch)


def test_records_end_is_the_offset_after_the_last_whole_batch() -> None:
    two = batch_at(7) + batch_at(8)
    assert records_end(two) == 9
    assert records_end(two + batch_at(9)[:40]) == 9, "a batch cut short is asked for again"
    assert records_end(batch_at(3)[:30]) == -1 and records_end(b"") == -1 and records_end(None) == -1
    legacy = bytearray(batch_at(3))
    legacy[16] = 1
    assert records_end(bytes(legacy)) is None, "older formats are not read ahead of"


def ahead_of(plan: FetchForward, answers: Mapping[Destination, Any]) -> dict[int, tuple[Any, Any]]:
    reply = plan.merge(plan, answers)
    found = [e for e in reply.effects if isinstance(e, FetchAhead)]
    return dict(found[0].subs) if found else {}


def test_a_broker_that_returned_records_is_asked_ahead_exactly_what_the_next_fetch_will_ask() -> None:
    plan = fetch_plan(offsets={0: 7}, fetch_ahead_bytes=1 << 20)
    answers = {1: fetch_answer((0,), 10, batch_at(7) + batch_at(8)), 2: empty(2)}
    ahead = ahead_of(plan, answers)
    assert set(ahead) == {1}, "a broker that returned nothing is not asked ahead"
    sub, key = ahead[1]
    following = fetch_plan(offsets={0: 9}, fetch_ahead_bytes=1 << 20)
    assert key == following.keys[1], "kept under the key of the sub-fetch the client's next Fetch makes"
    assert key != fetch_plan(offsets={0: 8}, fetch_ahead_bytes=1 << 20).keys[1], "never stands in for other offsets"
    assert sent_partitions(plan, sub) == [(0, 9)]
    sent = schema.decode_body(schema.request_spec(apis.FETCH, FETCH_V), b"".join(bytes(p) for p in sub.tail), plan.header.body_offset - 8)
    assert sent["max_wait"] == 0, "it must not hold the broker link if the client asks otherwise"
    assert sent["max_bytes"] == (1 << 20) // 2, "the connection's budget shared by the brokers of the Fetch"


def test_the_key_of_a_sub_fetch_ignores_partition_order_and_nothing_else() -> None:
    layout = Layout.of(schema.request_spec(apis.FETCH, FETCH_V), "topics", "partitions", "partition")
    parts = [{"partition": p, "fetch_offset": 10 * p, "partition_max_bytes": 1 << 20} for p in range(3)]
    sub = {"max_wait": 0, "max_bytes": 1 << 20, "topics": [{"topic": TOPIC, "partitions": parts}],
           "forgotten_topics_data": [{"topic": "gone", "partitions": [4, 5]}], "rack_id": "a"}  # fmt: skip
    key = fetch_key(FETCH_V, sub, layout)
    rotated = {**sub, "topics": [{"topic": TOPIC, "partitions": parts[1:] + parts[:1]}]}
    assert fetch_key(FETCH_V, rotated, layout) == key, "clients rotate partitions between Fetches"
    moved = [{**parts[0], "fetch_offset": 11}, *parts[1:]]
    assert fetch_key(FETCH_V, {**sub, "topics": [{"topic": TOPIC, "partitions": moved}]}, layout) != key
    assert fetch_key(FETCH_V, {**sub, "topics": [{"topic": TOPIC, "partitions": parts[:2]}]}, layout) != key
    assert fetch_key(FETCH_V, {**sub, "forgotten_topics_data": [{"topic": "gone", "partitions": [4]}]}, layout) != key
    assert fetch_key(FETCH_V, {**sub, "rack_id": "b"}, layout) != key
    assert fetch_key(FETCH_V - 1, sub, layout) != key, "an answer is read by its request's version"


def test_no_fetch_ahead_after_an_error_or_when_turned_off() -> None:
    plan = fetch_plan(offsets={0: 7}, fetch_ahead_bytes=1 << 20)
    assert ahead_of(plan, {1: fetch_answer((0,), 10, batch_at(7), error_code=errors.NOT_LEADER_OR_FOLLOWER), 2: empty(2)}) == {}
    assert ahead_of(plan, {1: Failed(errors.NOT_LEADER_OR_FOLLOWER), 2: empty(2)}) == {}
    off = fetch_plan(offsets={0: 7})
    assert ahead_of(off, {1: fetch_answer((0,), 10, batch_at(7)), 2: empty(2)}) == {}


def sent_partitions(plan: FetchForward, sub: Any) -> list[tuple[int, int]]:
    """The (partition, fetch_offset) pairs a sub-fetch sent ahead asks, read back."""
    sent = schema.decode_body(schema.request_spec(apis.FETCH, FETCH_V), b"".join(bytes(p) for p in sub.tail), plan.header.body_offset - 8)
    return sorted((p["partition"], p["fetch_offset"]) for t in sent["topics"] for p in t["partitions"])


def test_records_the_client_budget_dropped_are_asked_again_from_the_same_offset() -> None:
    """Both partitions on one broker, a budget that keeps the first partition's records only."""
    one_leader = Topology(brokers=TOPOLOGY.brokers, leaders={TOPIC: {0: 1, 1: 1}})
    plan = fetch_plan(offsets={0: 7, 1: 3}, fetch_ahead_bytes=1 << 20, max_bytes=10, topology=one_leader)
    parts = [
        {
            "partition_index": p,
            "error_code": 0,
            "high_watermark": 20,
            "last_stable_offset": 20,
            "log_start_offset": 0,
            "aborted_transactions": None,
            "preferred_read_replica": -1,
            "records": batch_at(offset),
        }
        for p, offset in ((0, 7), (1, 3))
    ]
    body = {"responses": [{"topic": TOPIC, "partitions": parts}]}
    ((sub, _),) = ahead_of(plan, {1: Response(answer_bytes(apis.FETCH, FETCH_V, body))}).values()
    assert sent_partitions(plan, sub) == [(0, 8), (1, 3)]
