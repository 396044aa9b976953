"""Client telemetry (KIP-714) answered by kfan, in front of Apache Kafka: the Java client and librdkafka push their
metrics through kfan's subscriptions, and they appear on kfan's /metrics labelled by client; a malformed or oversized
push gets Kafka's error code and changes nothing there."""

from __future__ import annotations

import gzip
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from kio.schema.get_telemetry_subscriptions.v0.request import GetTelemetrySubscriptionsRequest
from kio.schema.push_telemetry.v0.request import PushTelemetryRequest

from proxy.runtime import telemetry
from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.apache_kafka.java_client import run_main
from tests.support.kfan import Kfan, kfan_at
from tests.support.metrics import http_get, labels_of, metrics_port_in, parse_samples
from tests.support.rawclient import RawClient
from tests.support.waiting import wait_for

SUBSCRIPTIONS = """
[[subscription]]
name = "clients"
metrics = ["org.apache.kafka.producer.", "org.apache.kafka.consumer."]
interval-ms = 1000
"""
MAX_BYTES = 64 * 1024
JAVA_CLIENTS = Path(__file__).parent / "support" / "apache_kafka" / "TelemetryClients.java"


@pytest.fixture(scope="module")
def telemetry_kfan(apache_kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kfan]:
    path = tmp_path_factory.mktemp("telemetry") / "subscriptions.toml"
    path.write_text(SUBSCRIPTIONS)
    extra = ("--telemetry-subscriptions", str(path), "--telemetry-max-bytes", str(MAX_BYTES), "--metrics-listen", "127.0.0.1:0")
    with kfan_at(apache_kafka.bootstrap, *extra) as k:
        yield k


def _client_series(kfan: Kfan) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every ``kfan_telemetry_*`` sample on kfan's /metrics: family -> [(labels, value)]."""
    _, text = http_get(f"http://127.0.0.1:{metrics_port_in(kfan.log)}/metrics")
    return {
        name: [(labels_of(labels), v) for labels, v in samples]
        for name, samples in parse_samples(text).items()
        if name.startswith("kfan_telemetry_")
    }


def _pushed_by(kfan: Kfan, client_id: str, prefix: str) -> set[str]:
    return {
        name
        for name, samples in _client_series(kfan).items()
        if name.startswith(prefix) and any(labels["client_id"] == client_id for labels, _ in samples)
    }


def test_the_java_client_pushes_its_metrics_through_kfan(apache_kafka: KafkaCluster, telemetry_kfan: Kfan) -> None:
    topic, group = f"telemetry-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    apache_kafka.create_topic(topic, 3)
    done = run_main(JAVA_CLIENTS, telemetry_kfan.bootstrap, topic, group, "6", timeout_s=200)
    assert "consumed 0" not in done.stdout, done.stdout
    seen = {(name.split("_")[5], labels["client_id"]) for name, samples in _client_series(telemetry_kfan).items() for labels, _ in samples}
    assert ("producer", "java-telemetry-producer") in seen, seen
    assert ("consumer", "java-telemetry-consumer") in seen, seen


def test_librdkafka_pushes_its_metrics_through_kfan(apache_kafka: KafkaCluster, telemetry_kfan: Kfan) -> None:
    topic = f"telemetry-{uuid.uuid4().hex[:8]}"
    apache_kafka.create_topic(topic, 3)
    client_id = f"rdkafka-{uuid.uuid4().hex[:6]}"
    producer = Producer({"bootstrap.servers": telemetry_kfan.bootstrap, "client.id": client_id, "enable.metrics.push": True})
    try:

        def pushed() -> bool:
            producer.produce(topic, b"v")
            producer.poll(0.2)
            return bool(_pushed_by(telemetry_kfan, client_id, "kfan_telemetry_org_apache_kafka_producer_"))

        wait_for("librdkafka's first telemetry push", pushed, timeout=30)
    finally:
        producer.flush(10)


def test_a_malformed_or_oversized_push_gets_kafkas_error_and_changes_nothing(telemetry_kfan: Kfan) -> None:
    with RawClient(telemetry_kfan.address) as rc:
        sub = rc.call(GetTelemetrySubscriptionsRequest(client_instance_id=uuid.UUID(int=0)))
        assert sub.error_code == 0 and list(sub.requested_metrics) == ["org.apache.kafka.consumer.", "org.apache.kafka.producer."]
        before = _client_series(telemetry_kfan)

        def push(metrics: bytes, compression: int = telemetry.NONE) -> int:
            time.sleep(0.6)  # half the interval: sooner is too often
            request = PushTelemetryRequest(
                client_instance_id=sub.client_instance_id,
                subscription_id=sub.subscription_id,
                terminating=False,
                compression_type=compression,
                metrics=metrics,
            )
            return int(rc.call(request).error_code)

        assert push(b"\x0a\xff\xff\xff\xff garbage") == telemetry.INVALID_RECORD
        assert push(b"\x00" * (MAX_BYTES + 1)) == telemetry.TELEMETRY_TOO_LARGE
        assert push(gzip.compress(b"\x00" * (MAX_BYTES * 4)), telemetry.GZIP) == telemetry.TELEMETRY_TOO_LARGE
        assert push(b"", 4) == telemetry.UNSUPPORTED_COMPRESSION_TYPE
        assert _client_series(telemetry_kfan).keys() == before.keys()
        assert not [
            labels
            for samples in _client_series(telemetry_kfan).values()
            for labels, _ in samples
            if labels["client_instance_id"] == str(sub.client_instance_id)
        ]
