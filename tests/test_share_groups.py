"""Share groups (KIP-932, queues for Kafka) through kfan, against Apache Kafka, with the same assertions directly.

kfan splits ShareFetch and ShareAcknowledge by partition leader and maps the client's one share session onto one
per broker (:mod:`proxy.core.share`); the group's own APIs go to its coordinator. Here Kafka's
``KafkaShareConsumer`` (three members of one share group, acknowledging explicitly), its console share consumer
and ``kafka-share-groups`` run through kfan and straight to the brokers, on a topic whose three partitions are
led by the three brokers.
"""

from __future__ import annotations

import re
import uuid

import pytest
from confluent_kafka import Producer

from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.apache_kafka.faults import leaders
from tests.support.apache_kafka.share_client import share_consume
from tests.support.apache_kafka.tools import run_tool
from tests.support.kfan import Kfan

RECORDS = 300
PATHS = ("direct", "kfan")


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _bootstrap(path: str, kafka: KafkaCluster, kfan: Kfan) -> str:
    return kafka.bootstrap if path == "direct" else kfan.bootstrap


def _topic_with_records(kafka: KafkaCluster) -> str:
    """Three partitions led by the three brokers, ``RECORDS`` records (values 0..N-1) spread over them."""
    topic = _name("share")
    kafka.create_topic(topic, 3, replicas=[[1, 2, 3], [2, 3, 1], [3, 1, 2]])
    assert leaders(kafka, topic) == {1, 2, 3}
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all"})
    for v in range(RECORDS):
        producer.produce(topic, value=str(v).encode(), partition=v % 3)
    assert producer.flush(30) == 0
    return topic


def _read_from_the_start(bootstrap: str, group: str) -> None:
    """A share group starts at the latest offset unless told otherwise (share.auto.offset.reset, a group config)."""
    run_tool(
        "kafka-configs",
        "--bootstrap-server",
        bootstrap,
        "--alter",
        "--entity-type",
        "groups",
        "--entity-name",
        group,
        "--add-config",
        "share.auto.offset.reset=earliest",
    )


@pytest.mark.parametrize("path", PATHS)
def test_share_consumers_get_every_record_and_acknowledgements_take_effect(apache_kafka: KafkaCluster, kfan_kafka: Kfan, path: str) -> None:
    bootstrap = _bootstrap(path, apache_kafka, kfan_kafka)
    topic, group = _topic_with_records(apache_kafka), _name("queue")
    _read_from_the_start(bootstrap, group)
    rejected = sum(1 for v in range(RECORDS) if v % 10 == 7)
    run = share_consume(bootstrap, topic, group, members=3, accepts=RECORDS - rejected)

    assert run.accepted == RECORDS - rejected, run.log
    assert not run.failed, run.failed
    by_value = run.by_value()
    assert set(by_value) == set(range(RECORDS))  # every record, from every partition (every broker)
    assert {d.partition for d in run.deliveries} == {0, 1, 2}
    for v, deliveries in sorted(by_value.items()):
        actions = [(d.action, d.delivery_count) for d in deliveries]
        if v % 10 == 7:
            assert actions == [("REJECT", 1)], (v, actions)  # rejected: never delivered again
        elif v % 10 == 3:
            assert actions == [("RELEASE", 1), ("ACCEPT", 2)], (v, actions)  # released: delivered again
        else:
            assert actions == [("ACCEPT", 1)], (v, actions)


@pytest.mark.parametrize("path", PATHS)
def test_the_console_share_consumer_reads_every_record(apache_kafka: KafkaCluster, kfan_kafka: Kfan, path: str) -> None:
    bootstrap = _bootstrap(path, apache_kafka, kfan_kafka)
    topic, group = _topic_with_records(apache_kafka), _name("console")
    _read_from_the_start(bootstrap, group)
    ran = run_tool(
        "kafka-console-share-consumer",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--group",
        group,
        "--max-messages",
        str(RECORDS),
        "--timeout-ms",
        "60000",
    )
    assert sorted(int(line) for line in ran.out.split()) == list(range(RECORDS)), ran.err[-2000:]


def _describe(bootstrap: str, group: str, *extra: str) -> list[list[str]]:
    """``kafka-share-groups --describe`` rows (header excluded), split on whitespace."""
    out = run_tool("kafka-share-groups", "--bootstrap-server", bootstrap, "--describe", "--group", group, *extra).out
    lines = [line.split() for line in out.strip().splitlines() if line.strip()]
    assert lines and lines[0][0] == "GROUP", out
    return lines[1:]


def test_kafka_share_groups_describes_and_resets_offsets_through_kfan(apache_kafka: KafkaCluster, kfan_kafka: Kfan) -> None:
    topic, group = _topic_with_records(apache_kafka), _name("tools")
    _read_from_the_start(kfan_kafka.bootstrap, group)
    rejected = sum(1 for v in range(RECORDS) if v % 10 == 7)
    run = share_consume(kfan_kafka.bootstrap, topic, group, members=1, accepts=RECORDS - rejected)
    assert run.accepted == RECORDS - rejected, run.log

    listed = run_tool("kafka-share-groups", "--bootstrap-server", kfan_kafka.bootstrap, "--list").out.split()
    assert group in listed
    through, direct = _describe(kfan_kafka.bootstrap, group), _describe(apache_kafka.bootstrap, group)
    assert through == direct
    # Every record was acknowledged: no partition lags.
    assert sorted((row[1], row[2], row[4]) for row in through) == [(topic, str(p), "0") for p in range(3)]

    reset = run_tool(
        "kafka-share-groups",
        "--bootstrap-server",
        kfan_kafka.bootstrap,
        "--reset-offsets",
        "--to-earliest",
        "--group",
        group,
        "--topic",
        topic,
        "--execute",
    )
    assert re.search(rf"{re.escape(topic)}\s+0\s+0", reset.out), reset.out
    # Back to the start: every record is to be delivered again.
    after = sorted((row[1], row[2], row[3], row[4]) for row in _describe(apache_kafka.bootstrap, group))
    assert after == [(topic, str(p), "0", str(RECORDS // 3)) for p in range(3)]
