"""The TLS + SASL test backend itself (tests/support/secure_cluster.py), checked with librdkafka alone, no kfan.

librdkafka implements TLS, PLAIN, SCRAM, OAUTHBEARER and KIP-368
re-authentication independently of both kfan and the SASL front, so a run
here shows the backend behaves like a secured Kafka cluster before kfan is
tested against it.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from scramp import ScramClient

from proxy.kafka import headers, schema
from proxy.kafka.frames import frame
from tests.support.secure_cluster import SecureCluster
from tests.support.waiting import wait_for

_names = iter(range(1, 1_000_000))


def new_topic(sc: SecureCluster, partitions: int = 6) -> str:
    name = f"sec{next(_names)}-{int(time.time() * 1000) % 100000}"
    sc.mock.create_topic(name, partitions)
    return name


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    with SecureCluster.for_tests(tmp_path_factory) as sc:
        yield sc
        assert sc.alive(), sc.front_output() + sc.stunnel_output()
        assert "failed:" not in sc.front_output(), sc.front_output()


def produce(conf: dict[str, Any], topic: str, values: list[bytes], timeout: float = 15) -> list[Any]:
    """Produce ``values`` and wait for every delivery report; the errors reported."""
    errors: list[Any] = []
    producer = Producer({**conf, "linger.ms": 5})

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)

    for i, value in enumerate(values):
        producer.produce(topic, value=value, key=str(i).encode(), on_delivery=report)
    assert producer.flush(timeout) == 0, "deliveries still pending"
    return errors


def consume_all(conf: dict[str, Any], topic: str, partitions: int, count: int, timeout: float = 15) -> list[bytes]:
    """Read ``count`` records from the beginning of every partition (no group: assign)."""
    consumer = Consumer({**conf, "group.id": f"g-{topic}", "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(msg.value())
        return got
    finally:
        consumer.close()


def wait_for_error(conf: dict[str, Any], timeout: float = 10) -> list[KafkaError]:
    """Errors a producer reports while trying to reach the cluster."""
    errors: list[KafkaError] = []
    producer = Producer({**conf, "error_cb": errors.append})
    deadline = time.monotonic() + timeout
    while not errors and time.monotonic() < deadline:
        producer.poll(0.1)
    return errors


def test_scram_sha_512_produce_and_consume(secure: SecureCluster) -> None:
    topic = new_topic(secure)
    conf = secure.librdkafka_config("SCRAM-SHA-512", "alice")
    values = [f"record-{i}".encode() for i in range(100)]
    assert produce(conf, topic, values) == []
    assert sorted(consume_all(conf, topic, 6, 100)) == sorted(values)
    seen = [e for e in secure.front_events("authenticated") if e["principal"] == "alice" and e["mechanism"] == "SCRAM-SHA-512"]
    assert {e["broker"] for e in seen} == {1, 2, 3}, "every broker's front authenticated alice"


def test_scram_sha_256_and_plain_principals(secure: SecureCluster) -> None:
    topic = new_topic(secure, 3)
    assert produce(secure.librdkafka_config("SCRAM-SHA-256", "bob"), topic, [b"a", b"b"]) == []
    assert produce(secure.librdkafka_config("PLAIN", "kfan"), topic, [b"c"]) == []
    pairs = {(e["principal"], e["mechanism"]) for e in secure.front_events("authenticated")}
    assert {("bob", "SCRAM-SHA-256"), ("kfan", "PLAIN")} <= pairs


def test_plain_wrong_password_fails(secure: SecureCluster) -> None:
    before = len(secure.front_events("failed"))
    errors = wait_for_error(secure.librdkafka_config("PLAIN", "alice", password="not-the-password"))
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors
    assert "Invalid username or password" in errors[0].str()
    failed = secure.front_events("failed")[before:]
    assert failed and all(e["mechanism"] == "PLAIN" and e["principal"] is None for e in failed), failed


def test_oauthbearer_token_and_bad_token(secure: SecureCluster) -> None:
    topic = new_topic(secure, 3)
    conf = secure.librdkafka_config("OAUTHBEARER")
    good = {**conf, "oauth_cb": lambda _config: (secure.token("svc-orders", 60), time.time() + 60)}
    assert produce(good, topic, [b"x"]) == []
    assert any(e["principal"] == "svc-orders" and e["mechanism"] == "OAUTHBEARER" for e in secure.front_events("authenticated"))

    expired = {**conf, "oauth_cb": lambda _config: (secure.token("svc-late", -120), time.time() + 60)}
    errors = wait_for_error(expired)
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors
    assert any("expired" in e.get("reason", "") for e in secure.front_events("failed"))


def _api_versions_request(correlation_id: int) -> bytes:
    body = struct.pack(">hhih", 18, 0, correlation_id, -1)  # ApiVersions v0, null client id
    return struct.pack(">i", len(body)) + body


def _read_until_closed(sock: socket.socket | ssl.SSLSocket, timeout: float = 5) -> bytes:
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionError, ssl.SSLError):
        pass
    return data


def test_plaintext_and_unauthenticated_requests_are_refused(secure: SecureCluster) -> None:
    host, port = secure.brokers[1]
    # Plaintext Kafka on the TLS port: the TLS server never passes it on.
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(_api_versions_request(7))
        data = _read_until_closed(sock)
    assert data == b"" or data[0] == 0x15, f"a TLS alert or nothing, not a Kafka answer: {data[:32]!r}"

    # TLS but no SASL: ApiVersions is answered (listing the SASL APIs), Metadata closes the connection.
    ctx = ssl.create_default_context(cafile=str(secure.ca_file))
    with ctx.wrap_socket(socket.create_connection((host, port), timeout=5), server_hostname="localhost") as tls:
        tls.sendall(_api_versions_request(8))
        size = struct.unpack(">i", tls.recv(4))[0]
        answer = b""
        while len(answer) < size:
            answer += tls.recv(size - len(answer))
        cid, error, count = struct.unpack_from(">ihi", answer)
        keys = {struct.unpack_from(">hhh", answer, 10 + 6 * i)[0]: struct.unpack_from(">hhh", answer, 10 + 6 * i)[1:] for i in range(count)}
        assert (cid, error) == (8, 0)
        assert keys[17] == (0, 1) and keys[36] == (0, 2), keys
        client_id = f"refused-{uuid.uuid4().hex[:12]}".encode()  # this connection's events carry it
        metadata = struct.pack(">hhih", 3, 1, 9, len(client_id)) + client_id + struct.pack(">i", -1)  # Metadata v1, all topics
        tls.sendall(struct.pack(">i", len(metadata)) + metadata)
        assert _read_until_closed(tls) == b""
    refused = [e for e in secure.front_events("refused") if e["client_id"] == client_id.decode()]
    assert refused and refused[0]["api_key"] == 3 and refused[0]["reason"] == "before authentication", secure.front_events("refused")


def test_reauthentication_keeps_every_record(tmp_path_factory: pytest.TempPathFactory) -> None:
    with SecureCluster.for_tests(tmp_path_factory, session_lifetime_ms=3000) as sc:
        topic = new_topic(sc)
        conf = sc.librdkafka_config("SCRAM-SHA-256", "alice")
        errors: list[Any] = []
        producer = Producer({**conf, "linger.ms": 5, "error_cb": errors.append})
        delivered: list[bytes] = []

        def report(err: Any, msg: Any) -> None:
            if err is None:
                delivered.append(msg.value())
            else:
                errors.append(err)

        sent: list[bytes] = []
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            value = f"r{len(sent)}".encode()
            producer.produce(topic, value=value, on_delivery=report)
            sent.append(value)
            producer.poll(0.02)
        assert producer.flush(10) == 0
        assert errors == [], errors
        assert sorted(delivered) == sorted(sent)

        events = sc.front_events()
        reauth = [e for e in events if e["event"] == "reauthenticated"]
        assert len(reauth) >= 3, events
        assert all(e["principal"] == "alice" and e["session_lifetime_ms"] == 3000 for e in reauth)
        assert not [e for e in events if e["event"] in ("expired", "failed", "refused")], events
        # The same connections kept going: re-authentications far outnumber logins.
        peers = {e["peer"] for e in reauth}
        assert peers <= {e["peer"] for e in events if e["event"] == "authenticated"}

        assert sorted(consume_all(conf, topic, 6, len(sent))) == sorted(sent)
        assert "failed:" not in sc.front_output(), sc.front_output()


def test_mtls_requires_a_client_certificate(tmp_path_factory: pytest.TempPathFactory) -> None:
    with SecureCluster.for_tests(tmp_path_factory, mtls=True, client_cn="kfan-mtls") as sc:
        topic = new_topic(sc, 3)
        conf = sc.librdkafka_config("SCRAM-SHA-512", "kfan")
        assert produce(conf, topic, [b"m1", b"m2"]) == []
        wait_for("the client certificate in stunnel's log", lambda: "CN=kfan-mtls" in sc.stunnel_output(), seen=sc.stunnel_output)

        without = {k: v for k, v in conf.items() if k not in ("ssl.certificate.location", "ssl.key.location")}
        errors = wait_for_error(without)
        assert errors and errors[0].code() in (KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN), errors
        wait_for("stunnel's refusal in its log", lambda: "peer did not return a certificate" in sc.stunnel_output(), seen=sc.stunnel_output)


class Wire:
    """A raw Kafka client to one broker of the cluster, over TLS or straight to its SASL front (kio-based codec)."""

    def __init__(self, sc: SecureCluster, broker: int = 1, *, tls: bool = True) -> None:
        self.sock: socket.socket = socket.create_connection(sc.brokers[broker] if tls else sc.fronts[broker], timeout=10)
        if tls:
            ctx = ssl.create_default_context(cafile=str(sc.ca_file))
            self.sock = ctx.wrap_socket(self.sock, server_hostname="localhost")
        # The fronts log each request's client id: this connection's events are the ones with this id
        # (its port may have been an earlier connection's too).
        self.client_id = f"wire-{uuid.uuid4().hex[:12]}"

    def events(self, sc: SecureCluster) -> list[dict[str, Any]]:
        """The fronts' events for this connection's requests."""
        return [e for e in sc.front_events() if e["client_id"] == self.client_id]

    def request(self, api_key: int, version: int, cid: int, body: dict[str, Any]) -> bytes:
        spec = schema.request_spec(api_key, version)
        return frame(
            [headers.encode_request_header(api_key, version, cid, self.client_id), *schema.encode_body(spec, {**spec.blank(), **body})]
        )

    def send(self, *requests: bytes) -> None:
        self.sock.sendall(b"".join(requests))

    def receive(self, api_key: int, version: int) -> tuple[int, dict[str, Any]]:
        """The next answer's correlation id and body."""
        size = struct.unpack(">i", self._exactly(4))[0]
        payload = self._exactly(size)
        return headers.correlation_id_of(payload), headers.decode_response(payload, api_key, version)

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def login(self, user: str, password: str, cid: int = 1) -> dict[str, Any]:
        self.send(
            self.request(17, 1, cid, {"mechanism": "PLAIN"}), self.request(36, 2, cid + 1, {"auth_bytes": f"\0{user}\0{password}".encode()})
        )
        assert self.receive(17, 1) == (cid, {"error_code": 0, "mechanisms": ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]})
        answer_cid, body = self.receive(36, 2)
        assert answer_cid == cid + 1
        return body

    def close(self) -> None:
        self.sock.close()


def test_local_answers_wait_for_relayed_ones(secure: SecureCluster) -> None:
    wire = Wire(secure, 1)
    try:
        assert wire.login("alice", "alice-secret")["error_code"] == 0
        secure.mock.set_rtt(1, 400)  # the broker's answer comes well after the front could answer the handshake
        try:
            wire.send(
                wire.request(3, 4, 10, {"topics": None}),
                wire.request(17, 1, 11, {"mechanism": "PLAIN"}),
                wire.request(36, 2, 12, {"auth_bytes": b"\0alice\0alice-secret"}),
            )
            order = [wire.receive(3, 4)[0], wire.receive(17, 1)[0], wire.receive(36, 2)[0]]
        finally:
            secure.mock.set_rtt(1, 0)
        assert order == [10, 11, 12]
        mine = wire.events(secure)
        assert [e["event"] for e in mine] == ["authenticated", "reauthenticated"], mine

        # Re-authentication may not change the principal.
        wire.send(wire.request(17, 1, 13, {"mechanism": "PLAIN"}), wire.request(36, 2, 14, {"auth_bytes": b"\0bob\0bob-secret"}))
        assert wire.receive(17, 1)[1]["error_code"] == 0
        cid, body = wire.receive(36, 2)
        assert (cid, body["error_code"]) == (14, 58) and "Cannot change principals" in body["error_message"]
        assert _read_until_closed(wire.sock) == b""
    finally:
        wire.close()


def test_expired_session_is_closed(tmp_path_factory: pytest.TempPathFactory) -> None:
    with SecureCluster.for_tests(tmp_path_factory, session_lifetime_ms=800, mechanisms=["PLAIN"]) as sc:
        wire = Wire(sc, 2)
        try:
            wire.send(wire.request(17, 1, 1, {"mechanism": "SCRAM-SHA-256"}))
            assert wire.receive(17, 1) == (1, {"error_code": 33, "mechanisms": ["PLAIN"]})
            assert _read_until_closed(wire.sock) == b""
        finally:
            wire.close()

        wire = Wire(sc, 2)
        try:
            wire.send(wire.request(17, 1, 1, {"mechanism": "PLAIN"}), wire.request(36, 1, 2, {"auth_bytes": b"\0bob\0bob-secret"}))
            assert wire.receive(17, 1)[1]["error_code"] == 0
            assert wire.receive(36, 1)[1] == {"error_code": 0, "error_message": None, "auth_bytes": b"", "session_lifetime": 800}
            wire.send(wire.request(3, 4, 3, {"topics": None}))
            assert wire.receive(3, 4)[0] == 3
            time.sleep(1.0)
            wire.send(wire.request(3, 4, 4, {"topics": None}))
            assert _read_until_closed(wire.sock) == b""
        finally:
            wire.close()
        expired = sc.front_events("expired")
        assert [(e["principal"], e["api_key"], e["broker"]) for e in expired] == [("bob", 3, 2)], sc.front_events()
        assert [e["reason"] for e in sc.front_events("failed")] == ["unsupported mechanism"]


def test_scram_straight_to_a_front(secure: SecureCluster) -> None:
    """The SASL fronts also serve plaintext clients (no PROXY line); SCRAM checked against scramp's client."""
    wire = Wire(secure, 3, tls=False)
    try:
        scram = ScramClient(["SCRAM-SHA-256"], "bob", "bob-secret")
        wire.send(
            wire.request(17, 1, 1, {"mechanism": "SCRAM-SHA-256"}),
            wire.request(36, 1, 2, {"auth_bytes": scram.get_client_first().encode()}),
        )
        assert wire.receive(17, 1)[1]["error_code"] == 0
        cid, first = wire.receive(36, 1)
        assert (cid, first["error_code"]) == (2, 0)
        scram.set_server_first(bytes(first["auth_bytes"]).decode())
        wire.send(wire.request(36, 1, 3, {"auth_bytes": scram.get_client_final().encode()}))
        cid, final = wire.receive(36, 1)
        assert (cid, final["error_code"]) == (3, 0)
        scram.set_server_final(bytes(final["auth_bytes"]).decode())  # the server proved it knows the password too
        wire.send(wire.request(3, 4, 4, {"topics": None}))
        cid, metadata = wire.receive(3, 4)
        assert cid == 4 and sorted(b["node_id"] for b in metadata["brokers"]) == [1, 2, 3]
        assert {(b["host"], b["port"]) for b in metadata["brokers"]} == set(secure.brokers.values()), "the TLS addresses are advertised"
    finally:
        wire.close()
    mine = wire.events(secure)
    assert [(e["event"], e["principal"], e["mechanism"], e["broker"]) for e in mine] == [("authenticated", "bob", "SCRAM-SHA-256", 3)]
