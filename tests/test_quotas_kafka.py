"""Client quotas enforced by kfan in front of Apache Kafka, seen by real clients (confluent-kafka, librdkafka).

For 30 s, through one kfan: a producer with a 1 MB/s produce quota producing as fast as it can; a consumer with a
1 MB/s fetch quota reading a backlog; beside them a producer and a consumer with no quota. The quota holders get the
quota and librdkafka's own throttle statistics show kfan's throttle times; the others are not throttled and go
faster. Each client's rate is measured from its first byte (a consumer first joins its group) to the end of the run.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.kfan import Kfan, kfan_at, shown_ids
from tests.support.metrics import http_get, labels_of, metrics_port_in, parse_samples

MB = 1024 * 1024
QUOTA = 1 * MB
RUN_S = 30.0
RECORD = b"q" * 10_000

QUOTAS = f"""
[[quotas]]
client-id = "quota-producer"
producer_byte_rate = {QUOTA}

[[quotas]]
client-id = "quota-consumer"
consumer_byte_rate = {QUOTA}
"""


@pytest.fixture(scope="module")
def quota_kfan(apache_kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kfan]:
    path = tmp_path_factory.mktemp("quotas") / "quotas.toml"
    path.write_text(QUOTAS)
    with kfan_at(apache_kafka.bootstrap, "--quota-file", str(path), "--metrics-listen", "127.0.0.1:0") as k:
        yield k


@dataclass
class Flow:
    """Bytes one client moved, when; and the longest throttle librdkafka reported."""

    name: str
    moved: list[tuple[float, int]] = field(default_factory=list)
    throttle_max_ms: int = 0
    errors: list[str] = field(default_factory=list)

    def stats(self, text: str) -> None:
        for broker in json.loads(text).get("brokers", {}).values():
            self.throttle_max_ms = max(self.throttle_max_ms, int(broker.get("throttle", {}).get("max", 0)))

    def rate(self, end: float) -> float:
        """Bytes per second moved from the first byte to ``end`` (seconds since the run began)."""
        start = self.moved[0][0] if self.moved else 0.0
        return sum(n for t, n in self.moved if t < end) / (end - start)


def _produce(bootstrap: str, topic: str, flow: Flow, began: float, stop: threading.Event, pace: float | None = None) -> None:
    """As fast as librdkafka takes records (``pace``: bytes per second at most)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": flow.name,
            "linger.ms": 5,
            "statistics.interval.ms": 500,
            "stats_cb": flow.stats,
            "queue.buffering.max.kbytes": 4096,
        }
    )

    def delivered(err: object, msg: object) -> None:
        if err is not None:
            flow.errors.append(str(err))
        else:
            flow.moved.append((time.monotonic() - began, len(RECORD)))

    sent = 0
    while not stop.is_set():
        if pace is not None and sent > pace * (time.monotonic() - began):
            time.sleep(0.005)
            producer.poll(0)
            continue
        try:
            producer.produce(topic, RECORD, on_delivery=delivered)
            sent += len(RECORD)
        except BufferError:
            producer.poll(0.05)
        producer.poll(0)
    producer.flush(30)


def _consume(bootstrap: str, topic: str, flow: Flow, began: float, stop: threading.Event) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": flow.name,
            "group.id": f"{flow.name}-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "statistics.interval.ms": 500,
            "stats_cb": flow.stats,
        }
    )
    consumer.subscribe([topic])
    try:
        while not stop.is_set():
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                flow.errors.append(str(msg.error()))
                continue
            flow.moved.append((time.monotonic() - began, len(msg.value() or b"")))
    finally:
        consumer.close()


def _prefill(bootstrap: str, topic: str, nbytes: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for _ in range(nbytes // len(RECORD)):
        while True:
            try:
                producer.produce(topic, RECORD)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(60) == 0


def test_quota_holders_get_their_quota_and_others_are_unaffected(apache_kafka: KafkaCluster, quota_kfan: Kfan, tmp_path: Path) -> None:
    produced, backlog = f"quota-produce-{uuid.uuid4().hex[:8]}", f"quota-backlog-{uuid.uuid4().hex[:8]}"
    for name in (produced, backlog):
        apache_kafka.create_topic(name, 6, replication_factor=1, config={"min.insync.replicas": "1"})
    _prefill(apache_kafka.bootstrap, backlog, 8 * MB)  # a backlog from the start; the free producer adds 3 MB/s

    flows = {n: Flow(n) for n in ("quota-producer", "free-producer", "quota-consumer", "free-consumer")}
    stop = threading.Event()
    began = time.monotonic()
    threads = [
        threading.Thread(target=_produce, args=(quota_kfan.bootstrap, produced, flows["quota-producer"], began, stop)),
        threading.Thread(target=_produce, args=(quota_kfan.bootstrap, backlog, flows["free-producer"], began, stop, 3 * QUOTA)),
        threading.Thread(target=_consume, args=(quota_kfan.bootstrap, backlog, flows["quota-consumer"], began, stop)),
        threading.Thread(target=_consume, args=(quota_kfan.bootstrap, backlog, flows["free-consumer"], began, stop)),
    ]
    for t in threads:
        t.start()
    time.sleep(RUN_S)
    stop.set()
    for t in threads:
        t.join(60)

    rates = {n: f.rate(RUN_S) / MB for n, f in flows.items()}
    throttles = {n: f.throttle_max_ms for n, f in flows.items()}
    print(f"MB/s over {RUN_S:.0f} s: {rates}; librdkafka's longest throttle (ms): {throttles}")
    assert not any(f.errors for f in flows.values()), {n: f.errors[:3] for n, f in flows.items()}
    # A client may have taken up to a burst (1 s of its quota) on each of its connections, one per broker it is
    # shown, whose throttle had not run out when the run ended: each connection beyond the first adds one.
    most = 1.1 + (len(shown_ids(apache_kafka.brokers)) - 1) * QUOTA / RUN_S / MB
    for limited in ("quota-producer", "quota-consumer"):
        assert 0.9 <= rates[limited] <= most, (limited, rates)
        assert throttles[limited] > 0, (limited, throttles)
    assert rates["free-producer"] >= 2.5, rates  # its own pace (3 MB/s), not the quota
    assert rates["free-consumer"] >= 2.5, rates  # keeps up with the free producer
    assert throttles["free-producer"] == 0 and throttles["free-consumer"] == 0, throttles

    # kfan's own metrics name the entities it throttled, and only those.
    status, text = http_get(f"http://127.0.0.1:{metrics_port_in(quota_kfan.log)}/metrics")
    assert status == 200
    throttled = {
        (labels_of(labels)["quota"], labels_of(labels)["client_id"])
        for labels, value in parse_samples(text).get("kfan_quota_throttle_seconds_total", [])
        if value > 0
    }
    assert throttled == {("producer_byte_rate", "quota-producer"), ("consumer_byte_rate", "quota-consumer")}, throttled
