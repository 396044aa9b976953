"""The embedded mock cluster (proxy.tools.mock_cluster) observed from outside: real clients and raw sockets.

Each test builds its own cluster (about 10 ms) so that leader moves and
injected faults cannot leak into other tests.
"""

from __future__ import annotations

import select
import socket
import struct
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from proxy.tools.mock_cluster import COMPAT_CAPS, MockCluster, MockError
from tests.support.waiting import wait_for

QUIET = {"log_level": 0}


@pytest.fixture
def mock() -> Iterator[MockCluster]:
    with MockCluster(3) as cluster:
        yield cluster


# -- raw protocol helpers: independent of librdkafka's client side ------------


def _request(api_key: int, version: int, body: bytes = b"", correlation_id: int = 7) -> bytes:
    """One request with header v1 (null client id), framed."""
    request = struct.pack(">hhih", api_key, version, correlation_id, -1) + body
    return struct.pack(">i", len(request)) + request


def _roundtrip(address: tuple[str, int], api_key: int, version: int, body: bytes = b"", correlation_id: int = 7) -> bytes:
    """Send one request with header v1 (null client id); return the response after the correlation id."""
    with socket.create_connection(address, timeout=30) as s:
        s.sendall(_request(api_key, version, body, correlation_id))
        size = struct.unpack(">i", _recv_exact(s, 4))[0]
        response = _recv_exact(s, size)
    assert struct.unpack_from(">i", response)[0] == correlation_id
    return response[4:]


def _recv_exact(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        data += chunk
    return data


def _api_versions(address: tuple[str, int]) -> tuple[int, dict[int, tuple[int, int]]]:
    """ApiVersions v0: (error code, {api key: (min, max)})."""
    body = _roundtrip(address, 18, 0)
    error, count = struct.unpack_from(">hi", body)
    table = {}
    for i in range(count):
        key, lo, hi = struct.unpack_from(">hhh", body, 6 + 6 * i)
        table[key] = (lo, hi)
    return error, table


def _find_coordinator(address: tuple[str, int], group: str) -> int:
    """FindCoordinator v0 for a group: the coordinator's node id."""
    key = group.encode()
    body = _roundtrip(address, 10, 0, struct.pack(">h", len(key)) + key)
    error, node_id = struct.unpack_from(">hi", body)
    assert error == 0
    return node_id


def _leaders(bootstrap: str, topic: str) -> list[int]:
    md = AdminClient({"bootstrap.servers": bootstrap, **QUIET}).list_topics(topic, timeout=10)
    partitions = md.topics[topic].partitions
    return [partitions[p].leader for p in sorted(partitions)]


# -- shape of the cluster -----------------------------------------------------


def test_brokers_match_bootstrap_and_listen(mock: MockCluster) -> None:
    assert list(mock.brokers) == [1, 2, 3]
    assert mock.bootstrap == ",".join(f"{h}:{p}" for h, p in mock.brokers.values())
    assert len({port for _, port in mock.brokers.values()}) == 3
    for address in mock.brokers.values():
        error, table = _api_versions(address)
        assert error == 0 and 0 in table and 3 in table


def test_round_robin_leaders_seen_by_a_real_client(mock: MockCluster) -> None:
    mock.create_topic("orders", 6)
    md = AdminClient({"bootstrap.servers": mock.bootstrap, **QUIET}).list_topics(timeout=10)
    assert {b.id: (b.host, b.port) for b in md.brokers.values()} == mock.brokers
    assert len(md.topics["orders"].partitions) == 6
    assert _leaders(mock.bootstrap, "orders") == [1, 2, 3, 1, 2, 3]


def test_explicit_leaders_and_set_leader(mock: MockCluster) -> None:
    mock.create_topic("moves", 3, leaders=[3, 3, 2])
    assert _leaders(mock.bootstrap, "moves") == [3, 3, 2]
    mock.set_leader("moves", 0, 1)
    # Each list_topics is a fresh Metadata request, so the move shows at once.
    assert _leaders(mock.bootstrap, "moves") == [1, 3, 2]


def test_errors_are_raised(mock: MockCluster) -> None:
    mock.create_topic("dup", 2)
    with pytest.raises(MockError, match="already exists"):
        mock.create_topic("dup", 2)
    with pytest.raises(MockError):
        mock.set_leader("dup", 0, 9)
    with pytest.raises(MockError):
        mock.set_leader("dup", 5, 1)
    with pytest.raises(MockError):
        mock.broker_down(9)
    with pytest.raises(ValueError):
        mock.create_topic("badleaders", 2, leaders=[1, 4])
    with pytest.raises(ValueError):
        mock.set_coordinator("cluster", "x", 1)


# -- fault injection ----------------------------------------------------------


def test_broker_down_refuses_connections_until_up(mock: MockCluster) -> None:
    mock.broker_down(2)
    with pytest.raises(ConnectionRefusedError):
        _api_versions(mock.brokers[2])
    assert _api_versions(mock.brokers[1])[0] == 0
    mock.broker_up(2)
    assert _api_versions(mock.brokers[2])[0] == 0


def test_set_rtt_delays_only_that_broker(mock: MockCluster) -> None:
    mock.set_rtt(3, 300)
    start = time.monotonic()
    _api_versions(mock.brokers[3])
    assert time.monotonic() - start >= 0.28
    # Only broker 3: with its answers held for a minute, broker 1 answers while broker 3 has
    # not (an order, not a duration, so that a slow machine cannot make it fail).
    mock.set_rtt(3, 60_000)
    with socket.create_connection(mock.brokers[3], timeout=30) as held:
        held.sendall(_request(18, 0))
        assert _api_versions(mock.brokers[1])[0] == 0
        readable, _, _ = select.select([held], [], [], 0)
        assert not readable, "broker 3 answered (or closed) before its round-trip time was up"


def test_push_request_errors_fail_the_next_requests_in_order(mock: MockCluster) -> None:
    mock.push_request_errors(18, [7, 15])
    assert _api_versions(mock.brokers[1])[0] == 7
    assert _api_versions(mock.brokers[2])[0] == 15
    assert _api_versions(mock.brokers[3])[0] == 0


def test_push_broker_request_errors_with_delay(mock: MockCluster) -> None:
    mock.push_broker_request_errors(2, 18, [(7, 300), (0, 0), (15, 0)])
    assert _api_versions(mock.brokers[1])[0] == 0  # other brokers unaffected
    start = time.monotonic()
    assert _api_versions(mock.brokers[2])[0] == 7
    assert time.monotonic() - start >= 0.28
    assert _api_versions(mock.brokers[2])[0] == 0
    assert _api_versions(mock.brokers[2])[0] == 15
    assert _api_versions(mock.brokers[2])[0] == 0
    with pytest.raises(MockError):
        mock.push_broker_request_errors(9, 18, [(7, 0)])


def test_set_coordinator_moves_group_coordinator(mock: MockCluster) -> None:
    mock.set_coordinator("group", "g1", 3)
    assert _find_coordinator(mock.brokers[1], "g1") == 3
    mock.set_coordinator("group", "g1", 2)
    assert _find_coordinator(mock.brokers[1], "g1") == 2


# -- API versions -------------------------------------------------------------


def test_compat_caps_are_advertised() -> None:
    with MockCluster(1) as capped, MockCluster(1, compat_caps=False) as raw:
        _, capped_table = _api_versions(capped.brokers[1])
        _, raw_table = _api_versions(raw.brokers[1])
    for api_key, max_version in COMPAT_CAPS.items():
        assert capped_table[api_key] == (0, max_version)
    # The caps must actually change something, or they are not needed.
    assert raw_table[11][1] > 5 and raw_table[14][1] > 3


def test_set_apiversion_caps_and_disables(mock: MockCluster) -> None:
    mock.set_apiversion(3, 0, 4)
    mock.set_apiversion(22, -1, -1)
    _, table = _api_versions(mock.brokers[1])
    assert table[3] == (0, 4)
    assert 22 not in table


# -- real traffic -------------------------------------------------------------


def test_produce_and_consume_100_messages(mock: MockCluster) -> None:
    topic = "traffic"
    mock.create_topic(topic, 6)
    producer = Producer({"bootstrap.servers": mock.bootstrap, "linger.ms": 5, **QUIET})
    sent = {f"k{i}".encode(): f"v{i}".encode() for i in range(100)}
    failures: list[object] = []
    for key, value in sent.items():
        producer.produce(topic, value, key, on_delivery=lambda err, _msg: err and failures.append(err))
    assert producer.flush(30) == 0
    assert failures == []

    consumer = Consumer(
        {
            "bootstrap.servers": mock.bootstrap,
            "group.id": f"g-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            # The mock holds a rejoin for session timeout - 1 s (see tests/support/round_trip.py).
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            **QUIET,
        }
    )
    received: dict[bytes, bytes] = {}
    partitions: set[int] = set()

    def consume() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None:
            assert msg.error() is None, msg.error()
            received[msg.key()] = msg.value()
            partitions.add(msg.partition())
        return len(received) >= len(sent)

    try:
        consumer.subscribe([topic])
        wait_for(f"the {len(sent)} messages", consume, 120, seen=lambda: f"{len(received)} messages")
    finally:
        consumer.close()
    assert received == sent
    # Keys hash over the partitions, so traffic touched all three leaders.
    assert len(partitions) > 3


# -- lifetime -----------------------------------------------------------------


def test_close_is_idempotent_and_guards_later_calls() -> None:
    cluster = MockCluster(2)
    address = cluster.brokers[1]
    assert _api_versions(address)[0] == 0
    cluster.close()
    cluster.close()
    assert cluster.closed
    with pytest.raises(OSError):
        _api_versions(address)
    with pytest.raises(MockError, match="closed"):
        cluster.create_topic("late", 1)
