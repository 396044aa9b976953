"""Zone-aware fetching against Kafka's own replica selector (KIP-392), proven from the brokers' metrics.

The session's Apache Kafka cluster puts brokers 1, 2, 3 in racks a, b, c and
runs ``RackAwareReplicaSelector``. A topic led by brokers 1 and 3, with broker
2 a follower of every partition: a consumer that names no rack reads through
``kfan --rack b``, and the brokers' own per-topic ``BytesOutPerSec`` (bytes
sent to consumers, replication excluded) must show broker 2 serving the
records and the leaders none. The same records are then read from the
leaders directly, for comparison.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.kcat import Row
from tests.support.kfan import kfan_at
from tests.support.waiting import wait_for

REPLICAS = [[1, 2, 3], [3, 2, 1], [1, 2, 3], [3, 2, 1]]  # leaders 1 and 3 (racks a, c); broker 2 (rack b) follows all
N = 2000


def _bytes_out(kafka: KafkaCluster, topic: str) -> dict[int, float]:
    mbean = f"kafka.server:type=BrokerTopicMetrics,name=BytesOutPerSec,topic={topic}"
    with ThreadPoolExecutor(len(kafka.brokers)) as pool:  # a JVM each: asked at once
        counts = pool.map(lambda broker: kafka.metric(broker, mbean), kafka.brokers)
        return dict(zip(kafka.brokers, counts, strict=True))


def _read_all(bootstrap: str, topic: str, **conf: object) -> list[Row]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False, **conf})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(len(REPLICAS))])
    rows: list[Row] = []
    try:

        def everything() -> bool:
            for m in consumer.consume(500, 0.5):
                assert m.error() is None, m.error()
                rows.append((m.partition(), m.offset(), m.key(), m.value()))
            return len(rows) >= N

        wait_for(f"{N} records from {bootstrap}", everything, 60, seen=lambda: len(rows))
    finally:
        consumer.close()
    return sorted(rows)


def test_kfan_in_rack_b_reads_from_the_rack_b_replica(apache_kafka: KafkaCluster) -> None:
    topic = f"racks-{uuid.uuid4().hex[:8]}"
    apache_kafka.create_topic(topic, len(REPLICAS), replicas=REPLICAS)
    producer = Producer({"bootstrap.servers": apache_kafka.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(N):
        producer.produce(topic, key=f"k{i % 40}".encode(), value=f"{i}".encode())
    assert producer.flush(30) == 0

    with kfan_at(apache_kafka.bootstrap, "--rack", "b") as k:
        through = _read_all(k.bootstrap, topic)
    served = _bytes_out(apache_kafka, topic)
    payload = sum(len(key) + len(value) for _, _, key, value in through)
    assert served[2] >= payload, f"broker 2 (rack b) sent {served[2]} bytes of {topic} to consumers; the records hold {payload}"
    assert served[1] == served[3] == 0, f"the leaders served records to kfan in rack b: {served}"

    direct = _read_all(apache_kafka.bootstrap, topic)  # no rack: from the leaders
    assert through == direct
    assert len({value for *_, value in direct}) == N
    after = _bytes_out(apache_kafka, topic)
    assert after[1] > 0 and after[3] > 0, f"a consumer without a rack reads from the leaders: {after}"
