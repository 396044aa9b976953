"""Kafka's own command-line tools through kfan give what they give against the cluster directly.

What operators run every day, as ``java -cp <jars> <main class>`` (the
scripts' own classes), with ``--bootstrap-server`` pointed at kfan and, for
comparison, at Apache Kafka's brokers: kafka-topics, kafka-configs,
kafka-consumer-groups, kafka-delete-records and the producer and consumer
perf tests. Where the two answers must differ (kfan shows itself as the only
broker), the test says so.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.apache_kafka.tools import run_tool
from tests.support.kfan import Kfan, shows_cluster_ids

PARTITIONS = 6


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _topic_summary(describe: str) -> dict[str, str]:
    """The first line of ``kafka-topics --describe``, as its ``Key: value`` fields."""
    first = describe.strip().splitlines()[0]
    return dict(field.split(": ", 1) for field in first.split("\t") if ": " in field)


def _partition_lines(describe: str) -> list[dict[str, str]]:
    return [
        dict(field.split(": ", 1) for field in line.strip().split("\t") if ": " in field)
        for line in describe.strip().splitlines()[1:]
        if "Partition: " in line
    ]


def test_kafka_topics_create_describe_and_list_through_kfan(apache_kafka: KafkaCluster, kfan_kafka: Kfan) -> None:
    topic = _name("tools-topics")
    run_tool(
        "kafka-topics",
        "--bootstrap-server",
        kfan_kafka.bootstrap,
        "--create",
        "--topic",
        topic,
        "--partitions",
        "6",
        "--replication-factor",
        "3",
    )
    direct = run_tool("kafka-topics", "--bootstrap-server", apache_kafka.bootstrap, "--describe", "--topic", topic).out
    through = run_tool("kafka-topics", "--bootstrap-server", kfan_kafka.bootstrap, "--describe", "--topic", topic).out
    for out in (direct, through):
        summary = _topic_summary(out)
        assert (summary["Topic"], summary["PartitionCount"], summary["ReplicationFactor"]) == (topic, "6", "3"), out
    assert _topic_summary(direct)["TopicId"] == _topic_summary(through)["TopicId"]
    real, shown = _partition_lines(direct), _partition_lines(through)
    assert [p["Partition"] for p in shown] == [p["Partition"] for p in real] == [str(i) for i in range(PARTITIONS)]
    for p, r in zip(shown, real, strict=True):
        if shows_cluster_ids():  # the brokers' own ids, as directly
            assert (p["Leader"], p["Replicas"], p["Isr"]) == (r["Leader"], r["Replicas"], r["Isr"]), through
        else:  # kfan is the only broker it shows, as many times as there are replicas
            assert (p["Leader"], p["Replicas"], p["Isr"]) == ("0", "0,0,0", "0,0,0"), through
    for p in real:
        assert sorted(p["Replicas"].split(",")) == ["1", "2", "3"], direct
    for bootstrap in (apache_kafka.bootstrap, kfan_kafka.bootstrap):
        assert topic in run_tool("kafka-topics", "--bootstrap-server", bootstrap, "--list").out.split()


def _produce(bootstrap: str, topic: str, n: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        producer.produce(topic, key=f"k{i % 60}".encode(), value=str(i).encode())
    assert producer.flush(30) == 0


def _consume_and_commit(bootstrap: str, topic: str, group: str, n: int) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got = 0
    try:
        for _ in range(120):
            for m in consumer.consume(1000, 1.0):
                assert m.error() is None, m.error()
                got += 1
            if got >= n:
                break
        assert got == n, f"consumed {got} of {n}"
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()


def _group_offsets(describe: str, topic: str) -> set[tuple[str, str, str, str]]:
    """(partition, current offset, log end offset, lag) of every row of ``kafka-consumer-groups --describe``."""
    rows = set()
    for line in describe.splitlines():
        cols = line.split()
        if len(cols) >= 6 and cols[1] == topic:
            rows.add((cols[2], cols[3], cols[4], cols[5]))
    return rows


def test_kafka_consumer_groups_describe_and_reset_through_kfan(apache_kafka: KafkaCluster, kfan_kafka: Kfan) -> None:
    topic, group = _name("tools-groups"), _name("tools-g")
    apache_kafka.create_topic(topic, PARTITIONS)
    _produce(apache_kafka.bootstrap, topic, 600)
    _consume_and_commit(kfan_kafka.bootstrap, topic, group, 600)
    describe = ("--describe", "--group", group)
    direct = _group_offsets(run_tool("kafka-consumer-groups", "--bootstrap-server", apache_kafka.bootstrap, *describe).out, topic)
    through = _group_offsets(run_tool("kafka-consumer-groups", "--bootstrap-server", kfan_kafka.bootstrap, *describe).out, topic)
    assert len(direct) == PARTITIONS and all(lag == "0" for *_, lag in direct), direct
    assert through == direct
    listed = run_tool("kafka-consumer-groups", "--bootstrap-server", kfan_kafka.bootstrap, "--list").out.split()
    assert group in listed
    reset = ("--reset-offsets", "--group", group, "--topic", topic, "--to-earliest", "--execute")
    run_tool("kafka-consumer-groups", "--bootstrap-server", kfan_kafka.bootstrap, *reset)
    after = _group_offsets(run_tool("kafka-consumer-groups", "--bootstrap-server", apache_kafka.bootstrap, *describe).out, topic)
    assert {current for _, current, _, _ in after} == {"0"}, after
    run_tool("kafka-consumer-groups", "--bootstrap-server", kfan_kafka.bootstrap, "--delete", "--group", group)
    assert group not in run_tool("kafka-consumer-groups", "--bootstrap-server", apache_kafka.bootstrap, "--list").out.split()


def test_kafka_delete_records_through_kfan(apache_kafka: KafkaCluster, kfan_kafka: Kfan, tmp_path: Path) -> None:
    topic = _name("tools-delete")
    apache_kafka.create_topic(topic, PARTITIONS)
    _produce(apache_kafka.bootstrap, topic, 600)
    plan = tmp_path / "offsets.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": p, "offset": 5} for p in range(PARTITIONS)]}))
    out = run_tool("kafka-delete-records", "--bootstrap-server", kfan_kafka.bootstrap, "--offset-json-file", str(plan)).out
    assert len(re.findall(r"low_watermark: 5", out)) == PARTITIONS, out
    reader = Consumer({"bootstrap.servers": apache_kafka.bootstrap, "group.id": _name("wm")})
    try:
        lows = [reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0] for p in range(PARTITIONS)]
    finally:
        reader.close()
    assert lows == [5] * PARTITIONS


def test_kafka_configs_alter_and_describe_through_kfan(apache_kafka: KafkaCluster, kfan_kafka: Kfan) -> None:
    topic = _name("tools-configs")
    apache_kafka.create_topic(topic, PARTITIONS)
    entity = ("--entity-type", "topics", "--entity-name", topic)
    run_tool("kafka-configs", "--bootstrap-server", kfan_kafka.bootstrap, "--alter", *entity, "--add-config", "retention.ms=123456789")
    for bootstrap in (apache_kafka.bootstrap, kfan_kafka.bootstrap):
        out = run_tool("kafka-configs", "--bootstrap-server", bootstrap, "--describe", *entity).out
        assert "retention.ms=123456789" in out, out


def test_perf_tests_through_kfan(apache_kafka: KafkaCluster, kfan_kafka: Kfan) -> None:
    topic = _name("tools-perf")
    apache_kafka.create_topic(topic, PARTITIONS)
    n = 20_000
    produced = run_tool(
        "kafka-producer-perf-test", "--topic", topic, "--num-records", str(n), "--record-size", "100", "--throughput", "-1",
        "--producer-props", f"bootstrap.servers={kfan_kafka.bootstrap}", "acks=all",
    ).out  # fmt: skip
    assert re.search(rf"^{n} records sent", produced, re.M), produced
    consumed = run_tool(
        "kafka-consumer-perf-test", "--bootstrap-server", kfan_kafka.bootstrap, "--topic", topic, "--messages", str(n), "--timeout", "60000"
    ).out
    header, values = consumed.strip().splitlines()[-2:]
    row = dict(zip([h.strip() for h in header.split(",")], [v.strip() for v in values.split(",")], strict=False))
    assert int(row["data.consumed.in.nMsg"]) == n, consumed
