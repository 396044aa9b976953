"""The chart's broker ports (``brokerPortIds``): with ``brokerIds: cluster`` and ``brokerPortBase``, the container
and the Service expose BASE+N for each listed broker id, and the kfan the chart configures serves broker N there."""

from __future__ import annotations

import random
import struct
from typing import Any

import helm_python as helm
import pytest

from proxy.kafka import schema
from proxy.kafka.headers import response_body_offset
from proxy.tools.mock_cluster import MockCluster
from tests.support.chart import BASE, container, one, render, start_rendered
from tests.support.messages import request_bytes
from tests.support.processes import stop_process
from tests.support.rawclient import RawClient

METADATA, VERSION = 3, 12


def _ports(docs: list[dict[str, Any]]) -> tuple[dict[str, tuple[int, Any]], dict[str, int]]:
    """(the Service's ports by name: (port, targetPort), the container's by name)."""
    service = {p["name"]: (p["port"], p["targetPort"]) for p in one(docs, "Service")["spec"]["ports"]}
    return service, {p["name"]: p["containerPort"] for p in container(docs)["ports"]}


def test_no_broker_port_is_exposed_by_default() -> None:
    service, pod = _ports(render(BASE | {"brokerIds": "cluster", "brokerPortBase": 30000}))
    assert set(service) == set(pod) == {"kafka", "metrics"}


def test_each_listed_broker_id_is_exposed_at_base_plus_id() -> None:
    service, pod = _ports(render(BASE | {"brokerIds": "cluster", "brokerPortBase": 30000, "brokerPortIds": [3, 1, 7]}))
    assert {n: p for n, p in service.items() if n.startswith("broker-")} == {
        "broker-3": (30003, "broker-3"),
        "broker-1": (30001, "broker-1"),
        "broker-7": (30007, "broker-7"),
    }
    assert {n: p for n, p in pod.items() if n.startswith("broker-")} == {"broker-3": 30003, "broker-1": 30001, "broker-7": 30007}


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"brokerPortIds": [1]}, "brokerPortIds needs brokerIds cluster and brokerPortBase"),
        ({"brokerIds": "cluster", "brokerPortIds": [1]}, "brokerPortIds needs brokerIds cluster and brokerPortBase"),
        ({"brokerIds": "kfan", "brokerPortBase": 30000, "brokerPortIds": [1]}, "brokerPortIds needs brokerIds cluster"),
        (
            {"brokerIds": "cluster", "brokerPortBase": 65000, "brokerPortIds": [1, 600]},
            "brokerPortBase 65000 + broker id 600 is past port 65535",
        ),
    ],
)
def test_broker_ports_that_kfan_would_not_listen_on_are_refused(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm.HelmRenderError) as caught:
        render(BASE | values)
    assert complaint in str(caught.value)


@pytest.mark.parametrize(("ids", "complaint"), [([1, 1], "at '/brokerPortIds'"), ([-1], "at '/brokerPortIds/0'")])
def test_schema_refuses_repeated_or_negative_ids(ids: list[int], complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(BASE | {"brokerIds": "cluster", "brokerPortBase": 30000, "brokerPortIds": ids})
    assert complaint in str(caught.value)


def test_the_rendered_kfan_serves_each_exposed_broker_on_its_port(cluster: MockCluster) -> None:
    """Started as the Deployment's container would be: each container port ``broker-N`` is where kfan answers,
    and its Metadata names broker N at that port, so a client that reaches broker N at BASE+N through the
    Service reaches kfan."""
    ids = sorted(cluster.brokers)
    bases: list[int] = []

    def values(kafka_port: int, metrics_port: int) -> dict[str, Any]:
        bases.append(random.randrange(20_000, 60_000 - max(ids)))  # taken: kfan exits, and another is tried
        return BASE | {
            "kafka": {"bootstrap": cluster.bootstrap},
            "containerPorts": {"kafka": kafka_port, "metrics": metrics_port},
            "advertise": f"127.0.0.1:{kafka_port}",
            "brokerIds": "cluster",
            "brokerPortBase": bases[-1],
            "brokerPortIds": ids,
        }

    kfan = start_rendered(values)
    try:
        base = bases[-1]
        _, pod = _ports(kfan.docs)
        for n in ids:
            raw = RawClient(("127.0.0.1", pod[f"broker-{n}"]))
            try:
                payload = request_bytes(METADATA, VERSION, {"topics": [], "allow_auto_topic_creation": False}, 5)
                raw.send_bytes(struct.pack(">i", len(payload)) + payload)
                answer = raw.receive(30)
            finally:
                raw.close()
            assert answer is not None, f"kfan closed the connection at broker {n}'s port"
            body = schema.decode_body(schema.response_spec(METADATA, VERSION), answer, response_body_offset(answer, METADATA, VERSION))
            assert {b["node_id"]: b["port"] for b in body["brokers"]} == {m: base + m for m in ids}
    finally:
        stop_process(kfan.process, 5)
