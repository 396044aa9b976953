"""Round trips through kfan: the records, one produce-then-consume routine per client
library, and the checks on what came back.

Each routine (:data:`ROUND_TRIPS`, and :func:`kcat_round_trip`) produces the
records given to a topic, then reads them back as the only member of a fresh
consumer group of the same library, and reports what the client saw as a
:class:`Trip`; the test asserts on it. Routines assert only that the producer
delivered everything.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.support.client_security import PLAINTEXT, ClientSecurity
from tests.support.kcat import Kcat, Row
from tests.support.waiting import wait_for

N = 10_000
# The mock coordinator holds a rejoin for session timeout - 1 s even when the
# only member is back (a broker would finish at once); clients that join
# before they know the topic rejoin, so a short session keeps the test short.
SESSION_MS = 6000
HEARTBEAT_MS = 500
DEADLINE_S = 90  # to consume every record
BATCH = 1000  # records per poll

Records = list[tuple[bytes, bytes]]


def round_trip_records() -> Records:
    """N (key, value) records: values 0..N-1 in produce order, over 500 keys."""
    return keyed_records(N, keys=500)


def keyed_records(n: int, keys: int = 50) -> Records:
    """n records, values 0..n-1 in produce order, over ``keys`` distinct keys."""
    return [(f"key-{i % keys}".encode(), f"{i}".encode()) for i in range(n)]


def check_exactly_once_in_order(consumed: list[Row]) -> None:
    """consumed: (partition, offset, key, value) in consumption order, of round_trip_records() on 6 partitions."""
    values = [int(v) for _, _, _, v in consumed]
    assert len(values) == N, f"got {len(values)} records, wanted {N}"
    assert sorted(values) == list(range(N)), "records lost or duplicated"
    by_partition: dict[int, list[tuple[int, int]]] = defaultdict(list)
    key_partition: dict[bytes, int] = {}
    for partition, offset, key, value in consumed:
        by_partition[partition].append((offset, int(value)))
        assert key_partition.setdefault(key, partition) == partition, "one key, one partition"
    assert len(by_partition) == 6, f"records landed on {sorted(by_partition)}"
    for partition, rows in by_partition.items():
        offsets = [o for o, _ in rows]
        assert offsets == sorted(offsets), f"partition {partition} consumed out of offset order"
        seq = [v for _, v in rows]
        assert seq == sorted(seq), f"partition {partition} lost produce order"


def check_round_trip(consumed: list[Row], produced: Records, partitions: int) -> None:
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


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """partition -> high watermark, asked with ListOffsets through ``bootstrap`` (the brokers, or kfan)."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "kfan-tests-watermarks", "enable.auto.commit": False})
    try:
        return {p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=15, cached=False)[1] for p in range(partitions)}
    finally:
        reader.close()


@dataclass
class Trip:
    """What a client saw in one round trip."""

    consumed: list[Row] = field(repr=False)  # (partition, offset, key, value) in consumption order
    brokers: list[tuple[int, str, int]]  # (node id, host, port) of every broker in the client's metadata
    partitions: set[int]  # the topic's partitions in the client's metadata
    assigned: set[int]  # partitions the group assigned to the member
    # Records that still arrived after the produced ones were in (the member polled 2 s more);
    # kcat stops at the end of its partitions (``-e``) and reports where instead:
    extra: list[Row] = field(default_factory=list)
    eof: dict[int, int] | None = None  # partition -> offset where the client said it reached the end
    # The offsets the member committed, as it read them back itself; None when it commits as it leaves (kcat).
    committed: dict[int, int | None] | None = None
    log: str = field(default="", repr=False)  # the client's own log, for assertion messages


RoundTrip = Callable[..., Trip]  # (bootstrap, topic, group, records, security=PLAINTEXT) -> Trip


def _member(group: str) -> dict[str, object]:
    """A group member's settings, as kafka-python and aiokafka name them."""
    return {
        "group_id": group,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "session_timeout_ms": SESSION_MS,
        "heartbeat_interval_ms": HEARTBEAT_MS,
    }


def _node_id(broker: object) -> int | None:
    return getattr(broker, "nodeId", getattr(broker, "node_id", None))


def confluent_kafka_round_trip(bootstrap: str, topic: str, group: str, records: Records, security: ClientSecurity = PLAINTEXT) -> Trip:
    sec = security.librdkafka()
    md = AdminClient({"bootstrap.servers": bootstrap, **sec}).list_topics(topic, timeout=10)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **sec})
    failures: list[str] = []
    for key, value in records:
        producer.produce(topic, value=value, key=key, on_delivery=lambda err, msg: err and failures.append(str(err)))
        producer.poll(0)
    assert producer.flush(30) == 0
    assert failures == []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            **sec,
        }
    )
    consumed: list[Row] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + DEADLINE_S
        while len(consumed) < len(records) and time.monotonic() < deadline:
            for m in consumer.consume(BATCH, timeout=1):
                assert m.error() is None, m.error()
                consumed.append((m.partition(), m.offset(), m.key(), m.value()))
        extra = [(m.partition(), m.offset(), m.key(), m.value()) for m in consumer.consume(100, timeout=2) if m.error() is None]
        assigned = {tp.partition for tp in consumer.assignment()}
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(topic, p) for p in sorted(md.topics[topic].partitions)], timeout=10)
    finally:
        consumer.close()
    return Trip(
        consumed,
        brokers=[(b.id, b.host, b.port) for b in md.brokers.values()],
        partitions=set(md.topics[topic].partitions),
        assigned=assigned,
        extra=extra,
        committed={tp.partition: tp.offset for tp in committed},
    )


def kafka_python_subscribe(consumer: Any, topic: str, timeout: float = DEADLINE_S) -> None:
    """Subscribe a kafka-python ``KafkaConsumer`` to ``topic`` once its metadata has the topic's partitions.

    kafka-python 3.0.12 can stay in a group with nothing to read, heartbeats off, until it is
    closed: a member that assigned before its metadata had the topic (its range assignor warns
    "No partition metadata for topic") rejoins when the metadata comes, and if that JoinGroup's
    answer arrives while no ``poll`` waits for it, the finished join is never applied (its
    ``need_rejoin`` is already False: the assignment just taken matches the metadata). Directly
    or through kfan alike. ``topics()`` always asks the cluster, so after it the consumer's
    metadata, and the snapshot it rejoins on, hold the topic before the first join.
    """
    consumer.subscribe([topic])
    wait_for(f"{topic} in the consumer's metadata", lambda: topic in consumer.topics(), timeout)


def kafka_python_round_trip(bootstrap: str, topic: str, group: str, records: Records, security: ClientSecurity = PLAINTEXT) -> Trip:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition

    sec = security.kafka_python()
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, **sec)
    futures = [producer.send(topic, key=k, value=v) for k, v in records]
    producer.flush(60)
    for f in futures:
        f.get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, **_member(group), **sec)
    consumed: list[Row] = []
    try:
        kafka_python_subscribe(consumer, topic)
        deadline = time.monotonic() + DEADLINE_S
        while len(consumed) < len(records) and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=1000, max_records=BATCH).values():
                consumed.extend((r.partition, r.offset, r.key, r.value) for r in batch)
        extra = [(r.partition, r.offset, r.key, r.value) for batch in consumer.poll(timeout_ms=2000).values() for r in batch]
        partitions = consumer.partitions_for_topic(topic)
        assigned = {tp.partition for tp in consumer.assignment()}
        brokers = [(_node_id(b), b.host, b.port) for b in consumer._client.cluster.brokers()]
        consumer.commit()
        committed = {p: consumer.committed(KTopicPartition(topic, p)) for p in sorted(partitions)}
    finally:
        consumer.close()
    return Trip(consumed, brokers, partitions, assigned, extra, committed=committed)


def aiokafka_round_trip(bootstrap: str, topic: str, group: str, records: Records, security: ClientSecurity = PLAINTEXT) -> Trip:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as ATopicPartition

    async def run() -> Trip:
        sec = security.aiokafka()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, **sec)
        await producer.start()
        try:
            futures = [await producer.send(topic, key=k, value=v) for k, v in records]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, **_member(group), **sec)
        await consumer.start()
        consumed: list[Row] = []
        try:
            deadline = time.monotonic() + DEADLINE_S
            while len(consumed) < len(records) and time.monotonic() < deadline:
                for batch in (await consumer.getmany(timeout_ms=1000, max_records=BATCH)).values():
                    consumed.extend((r.partition, r.offset, r.key, r.value) for r in batch)
            extra = [(r.partition, r.offset, r.key, r.value) for batch in (await consumer.getmany(timeout_ms=2000)).values() for r in batch]
            partitions = consumer.partitions_for_topic(topic)
            assigned = {tp.partition for tp in consumer.assignment()}
            brokers = [(_node_id(b), b.host, b.port) for b in consumer._client.cluster.brokers()]
            await consumer.commit()
            committed = {p: await consumer.committed(ATopicPartition(topic, p)) for p in sorted(partitions)}
        finally:
            await consumer.stop()
        return Trip(consumed, brokers, partitions, assigned, extra, committed=committed)

    return asyncio.run(run())


def kcat_round_trip(kcat: Kcat, bootstrap: str, topic: str, group: str, records: Records, security: ClientSecurity = PLAINTEXT) -> Trip:
    """``kcat -P``, then one ``kcat -G`` balanced-group member until the end of every partition;
    it commits as it leaves. Its metadata is ``kcat -L``'s."""
    sec = security.kcat()
    md = kcat.metadata(bootstrap, topic, *sec)
    kcat.produce(bootstrap, topic, records, *sec)
    consumed = kcat.group_consume(bootstrap, group, topic, *sec, session_ms=SESSION_MS, timeout=120)
    [t] = md["topics"]
    return Trip(
        consumed.rows,
        brokers=[(b["id"], b["name"].rpartition(":")[0], int(b["name"].rpartition(":")[2])) for b in md["brokers"]],
        partitions={p["partition"] for p in t["partitions"]},
        assigned=consumed.assigned,
        eof=consumed.eof,
        log=consumed.stderr[-3000:],
    )


ROUND_TRIPS: dict[str, RoundTrip] = {
    "confluent-kafka": confluent_kafka_round_trip,
    "kafka-python": kafka_python_round_trip,
    "aiokafka": aiokafka_round_trip,
}  # and kcat_round_trip, given the kcat to run
