"""Streams groups (KIP-1071) through kfan, against Apache Kafka, with the same assertions directly.

A Kafka Streams application (two instances, ``group.protocol=streams``, exactly once) reads a topic whose
partitions are led by the three brokers and writes each record, processed, to another: StreamsGroupHeartbeat
goes to the group's coordinator through kfan, and every record comes out once. ``kafka-streams-groups`` lists
the group through kfan.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.apache_kafka.java_client import run_main
from tests.support.apache_kafka.tools import run_tool
from tests.support.kfan import Kfan

SOURCE = Path(__file__).parent / "support" / "apache_kafka" / "StreamsApp.java"
RECORDS = 300
SPREAD = [[1, 2, 3], [2, 3, 1], [3, 1, 2]]  # partitions led by brokers 1, 2 and 3


def _committed_output(bootstrap: str, topic: str, want: int) -> list[str]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    values: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while len(values) < want and time.monotonic() < deadline:
            for m in consumer.consume(500, 1.0):
                if m.error() is None:
                    values.append(m.value().decode())
        for m in consumer.consume(500, 2.0):  # nothing more should come
            if m.error() is None:
                values.append(m.value().decode())
    finally:
        consumer.close()
    return values


@pytest.mark.parametrize("path", ["direct", "kfan"])
def test_a_streams_application_processes_every_record_once(apache_kafka: KafkaCluster, kfan_kafka: Kfan, path: str) -> None:
    bootstrap = apache_kafka.bootstrap if path == "direct" else kfan_kafka.bootstrap
    app, source, sink = (f"{kind}-{uuid.uuid4().hex[:8]}" for kind in ("streams", "in", "out"))
    apache_kafka.create_topic(source, 3, replicas=SPREAD)
    apache_kafka.create_topic(sink, 3, replicas=SPREAD)
    producer = Producer({"bootstrap.servers": apache_kafka.bootstrap, "acks": "all"})
    for v in range(RECORDS):
        producer.produce(source, key=str(v).encode(), value=str(v).encode(), partition=v % 3)
    assert producer.flush(30) == 0

    done = run_main(SOURCE, bootstrap, app, source, sink, str(RECORDS), "120", timeout_s=240)
    states = [line.split()[2] for line in done.stdout.splitlines() if line.startswith("state ")]
    assert "RUNNING" in states, done.stdout[-2000:] + done.stderr[-3000:]
    assert "ERROR" not in states, done.stderr[-3000:]

    out = _committed_output(apache_kafka.bootstrap, sink, RECORDS)
    assert sorted(out) == sorted(f"{v}-processed" for v in range(RECORDS))  # each once: none lost, none twice

    listed = run_tool("kafka-streams-groups", "--bootstrap-server", bootstrap, "--list").out.split()
    assert app in listed
