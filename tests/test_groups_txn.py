"""Idempotence, transactions and consumer-group offsets through kfan."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from proxy.tools.mock_cluster import MockCluster
from tests.support.kfan import Kfan
from tests.support.waiting import wait_for


class _Direct:
    """The brokers themselves, where a test compares kfan with them."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap


def _consume(
    kfan: Kfan | _Direct,
    topic: str,
    group: str,
    want: int,
    *,
    isolation: str = "read_uncommitted",
    commit: bool = False,
    timeout: float = 120,
) -> list[bytes]:
    """The values a fresh member of ``group`` reads from its committed offsets (else the earliest)
    to the end of every partition of ``topic``: at least ``want`` of them, and whatever comes
    before the ends (so anything beyond ``want`` shows, however the partitions' fetches interleave).
    ``timeout`` only bounds a run that never gets there."""
    consumer = Consumer(
        {
            "bootstrap.servers": kfan.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            # The mock holds a rejoin for session timeout - 1 s (see tests/support/round_trip.py).
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    got: list[bytes] = []
    at_end: set[int] = set()  # partitions read to their end (their last stable offset in read_committed)

    def read() -> bool:
        for m in consumer.consume(500, timeout=0.5):
            if m.error() is None:
                got.append(m.value())
                at_end.discard(m.partition())
            elif m.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(m.partition())
        return len(got) >= want and at_end >= partitions

    try:
        partitions = set(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        consumer.subscribe([topic])
        wait_for(
            f"{want} records and the end of every partition of {topic}",
            read,
            timeout,
            seen=lambda: f"{len(got)} records; at the end of partitions {sorted(at_end)} of {sorted(partitions)}",
        )
        if commit:
            consumer.commit(asynchronous=False)
    finally:
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


def test_transactions_commit_and_abort(kfan: Kfan, cluster: MockCluster, topic: str) -> None:
    """Commit and abort run through kfan's transaction-coordinator routing.

    Whether read_committed hides the aborted records is the broker's doing
    (aborted_transactions and last_stable_offset in its Fetch answer); kfan
    must carry that through unchanged. Neither backend here filters: the mock
    always answers aborted_transactions=[] with LSO = high watermark, and
    Tansu 0.6 returns aborted records too. So the test pins that a
    read_committed consumer through kfan sees exactly what it sees from the
    brokers directly, every committed record included.
    """
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
    direct = _consume(_Direct(cluster.bootstrap), topic, f"rc-{uuid.uuid4()}", 60, isolation="read_committed")
    assert sorted(committed) == sorted(direct), "kfan changed what read_committed sees"
    assert set(f"committed-{i}".encode() for i in range(60)) <= set(committed)
    everything = _consume(kfan, topic, f"ru-{uuid.uuid4()}", 100, isolation="read_uncommitted")
    assert len(everything) == 100, "read_uncommitted sees the aborted records too"


def test_offsets_committed_inside_a_transaction(kfan: Kfan, cluster: MockCluster, topic: str) -> None:
    """Consume-transform-produce: AddOffsetsToTxn goes to the transaction
    coordinator, TxnOffsetCommit to the group coordinator (different brokers
    here, and each refuses requests meant for the other), and the
    transaction commits. The mock answers TxnOffsetCommit without storing
    the offsets, so the committed positions themselves are not checked here.
    """
    group, txn_id = f"ctp-{uuid.uuid4()}", f"ctp-{uuid.uuid4()}"
    cluster.set_coordinator("group", group, 2)
    cluster.set_coordinator("transaction", txn_id, 3)
    producer = Producer({"bootstrap.servers": kfan.bootstrap, "transactional.id": txn_id})
    producer.init_transactions(30)
    consumer = Consumer({"bootstrap.servers": kfan.bootstrap, "group.id": group, "enable.auto.commit": False})
    positions = [TopicPartition(topic, p, 10 * (p + 1)) for p in range(6)]
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=b"transformed")
    producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
    producer.commit_transaction(30)  # raises if either coordinator refused its part
    consumer.close()
    assert _consume(kfan, topic, f"after-{uuid.uuid4()}", 1) == [b"transformed"]


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
    try:
        committed = c.committed([TopicPartition(topic, p) for p in range(6)], timeout=30)
    finally:
        c.close()
    assert sum(tp.offset for tp in committed) == 600
