"""kfan governing its clients, end to end: ACLs judged by the real kfan process (and reloaded live), and the audit
log of who did what (connections, requests, decisions), with its metrics; the audit queue's overflow policies and
the file's reopening on SIGHUP (for logrotate).

Clients are confluent-kafka (librdkafka) logged in to kfan with SASL PLAIN, in front of Tansu (whose admin APIs
the embedded mock lacks); that kfan's answers are Kafka's own is the differential test's (tests/test_authorization_differential.py).
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.runtime.audit import Audit, FileSink
from proxy.security.users import add_user
from proxy.server.governance import ClientGovernance, Governance
from tests.support.json_lines import whole_json_lines
from tests.support.kfan import Kfan, kfan_at
from tests.support.metrics import http_get, metrics_port_in, parse_samples
from tests.support.tansu import Tansu
from tests.support.waiting import wait_for

PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}

ACLS = """
[[acls]]
principal = "User:alice"
resource_type = "TOPIC"
resource_name = "gov-"
pattern_type = "PREFIXED"
operations = ["CREATE", "WRITE", "DESCRIBE"]

[[acls]]
principal = "User:*"
resource_type = "TOPIC"
resource_name = "gov-"
pattern_type = "PREFIXED"
operation = "DELETE"
permission = "DENY"
"""


@pytest.fixture(scope="module")
def governed(tansu: Tansu, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Kfan, Path, Path]]:
    d = tmp_path_factory.mktemp("governance")
    users = d / "users.toml"
    for name, password in PASSWORDS.items():
        add_user(users, name, password, ("SCRAM-SHA-512",))  # PLAIN logins are checked against it
    acls, audit = d / "acls.toml", d / "audit.log"
    acls.write_text(ACLS)
    options = [
        "--client-auth",
        "sasl",
        "--client-users",
        str(users),
        "--client-sasl-mechanisms",
        "PLAIN",
        "--metrics-listen",
        "127.0.0.1:0",
    ]
    options += ["--authorizer", "acls", "--acl-file", str(acls), "--acl-file-check", "0.2", "--audit-log", str(audit)]
    with kfan_at(tansu.bootstrap, *options) as k:
        yield k, acls, audit


def _config(k: Kfan, user: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": k.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": PASSWORDS[user],
    }


def _create(admin: AdminClient, topic: str) -> KafkaError | None:
    try:
        admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=10)[topic].result(30)
    except KafkaException as e:
        return e.args[0]
    return None


def _delete(admin: AdminClient, topic: str) -> KafkaError | None:
    try:
        admin.delete_topics([topic], operation_timeout=10)[topic].result(30)
    except KafkaException as e:
        return e.args[0]
    return None


def _samples(k: Kfan, name: str) -> dict[str, float]:
    _, text = http_get(f"http://127.0.0.1:{metrics_port_in(k.log)}/metrics")
    return dict(parse_samples(text).get(name, []))


def test_acls_judge_each_client_and_the_audit_log_says_who_did_what(governed: tuple[Kfan, Path, Path]) -> None:
    k, _, audit = governed
    topic = f"gov-{uuid.uuid4().hex[:8]}"
    alice, bob = AdminClient(_config(k, "alice")), AdminClient(_config(k, "bob"))
    assert _create(alice, topic) is None
    refused = _create(bob, f"gov-{uuid.uuid4().hex[:8]}")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    denied = _delete(alice, topic)  # DENY for everyone beats nothing: not even alice deletes
    assert denied is not None and denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    producer = Producer({**_config(k, "alice"), "linger.ms": 0})
    reports: list[KafkaError | None] = []
    producer.produce(topic, b"v", on_delivery=lambda err, _m: reports.append(err))
    assert producer.flush(30) == 0 and reports == [None]
    del producer, alice, bob

    def requests_logged() -> list[dict[str, Any]]:
        return [e for e in whole_json_lines(audit) if e["event"] == "request" and any(r["name"] == topic for r in e["resources"])]

    wait_for("the audit events of alice's requests", lambda: {e["api"] for e in requests_logged()} >= {"CreateTopics", "DeleteTopics"}, 20)
    by_api = {e["api"]: e for e in requests_logged()}
    created, deleted = by_api["CreateTopics"], by_api["DeleteTopics"]
    assert created["principal"] == "User:alice" and created["authorization"] == "allowed" and created["errors"] == {}
    assert {"type": "TOPIC", "name": topic, "operation": "CREATE", "allowed": True} in created["resources"]
    assert deleted["authorization"] == "partial" and deleted["errors"] == {"29": 1}  # may describe, may not delete
    assert {"type": "TOPIC", "name": topic, "operation": "DELETE", "allowed": False} in deleted["resources"]
    assert created["bytes_in"] > 0 and created["bytes_out"] > 0 and created["latency_ms"] >= 0
    assert "Produce" not in by_api  # the data path is not audited by default
    events = whole_json_lines(audit)
    opened = [e for e in events if e["event"] == "connection.authenticated" and e["principal"] == "User:bob"]
    assert opened and opened[0]["mechanism"] == "PLAIN"
    wait_for(
        "connections closed in the audit log",
        lambda: any(e["event"] == "connection.closed" and e["principal"] == "User:bob" for e in whole_json_lines(audit)),
        20,
    )
    text = audit.read_text()
    assert all(p not in text for p in PASSWORDS.values()), "a password in the audit log"

    decisions = _samples(k, "kfan_authorization_decisions_total")
    assert decisions['{api_key="20",operation="DELETE",resource_type="TOPIC",result="denied"}'] >= 1
    assert decisions['{api_key="19",operation="CREATE",resource_type="TOPIC",result="allowed"}'] >= 1
    assert _samples(k, "kfan_audit_events_total")['{kind="request"}'] >= 2
    assert any("is Denied operation = DELETE" in line and "User:alice" in line for line in k.log)


def test_a_changed_acl_file_applies_to_the_next_request_and_an_invalid_one_changes_nothing(governed: tuple[Kfan, Path, Path]) -> None:
    k, acls, _ = governed
    admin = AdminClient(_config(k, "bob"))
    topic = f"gov-{uuid.uuid4().hex[:8]}"
    assert _create(admin, topic) is not None  # bob may not create
    try:
        acls.write_text(
            ACLS
            + '\n[[acls]]\nprincipal = "User:bob"\nresource_type = "TOPIC"\nresource_name = "gov-"\npattern_type = "PREFIXED"\noperation = "CREATE"\n'
        )
        wait_for("the new ACLs in force", lambda: _samples(k, "kfan_acl_bindings").get("", 0) == 5, 20)
        assert _create(admin, topic) is None  # the same connection, judged by the new ACLs
        invalid_before = _samples(k, "kfan_acl_reloads_total").get('{result="invalid"}', 0)
        acls.write_text(ACLS + "\n[[acls]]\nprincipal = bob\n")  # not a principal, and no resource
        wait_for(
            "the invalid file reported", lambda: _samples(k, "kfan_acl_reloads_total").get('{result="invalid"}', 0) > invalid_before, 20
        )
        assert _create(admin, f"gov-{uuid.uuid4().hex[:8]}") is None  # the ACLs in force stayed
        assert any("ACL file not reloaded" in line for line in k.log)
    finally:
        acls.write_text(ACLS)  # as the module's other tests expect them
        wait_for("the module's ACLs back", lambda: _samples(k, "kfan_acl_bindings").get("", 0) == 4, 20)


def test_sighup_reopens_the_audit_log_after_logrotate_moved_it(governed: tuple[Kfan, Path, Path]) -> None:
    k, _, audit = governed
    rotated = audit.with_suffix(".1")
    os.replace(audit, rotated)
    os.kill(k.pid, signal.SIGHUP)
    wait_for("the SIGHUP heard", lambda: any("received SIGHUP: reloading the configuration" in line for line in k.log), 20)
    assert _create(AdminClient(_config(k, "alice")), f"gov-{uuid.uuid4().hex[:8]}") is None
    wait_for(
        "a new audit file",
        lambda: audit.exists() and any(e["api"] == "CreateTopics" for e in whole_json_lines(audit) if e["event"] == "request"),
        20,
    )


class _Stalled:
    """A sink that takes nothing until let go."""

    def __init__(self) -> None:
        self.go = trio.Event()
        self.lines: list[str] = []

    async def write(self, lines: Any) -> None:
        await self.go.wait()
        self.lines.extend(lines)

    def reopen(self) -> None:
        pass

    def close(self) -> None:
        pass


async def test_a_full_audit_queue_drops_and_counts_or_blocks_as_configured() -> None:
    sink = _Stalled()
    dropping = Audit(sink, queue_events=2)
    blocking = Audit(sink, queue_events=2, block=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(dropping.run)
        nursery.start_soon(blocking.run)
        for i in range(3):  # the first is taken by the (stalled) writer, two fill the queue
            await trio.sleep(0.01)
            dropping.offer("request", {"n": i})
        assert dropping.offer("request", {"n": 9}) is False and dropping.dropped == 1
        for i in range(3):
            await blocking.put("request", {"n": i})
            await trio.sleep(0.01)
        with trio.move_on_after(0.3) as waited:
            await blocking.put("request", {"n": 3})  # waits for room: nothing dropped
        assert waited.cancelled_caught and blocking.dropped == 0
        sink.go.set()
        await blocking.put("request", {"n": 4})
        await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert sum(1 for line in sink.lines if '"n":4' in line) == 1


def test_the_audit_file_takes_every_batch_whole(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    sink = FileSink(str(path))

    async def main() -> None:
        audit = Audit(sink)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(audit.run)
            for i in range(2500):
                audit.offer("request", {"n": i, "text": "x" * 50})
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert [json.loads(line)["n"] for line in path.read_text().splitlines()] == list(range(2500))


def test_the_audit_log_goes_to_a_topic_on_the_cluster(tansu: Tansu) -> None:
    """``--audit-topic``: each batch produced to the topic with kfan's own identity; read back from the cluster."""
    audit_topic, topic = f"gov-audit-{uuid.uuid4().hex[:6]}", f"gov-{uuid.uuid4().hex[:8]}"
    direct = AdminClient({"bootstrap.servers": tansu.bootstrap})
    assert _create(direct, audit_topic) is None
    with kfan_at(tansu.bootstrap, "--audit-topic", audit_topic) as k:
        assert _create(AdminClient({"bootstrap.servers": k.bootstrap}), topic) is None
        consumer = Consumer(
            {"bootstrap.servers": tansu.bootstrap, "group.id": f"gov-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"}
        )
        consumer.subscribe([audit_topic])
        events: list[dict[str, Any]] = []

        def created_logged() -> bool:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                events.append(json.loads(message.value()))
            return any(
                e["event"] == "request" and e["api"] == "CreateTopics" and any(r["name"] == topic for r in e["resources"]) for e in events
            )

        try:
            wait_for(
                "the CreateTopics event on the audit topic",
                created_logged,
                60,
                seen=lambda: f"events {events}; kfan: {''.join(k.log[-20:])}",
            )
        finally:
            consumer.close()
    (created,) = [e for e in events if e["event"] == "request" and e["api"] == "CreateTopics"]
    assert created["authorization"] == "none" and created["principal"] == "User:ANONYMOUS"
    assert {"type": "TOPIC", "name": topic, "operation": "CREATE"} in created["resources"]  # named, not judged
    assert any(e["event"] == "connection.opened" for e in events)


async def test_a_client_certificate_is_an_authentication_in_the_audit_log() -> None:
    """mTLS: the connection is authenticated by its certificate as it opens (SASL logins say so when they end)."""
    sink = _Stalled()
    sink.go.set()
    audit = Audit(sink)
    governed = ClientGovernance(Governance(audit=audit), 7, "10.0.0.7:5000", lambda: "CN=app,O=Org")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(audit.run)
        governed.connection_event("connection.opened", mechanism="mTLS")
        governed.connection_event("connection.closed", reason="eof")
        await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    events = [json.loads(line) for line in sink.lines]
    assert [e["event"] for e in events] == ["connection.opened", "connection.authenticated", "connection.closed"]
    assert {e["principal"] for e in events} == {"User:CN=app,O=Org"} and events[1]["mechanism"] == "mTLS"
    assert events[2]["requests"] == 0 and events[2]["duration_s"] >= 0
