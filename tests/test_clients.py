"""Real clients through the real kfan process in front of the 3-broker cluster.

Each client library produces 10,000 keyed records to a 6-partition topic led
by brokers 1,2,3,1,2,3, then a consumer group of the same library reads back
exactly those records: none lost, none duplicated, per-partition order kept.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from tests.support.kfan import Kfan
from tests.support.round_trip import SESSION_MS, N, check_exactly_once_in_order, round_trip_records


def test_confluent_kafka_round_trip(kfan: Kfan, topic: str) -> None:
    md = AdminClient({"bootstrap.servers": kfan.bootstrap}).list_topics(topic, timeout=10)
    assert list(md.brokers) == [0] and md.brokers[0].host == kfan.host and md.brokers[0].port == kfan.port
    assert sorted(md.topics[topic].partitions) == list(range(6))
    producer = Producer({"bootstrap.servers": kfan.bootstrap, "linger.ms": 5})
    failures: list[str] = []
    for key, value in round_trip_records():
        producer.produce(topic, value=value, key=key, on_delivery=lambda err, msg: err and failures.append(str(err)))
        producer.poll(0)
    assert producer.flush(30) == 0
    assert failures == []
    consumer = Consumer(
        {"bootstrap.servers": kfan.bootstrap, "group.id": f"g-{uuid.uuid4()}", "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    consumer.subscribe([topic])
    consumed: list[tuple[int, int, bytes, bytes]] = []
    deadline = time.monotonic() + 90
    while len(consumed) < N and time.monotonic() < deadline:
        for m in consumer.consume(1000, timeout=1):
            assert m.error() is None, m.error()
            consumed.append((m.partition(), m.offset(), m.key(), m.value()))
    # Nothing more arrives after the 10,000.
    extra = consumer.consume(100, timeout=2)
    consumer.close()
    assert [m for m in extra if m.error() is None] == []
    check_exactly_once_in_order(consumed)


def test_kafka_python_round_trip(kfan: Kfan, topic: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kfan.bootstrap, linger_ms=5)
    futures = [producer.send(topic, key=k, value=v) for k, v in round_trip_records()]
    producer.flush(60)
    for f in futures:
        f.get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=kfan.bootstrap,
        group_id=f"g-{uuid.uuid4()}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=2000,
    )
    consumed: list[tuple[int, int, bytes, bytes]] = []
    deadline = time.monotonic() + 90
    while len(consumed) < N and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=1000, max_records=2000).values():
            consumed.extend((r.partition, r.offset, r.key, r.value) for r in records)
    assert consumer.partitions_for_topic(topic) == set(range(6))
    brokers = consumer._client.cluster.brokers()
    assert [(getattr(b, "nodeId", getattr(b, "node_id", None)), b.host, b.port) for b in brokers] == [(0, kfan.host, kfan.port)]
    extra = consumer.poll(timeout_ms=2000)
    consumer.close()
    assert not any(extra.values())
    check_exactly_once_in_order(consumed)


def test_aiokafka_round_trip(kfan: Kfan, topic: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def run() -> list[tuple[int, int, bytes, bytes]]:
        producer = AIOKafkaProducer(bootstrap_servers=kfan.bootstrap, linger_ms=5)
        await producer.start()
        try:
            futures = [await producer.send(topic, key=k, value=v) for k, v in round_trip_records()]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=kfan.bootstrap,
            group_id=f"g-{uuid.uuid4()}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=2000,
        )
        await consumer.start()
        consumed: list[tuple[int, int, bytes, bytes]] = []
        try:
            deadline = time.monotonic() + 90
            while len(consumed) < N and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=1000, max_records=2000)
                for records in batches.values():
                    consumed.extend((r.partition, r.offset, r.key, r.value) for r in records)
            assert consumer.partitions_for_topic(topic) == set(range(6))
            brokers = consumer._client.cluster.brokers()
            assert [(getattr(b, "nodeId", getattr(b, "node_id", None)), b.host, b.port) for b in brokers] == [(0, kfan.host, kfan.port)]
            extra = await consumer.getmany(timeout_ms=2000)
            assert not any(extra.values())
        finally:
            await consumer.stop()
        return consumed

    check_exactly_once_in_order(asyncio.run(run()))
