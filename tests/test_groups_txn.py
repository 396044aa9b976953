"""Idempotence, transactions and consumer-group offsets through kfan."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from tests.conftest import Kfan


def _consume(kfan: Kfan, topic: str, group: str, want: int, *, isolation: str = "read_uncommitted", commit: bool = False, timeout: float = 60) -> list[bytes]:
    consumer = Consumer({
        "bootstrap.servers": kfan.bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": isolation,
    })
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        for m in consumer.consume(500, timeout=0.5):
            if m.error() is None:
                got.append(m.value())
    if commit:
        consumer.commit(asynchronous=False)
    # Anything beyond `want` would show here.
    for m in consumer.consume(100, timeout=2):
        if m.error() is None:
            got.append(m.value())
    if commit:
        consumer.commit(asynchronous=False)
    consumer.close()
    return got


def test_idempotent_producer(kfan: Kfan, topic: str) -> None:
    producer = Producer({"bootstrap.servers": kfan.bootstrap, "enable.idempotence": True, "linger.ms": 2})
    errors: list[str] = []
    for i in range(3000):
        producer.produce(topic, key=str(i % 31).encode(), value=str(i).encode(), on_delivery=lambda e, m: e and errors.append(str(e)))
        producer.poll(0)
    assert producer.flush(30) == 0 and errors == []
    values = _consume(kfan, topic, f"idem-{uuid.uuid4()}", 3000)
    assert sorted(int(v) for v in values) == list(range(3000))


def test_transactions_commit_and_abort(kfan: Kfan, topic: str) -> None:
    producer = Producer({"bootstrap.servers": kfan.bootstrap, "transactional.id": f"tx-{uuid.uuid4()}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(60):
        producer.produce(topic, key=str(i).encode(), value=f"committed-{i}".encode())
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(40):
        producer.produce(topic, key=str(i).encode(), value=f"aborted-{i}".encode())
    producer.flush(30)
    producer.abort_transaction(30)
    committed = _consume(kfan, topic, f"rc-{uuid.uuid4()}", 60, isolation="read_committed")
    assert sorted(committed) == sorted(f"committed-{i}".encode() for i in range(60))
    everything = _consume(kfan, topic, f"ru-{uuid.uuid4()}", 100, isolation="read_uncommitted")
    assert len(everything) == 100, "read_uncommitted sees the aborted records too"


def test_transactional_offsets_and_producer_fencing(kfan: Kfan, topic: str) -> None:
    txn_id = f"fence-{uuid.uuid4()}"
    first = Producer({"bootstrap.servers": kfan.bootstrap, "transactional.id": txn_id})
    first.init_transactions(30)
    second = Producer({"bootstrap.servers": kfan.bootstrap, "transactional.id": txn_id})
    second.init_transactions(30)  # fences the first one, via the transaction coordinator
    first.begin_transaction()
    first.produce(topic, value=b"zombie")
    try:
        first.commit_transaction(15)
        fenced = False
    except KafkaException as e:
        fenced = e.args[0].fatal() or "fenced" in str(e).lower()
    assert fenced, "the older producer must be fenced"


def test_second_consumer_resumes_from_committed_offsets(kfan: Kfan, topic: str) -> None:
    producer = Producer({"bootstrap.servers": kfan.bootstrap})
    for i in range(600):
        producer.produce(topic, key=str(i).encode(), value=str(i).encode())
    producer.flush(30)
    group = f"resume-{uuid.uuid4()}"
    first = _consume(kfan, topic, group, 600, commit=True)
    assert len(first) == 600
    for i in range(600, 900):
        producer.produce(topic, key=str(i).encode(), value=str(i).encode())
    producer.flush(30)
    second = _consume(kfan, topic, group, 300)
    assert sorted(int(v) for v in second) == list(range(600, 900)), "resumed exactly where the first committed"
    # And the committed offsets are visible through kfan's OffsetFetch.
    c = Consumer({"bootstrap.servers": kfan.bootstrap, "group.id": group})
    committed = c.committed([TopicPartition(topic, p) for p in range(6)], timeout=10)
    c.close()
    assert sum(tp.offset for tp in committed) == 600
