"""Client telemetry (KIP-714) as kfan answers it (:mod:`proxy.runtime.telemetry`): subscriptions matched on the
client, pushes checked as a broker checks them (a refused one changes nothing), OTLP metrics decoded (gzip or not)
and collected for Prometheus, within bounds."""

from __future__ import annotations

import gzip
import uuid
from pathlib import Path

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Gauge, Metric, MetricsData, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum
from prometheus_client import CollectorRegistry, generate_latest

from proxy.kafka import apis, schema
from proxy.runtime import telemetry as t

PRODUCER = t.TelemetryClient("orders-app", "apache-kafka-java", "4.4.0", "User:alice")
SUBSCRIPTIONS_TOML = """
[[subscription]]
name = "producers"
metrics = ["org.apache.kafka.producer."]
interval-ms = 2000
[subscription.match]
client_id = "orders-.*"

[[subscription]]
name = "java"
metrics = ["org.apache.kafka.consumer.fetch"]
interval-ms = 5000
[subscription.match]
client_software_name = "apache-kafka-java"
principal = "User:bob"
"""


@pytest.fixture
def subscriptions(tmp_path: Path) -> tuple[t.Subscription, ...]:
    path = tmp_path / "telemetry.toml"
    path.write_text(SUBSCRIPTIONS_TOML)
    return t.load_subscriptions(path)


def metrics_data(values: dict[str, float], node: str = "1") -> bytes:
    data = MetricsData()
    scope = ScopeMetrics()
    for name, value in values.items():
        point = NumberDataPoint(as_double=value, attributes=[KeyValue(key="node.id", value=AnyValue(string_value=node))])
        metric = Metric(name=name, gauge=Gauge(data_points=[point])) if "rate" in name else Metric(name=name, sum=Sum(data_points=[point]))
        scope.metrics.append(metric)
    data.resource_metrics.append(ResourceMetrics(scope_metrics=[scope]))
    return data.SerializeToString()


def decoded(api: int, parts: list) -> dict:
    return schema.decode_body(schema.response_spec(api, 0), b"".join(parts))


def subscribe(telemetry: t.ClientTelemetry, client: t.TelemetryClient = PRODUCER) -> dict:
    return decoded(apis.GET_TELEMETRY_SUBSCRIPTIONS, telemetry.get_subscriptions(0, {"client_instance_id": t.NO_INSTANCE}, client))


def push(telemetry: t.ClientTelemetry, answer: dict, data: bytes, *, now: float, **fields: object) -> int:
    """A PushTelemetry in the subscription ``answer`` gave (``fields`` change any of its fields)."""
    request = {
        "client_instance_id": answer["client_instance_id"],
        "subscription_id": answer["subscription_id"],
        "terminating": False,
        "compression_type": t.NONE,
        "metrics": data,
        **fields,
    }
    return decoded(apis.PUSH_TELEMETRY, telemetry.push(0, request, now=now))["error_code"]


def scrape(telemetry: t.ClientTelemetry) -> str:
    registry = CollectorRegistry()
    registry.register(telemetry)
    return generate_latest(registry).decode()


def test_a_client_gets_the_subscriptions_it_matches(subscriptions: tuple[t.Subscription, ...]) -> None:
    telemetry = t.ClientTelemetry(subscriptions)
    answer = subscribe(telemetry)
    assert answer["client_instance_id"] != t.NO_INSTANCE  # kfan names a new client instance
    assert answer["requested_metrics"] == ["org.apache.kafka.producer."]  # "java" wants principal User:bob
    assert answer["push_interval"] == 2000 and answer["accepted_compression_types"] == [t.GZIP]
    bob = t.TelemetryClient("orders-app", "apache-kafka-java", "4.4.0", "User:bob")
    both = subscribe(telemetry, bob)
    assert both["requested_metrics"] == ["org.apache.kafka.consumer.fetch", "org.apache.kafka.producer."]
    assert both["push_interval"] == 2000 and both["subscription_id"] != answer["subscription_id"]
    nobody = subscribe(telemetry, t.TelemetryClient("other", "librdkafka", "2.16", ""))
    assert nobody["requested_metrics"] == []  # nothing to push


def test_pushed_metrics_appear_labelled_by_client_and_a_later_push_replaces_them(subscriptions: tuple[t.Subscription, ...]) -> None:
    telemetry = t.ClientTelemetry(subscriptions)
    answer = subscribe(telemetry)
    assert push(telemetry, answer, metrics_data({"org.apache.kafka.producer.record.send.rate": 12.5}), now=100.0) == 0
    text = scrape(telemetry)
    instance = str(answer["client_instance_id"])
    assert (
        f'kfan_telemetry_org_apache_kafka_producer_record_send_rate{{client_id="orders-app",client_instance_id="{instance}",'
        f'node_id="1",principal="User:alice"}} 12.5'
    ) in text
    zipped = gzip.compress(metrics_data({"org.apache.kafka.producer.record.send.rate": 20.0}))
    assert push(telemetry, answer, zipped, now=102.0, compression_type=t.GZIP) == 0
    assert "} 20.0" in scrape(telemetry) and "} 12.5" not in scrape(telemetry)


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"metrics": b"\xff\xff\xff not protobuf"}, t.INVALID_RECORD),
        ({"metrics": b"x" * 2000}, t.TELEMETRY_TOO_LARGE),
        ({"compression_type": t.GZIP, "metrics": b"not gzip"}, t.INVALID_RECORD),
        ({"compression_type": t.GZIP, "metrics": gzip.compress(b"\0" * 5000)}, t.TELEMETRY_TOO_LARGE),  # a bomb, inflated
        ({"compression_type": 4}, t.UNSUPPORTED_COMPRESSION_TYPE),  # zstd: not offered
        ({"subscription_id": 12345}, t.UNKNOWN_SUBSCRIPTION_ID),
        ({"client_instance_id": uuid.uuid4()}, t.UNKNOWN_SUBSCRIPTION_ID),
        ({"client_instance_id": t.NO_INSTANCE}, t.INVALID_REQUEST),
    ],
)
def test_a_refused_push_gets_kafkas_error_and_changes_nothing(subscriptions: tuple[t.Subscription, ...], change: dict, code: int) -> None:
    telemetry = t.ClientTelemetry(subscriptions, max_bytes=1000)
    answer = subscribe(telemetry)
    good = metrics_data({"org.apache.kafka.producer.record.send.rate": 1.0})
    assert push(telemetry, answer, good, now=100.0) == 0
    before = scrape(telemetry)
    assert push(telemetry, answer, good, now=200.0, **change) == code
    assert scrape(telemetry) == before
    assert telemetry.refused == {code: 1}


def test_pushing_much_more_often_than_the_interval_is_throttled_but_a_terminating_push_is_not(
    subscriptions: tuple[t.Subscription, ...],
) -> None:
    telemetry = t.ClientTelemetry(subscriptions)
    answer = subscribe(telemetry)
    data = metrics_data({"org.apache.kafka.producer.record.send.rate": 1.0})
    assert push(telemetry, answer, data, now=100.0) == 0
    assert push(telemetry, answer, data, now=100.2) == t.THROTTLING_QUOTA_EXCEEDED
    assert push(telemetry, answer, data, now=100.3, terminating=True) == 0
    assert push(telemetry, answer, data, now=200.0) == t.INVALID_REQUEST  # nothing after the last push


def test_the_oldest_client_instances_go_first_and_their_series_with_them(subscriptions: tuple[t.Subscription, ...]) -> None:
    telemetry = t.ClientTelemetry(subscriptions, max_instances=3)
    answers = [subscribe(telemetry) for _ in range(3)]
    for i, a in enumerate(answers):
        assert push(telemetry, a, metrics_data({"org.apache.kafka.producer.record.send.rate": float(i)}), now=100.0 + i) == 0
    subscribe(telemetry)  # a fourth instance: the least recently pushed (the first) goes
    assert telemetry.instances() == 3
    text = scrape(telemetry)
    assert str(answers[0]["client_instance_id"]) not in text
    assert all(str(a["client_instance_id"]) in text for a in answers[1:])


def test_a_push_of_more_series_than_an_instance_may_keep_is_refused(subscriptions: tuple[t.Subscription, ...]) -> None:
    telemetry = t.ClientTelemetry(subscriptions, max_bytes=10 << 20)
    answer = subscribe(telemetry)
    many = metrics_data({f"org.apache.kafka.producer.m{i}.rate": 1.0 for i in range(t.MAX_SERIES_PER_INSTANCE + 1)})
    assert push(telemetry, answer, many, now=100.0) == t.TELEMETRY_TOO_LARGE
    assert "kfan_telemetry_" not in scrape(telemetry)


def test_a_subscriptions_file_that_is_wrong_says_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[subscription]]\nname = "x"\nmetrics = ["a."]\n[subscription.match]\nclient_name = "y"\n')
    with pytest.raises(ValueError, match="unknown match keys"):
        t.load_subscriptions(path)
    path.write_text('[[subscription]]\nname = "x"\nmetrics = "a."\n')
    with pytest.raises(ValueError, match="metrics must be a list"):
        t.load_subscriptions(path)
