"""Produce/consume/group round trips through kfan, for every client, against both backends.

tests/test_clients.py already runs confluent-kafka, kafka-python and aiokafka
through kfan in front of the 3-broker librdkafka mock (10,000 records each).
This file adds the rest of the client x backend matrix:

- kcat (Debian's 1.7.1, librdkafka 2.0.2: an older protocol stack) against
  both the 3-broker mock (``kfan``) and Tansu (``kfan_tansu``): ``-L`` must
  show exactly one broker, kfan's address, and the topic's partitions; a
  ``-P`` produce read back by ``-C -e`` and by a ``-G`` balanced consumer group
  must give every record exactly once, in produce order per partition, and
  the group's offsets must be committed through kfan.
- confluent-kafka, kafka-python and aiokafka against Tansu: 500 keyed records
  to a 3-partition topic created through kfan, read back by a consumer group
  of the same library, offsets committed and read back through kfan.

On the mock the kcat runs reuse test_clients' records and exactly-once check
(tests/support/round_trip.py: 10,000 records, 6 partitions led by brokers
1,2,3,1,2,3). kcat is found on PATH or installed with apt
(tests/support/kcat.py); if neither works the tests fail.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from backends.mock import MockCluster
from tests.support.kcat import Consumed, Kcat, KcatUnavailable, Row, ensure_kcat
from tests.support.kfan import Kfan
from tests.support.round_trip import SESSION_MS, check_exactly_once_in_order, round_trip_records

TANSU_RECORDS = 500
TANSU_PARTITIONS = 3
_names = itertools.count(1)


def _name(prefix: str) -> str:
    return f"{prefix}{next(_names)}-{uuid.uuid4().hex[:8]}"


def keyed_records(n: int, keys: int = 50) -> list[tuple[bytes, bytes]]:
    """n records, values 0..n-1 in produce order, over ``keys`` distinct keys."""
    return [(f"key-{i % keys}".encode(), f"{i}".encode()) for i in range(n)]


def check_round_trip(consumed: list[Row], produced: list[tuple[bytes, bytes]], partitions: int) -> None:
    """consumed: (partition, offset, key, value) in consumption order. Every produced record
    exactly once, every partition used, offsets 0.. without gaps and produce order kept per
    partition, one key on one partition."""
    got = Counter((k, v) for _, _, k, v in consumed)
    want = Counter(produced)
    assert got == want, f"{sum((want - got).values())} records lost, {sum((got - want).values())} duplicated or foreign"
    order = {v: i for i, (_, v) in enumerate(produced)}
    by_partition: dict[int, list[tuple[int, int]]] = defaultdict(list)
    key_partition: dict[bytes, int] = {}
    for partition, offset, key, value in consumed:
        by_partition[partition].append((offset, order[value]))
        assert key_partition.setdefault(key, partition) == partition, f"key {key!r} on partitions {key_partition[key]} and {partition}"
    assert sorted(by_partition) == list(range(partitions)), f"records landed on {sorted(by_partition)}"
    for partition, rows in by_partition.items():
        assert [o for o, _ in rows] == list(range(len(rows))), f"partition {partition}: offsets not 0..{len(rows) - 1} in order"
        seq = [i for _, i in rows]
        assert seq == sorted(seq), f"partition {partition} lost produce order"


def end_offsets(consumed: list[Row]) -> dict[int, int]:
    """partition -> offset after the last record consumed from it."""
    ends: dict[int, int] = {}
    for partition, offset, _, _ in consumed:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    return ends


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets, read with OffsetFetch through ``bootstrap`` (no join)."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        tps = reader.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=15)
    finally:
        reader.close()
    assert all(tp.error is None for tp in tps), [tp.error for tp in tps]
    return {tp.partition: tp.offset for tp in tps}


# --- kcat, against both backends ---------------------------------------------------------


@pytest.fixture(scope="session")
def kcat() -> Kcat:
    """kcat from PATH, or installed with apt; the test fails (never skips) when neither works."""
    try:
        path = ensure_kcat()
    except KcatUnavailable as e:
        pytest.fail(str(e), pytrace=False)
    return Kcat(path)


@dataclass
class Backend:
    """One backend behind its kfan, and what a round trip through it must give."""

    name: str
    kfan: Kfan
    partitions: int
    records: list[tuple[bytes, bytes]] = field(repr=False)
    new_topic: Callable[[], str] = field(repr=False)
    check: Callable[[list[Row]], None] = field(repr=False)


def _tansu_topic(kfan: Kfan) -> str:
    """A fresh 3-partition topic on Tansu, created with CreateTopics through kfan."""
    name = _name("rt")
    admin = AdminClient({"bootstrap.servers": kfan.bootstrap})  # kept alive until the answer is in
    admin.create_topics([NewTopic(name, TANSU_PARTITIONS, 1)], operation_timeout=10)[name].result(15)
    return name


@pytest.fixture(scope="module", params=["mock", "tansu"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "mock":
        kfan: Kfan = request.getfixturevalue("kfan")
        cluster: MockCluster = request.getfixturevalue("cluster")

        def mock_topic() -> str:
            name = _name("kc")
            cluster.create_topic(name, 6)  # led by brokers 1,2,3,1,2,3, as the `topic` fixture's
            return name

        return Backend("mock", kfan, 6, round_trip_records(), mock_topic, check_exactly_once_in_order)
    kfan = request.getfixturevalue("kfan_tansu")
    records = keyed_records(TANSU_RECORDS)
    return Backend(
        "tansu",
        kfan,
        TANSU_PARTITIONS,
        records,
        lambda: _tansu_topic(kfan),
        lambda consumed: check_round_trip(consumed, records, TANSU_PARTITIONS),
    )


@dataclass
class KcatRun:
    topic: str
    consumed: Consumed


@pytest.fixture(scope="module")
def kcat_round_trip(backend: Backend, kcat: Kcat) -> KcatRun:
    """One ``kcat -P`` of the backend's records to a fresh topic, read back once by ``kcat -C -e``
    with librdkafka's per-partition Fetch logging on (``-d msg``)."""
    topic = backend.new_topic()
    kcat.produce(backend.kfan.bootstrap, topic, backend.records)
    return KcatRun(topic, kcat.consume(backend.kfan.bootstrap, topic, "-d", "msg", timeout=90))


def test_kcat_metadata_shows_only_kfan(backend: Backend, kcat: Kcat) -> None:
    topic = backend.new_topic()
    md = kcat.metadata(backend.kfan.bootstrap, topic)
    assert md["brokers"] == [{"id": 0, "name": backend.kfan.bootstrap}], md["brokers"]
    assert md["controllerid"] == 0 and md["originating_broker"]["id"] == 0
    [t] = md["topics"]
    assert t["topic"] == topic and "error" not in t, t
    assert [p["partition"] for p in t["partitions"]] == list(range(backend.partitions))
    for p in t["partitions"]:
        assert (p["leader"], p["replicas"], p["isrs"]) == (0, [{"id": 0}], [{"id": 0}]), p


def test_kcat_produce_then_consume(backend: Backend, kcat_round_trip: KcatRun) -> None:
    consumed = kcat_round_trip.consumed
    backend.check(consumed.rows)
    # -e: kcat reached the end of every partition, at the offset after its last record.
    assert consumed.eof == end_offsets(consumed.rows)


def test_kcat_fetch_answers_carry_true_high_watermarks(backend: Backend, kcat_round_trip: KcatRun) -> None:
    """Every partition of every Fetch answer kcat handled, error-free, reports the partition's
    real high watermark and last stable offset (nothing was produced meanwhile, so: its end
    offset), as the broker itself reports them. librdkafka decides end-of-partition from them."""
    consumed = kcat_round_trip.consumed
    ends = end_offsets(consumed.rows)
    fetched = consumed.fetched(kcat_round_trip.topic)
    assert {p for p, *_ in fetched} == set(ends), "kcat logged no Fetch answer for some partitions"
    wrong = Counter((p, hw, lso) for p, _, err, hw, lso in fetched if err == "Success" and (hw, lso) != (ends[p], ends[p]))
    assert not wrong, (
        f"Fetch answers with a wrong high watermark / LSO, as (partition, high watermark, LSO): count "
        f"(end offsets {ends}; {len(fetched)} partition answers; kcat took {consumed.seconds:.1f} s to reach the end): {dict(wrong)}"
    )


def test_kcat_balanced_group(backend: Backend, kcat: Kcat) -> None:
    topic = backend.new_topic()
    kcat.produce(backend.kfan.bootstrap, topic, backend.records)
    group = _name("kcat-g")
    consumed = kcat.group_consume(backend.kfan.bootstrap, group, topic, session_ms=SESSION_MS, timeout=120)
    assert consumed.assigned == set(range(backend.partitions)), consumed.stderr[-3000:]
    backend.check(consumed.rows)
    ends = end_offsets(consumed.rows)
    assert consumed.eof == ends
    # The member committed what it consumed when it left the group (OffsetCommit through kfan).
    assert committed_offsets(backend.kfan.bootstrap, group, topic, backend.partitions) == ends


# --- confluent-kafka, kafka-python, aiokafka against Tansu ----------------------------------


@pytest.fixture
def tansu_topic(kfan_tansu: Kfan) -> str:
    return _tansu_topic(kfan_tansu)


@pytest.fixture
def tansu_records() -> list[tuple[bytes, bytes]]:
    return keyed_records(TANSU_RECORDS)


def test_confluent_kafka_round_trip_tansu(kfan_tansu: Kfan, tansu_topic: str, tansu_records: list[tuple[bytes, bytes]]) -> None:
    md = AdminClient({"bootstrap.servers": kfan_tansu.bootstrap}).list_topics(tansu_topic, timeout=10)
    assert [(b.id, b.host, b.port) for b in md.brokers.values()] == [(0, kfan_tansu.host, kfan_tansu.port)]
    assert sorted(md.topics[tansu_topic].partitions) == list(range(TANSU_PARTITIONS))
    producer = Producer({"bootstrap.servers": kfan_tansu.bootstrap, "linger.ms": 5})
    failures: list[str] = []
    for key, value in tansu_records:
        producer.produce(tansu_topic, value=value, key=key, on_delivery=lambda err, msg: err and failures.append(str(err)))
        producer.poll(0)
    assert producer.flush(30) == 0
    assert failures == []
    group = _name("g")
    consumer = Consumer(
        {
            "bootstrap.servers": kfan_tansu.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": 500,
        }
    )
    consumed: list[Row] = []
    try:
        consumer.subscribe([tansu_topic])
        deadline = time.monotonic() + 60
        while len(consumed) < len(tansu_records) and time.monotonic() < deadline:
            for m in consumer.consume(500, timeout=1):
                assert m.error() is None, m.error()
                consumed.append((m.partition(), m.offset(), m.key(), m.value()))
        extra = [m for m in consumer.consume(100, timeout=2) if m.error() is None]
        assert extra == []
        assert {tp.partition for tp in consumer.assignment()} == set(range(TANSU_PARTITIONS))
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(tansu_topic, p) for p in range(TANSU_PARTITIONS)], timeout=10)
    finally:
        consumer.close()
    check_round_trip(consumed, tansu_records, TANSU_PARTITIONS)
    assert {tp.partition: tp.offset for tp in committed} == end_offsets(consumed)
    # Read back by a fresh client (OffsetFetch through kfan, after the member left).
    assert committed_offsets(kfan_tansu.bootstrap, group, tansu_topic, TANSU_PARTITIONS) == end_offsets(consumed)


def test_kafka_python_round_trip_tansu(kfan_tansu: Kfan, tansu_topic: str, tansu_records: list[tuple[bytes, bytes]]) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition

    producer = KafkaProducer(bootstrap_servers=kfan_tansu.bootstrap, linger_ms=5)
    futures = [producer.send(tansu_topic, key=k, value=v) for k, v in tansu_records]
    producer.flush(60)
    for f in futures:
        f.get(timeout=30)
    producer.close()
    group = _name("g")
    consumer = KafkaConsumer(
        tansu_topic,
        bootstrap_servers=kfan_tansu.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=500,
    )
    consumed: list[Row] = []
    try:
        deadline = time.monotonic() + 60
        while len(consumed) < len(tansu_records) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000, max_records=500).values():
                consumed.extend((r.partition, r.offset, r.key, r.value) for r in records)
        assert not any(consumer.poll(timeout_ms=2000).values())
        assert consumer.partitions_for_topic(tansu_topic) == set(range(TANSU_PARTITIONS))
        assert {tp.partition for tp in consumer.assignment()} == set(range(TANSU_PARTITIONS))
        brokers = consumer._client.cluster.brokers()
        assert [(getattr(b, "nodeId", getattr(b, "node_id", None)), b.host, b.port) for b in brokers] == [
            (0, kfan_tansu.host, kfan_tansu.port)
        ]
        consumer.commit()
        committed = {p: consumer.committed(KTopicPartition(tansu_topic, p)) for p in range(TANSU_PARTITIONS)}
    finally:
        consumer.close()
    check_round_trip(consumed, tansu_records, TANSU_PARTITIONS)
    assert committed == end_offsets(consumed)
    assert committed_offsets(kfan_tansu.bootstrap, group, tansu_topic, TANSU_PARTITIONS) == end_offsets(consumed)


def test_aiokafka_round_trip_tansu(kfan_tansu: Kfan, tansu_topic: str, tansu_records: list[tuple[bytes, bytes]]) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as ATopicPartition

    group = _name("g")

    async def run() -> tuple[list[Row], dict[int, int | None]]:
        producer = AIOKafkaProducer(bootstrap_servers=kfan_tansu.bootstrap, linger_ms=5)
        await producer.start()
        try:
            futures = [await producer.send(tansu_topic, key=k, value=v) for k, v in tansu_records]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            tansu_topic,
            bootstrap_servers=kfan_tansu.bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=500,
        )
        await consumer.start()
        consumed: list[Row] = []
        try:
            deadline = time.monotonic() + 60
            while len(consumed) < len(tansu_records) and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=1000, max_records=500)
                for records in batches.values():
                    consumed.extend((r.partition, r.offset, r.key, r.value) for r in records)
            extra = await consumer.getmany(timeout_ms=2000)
            assert not any(extra.values())
            assert consumer.partitions_for_topic(tansu_topic) == set(range(TANSU_PARTITIONS))
            assert {tp.partition for tp in consumer.assignment()} == set(range(TANSU_PARTITIONS))
            brokers = consumer._client.cluster.brokers()
            assert [(getattr(b, "nodeId", getattr(b, "node_id", None)), b.host, b.port) for b in brokers] == [
                (0, kfan_tansu.host, kfan_tansu.port)
            ]
            await consumer.commit()
            committed = {p: await consumer.committed(ATopicPartition(tansu_topic, p)) for p in range(TANSU_PARTITIONS)}
        finally:
            await consumer.stop()
        return consumed, committed

    consumed, committed = asyncio.run(run())
    check_round_trip(consumed, tansu_records, TANSU_PARTITIONS)
    assert committed == end_offsets(consumed)
    assert committed_offsets(kfan_tansu.bootstrap, group, tansu_topic, TANSU_PARTITIONS) == end_offsets(consumed)
