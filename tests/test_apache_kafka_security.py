"""kfan against Apache Kafka's own security: SASL over TLS to the brokers, and Kafka's authorizer judging each client.

The session's Apache Kafka cluster has a SASL_SSL listener on every broker
(SCRAM-SHA-512, PLAIN, unsecured OAUTHBEARER) and ``StandardAuthorizer`` with
super user ``kfan`` (tests/support/apache_kafka/security.py). Here:

- kfan logs in to the brokers as itself with SCRAM-SHA-512 over TLS, and with
  an OAUTHBEARER token, and clients round-trip through it;
- with ``--broker-identity client`` the brokers judge each client by its own
  principal with real ACLs: alice may write and read ``orders`` and use group
  ``orders-app``, bob may only read ``orders``. bob's produce gets
  TOPIC_AUTHORIZATION_FAILED from the brokers, and Kafka's authorizer log
  names alice and bob, never kfan, for those requests.

The ACLs are set with Kafka's own ``kafka-acls`` through kfan, and listed
through kfan and directly with the same result.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.apache_kafka.security import AUDIENCE, SCRAM, Secured, kfan_to_brokers
from tests.support.apache_kafka.tools import run_tool
from tests.support.client_security import ClientSecurity
from tests.support.kfan import Kfan, kfan_at
from tests.support.round_trip import check_round_trip, confluent_kafka_round_trip, keyed_records
from tests.support.waiting import wait_for

PARTITIONS = 6
ORDERS, ORDERS_APP = "orders", "orders-app"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _secured(kafka: KafkaCluster) -> Secured:
    assert kafka.secured is not None
    return kafka.secured


def _acls(kafka: KafkaCluster, bootstrap: str, *args: str) -> str:
    return run_tool("kafka-acls", "--bootstrap-server", bootstrap, *args).out


def _listed(out: str) -> list[str]:
    """``kafka-acls --list`` output, one line per binding, in a stable order."""
    return sorted(line.strip() for line in out.splitlines() if "principal=" in line)


@pytest.mark.parametrize("mechanism", [SCRAM, "OAUTHBEARER"])
def test_kfan_logs_in_to_the_brokers_over_tls(apache_kafka: KafkaCluster, tmp_path: Path, mechanism: str) -> None:
    """kfan's own identity at the brokers: SCRAM-SHA-512 as ``kfan``, or an OAUTHBEARER token for ``kfan-oauth``
    (granted all on the topic and group by an ACL); Kafka's authorizer log shows the principal the brokers saw."""
    topic, group = _name("secure"), _name("secure-g")
    apache_kafka.create_topic(topic, PARTITIONS)
    user = "kfan" if mechanism == SCRAM else f"kfan-oauth-{uuid.uuid4().hex[:6]}"
    if mechanism == "OAUTHBEARER":  # not a super user: it needs ACLs, like any principal
        for resource in (("--topic", topic), ("--group", group)):
            _acls(apache_kafka, apache_kafka.bootstrap, "--add", "--allow-principal", f"User:{user}", "--operation", "All", *resource)
    records = keyed_records(600)
    with kfan_at(apache_kafka.secure_bootstrap, *kfan_to_brokers(_secured(apache_kafka), tmp_path, mechanism, user)) as k:
        trip = confluent_kafka_round_trip(k.bootstrap, topic, group, records)
    check_round_trip(trip.consumed, records, PARTITIONS)
    wait_for(
        f"the brokers' authorizer to log {user} writing {topic}",
        lambda: re.search(
            rf"User:{re.escape(user)} is Allowed operation = WRITE .*Topic:LITERAL:{re.escape(topic)}", apache_kafka.authorizer_log()
        ),
        30,
    )


@pytest.fixture(scope="module")
def orders(apache_kafka: KafkaCluster, kfan_kafka: Kfan) -> str:
    """Topic ``orders`` and its ACLs, set with kafka-acls through kfan: alice writes and reads it and uses group
    ``orders-app``; bob only reads it."""
    apache_kafka.create_topic(ORDERS, PARTITIONS)
    through = kfan_kafka.bootstrap
    _acls(apache_kafka, through, "--add", "--allow-principal", "User:alice", "--producer", "--topic", ORDERS)
    _acls(apache_kafka, through, "--add", "--allow-principal", "User:alice", "--consumer", "--topic", ORDERS, "--group", ORDERS_APP)
    _acls(apache_kafka, through, "--add", "--allow-principal", "User:bob", "--operation", "Read", "--topic", ORDERS)
    return ORDERS


def test_kafka_acls_through_kfan_list_what_the_brokers_hold(apache_kafka: KafkaCluster, kfan_kafka: Kfan, orders: str) -> None:
    direct = _listed(_acls(apache_kafka, apache_kafka.bootstrap, "--list", "--topic", orders))
    through = _listed(_acls(apache_kafka, kfan_kafka.bootstrap, "--list", "--topic", orders))
    assert through == direct
    assert any("principal=User:bob" in line and "operation=READ" in line for line in direct), direct
    assert not any("principal=User:bob" in line and "operation=WRITE" in line for line in direct), direct
    assert any("principal=User:alice" in line and "operation=WRITE" in line for line in direct), direct


@pytest.fixture(scope="module")
def kfan_as_each_client(apache_kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kfan]:
    """kfan that logs each client in to the brokers with the client's own PLAIN credentials (kfan's own
    metadata requests as ``kfan``, with SCRAM-SHA-512)."""
    to_brokers = kfan_to_brokers(_secured(apache_kafka), tmp_path_factory.mktemp("kfan-broker-secrets"))
    with kfan_at(apache_kafka.secure_bootstrap, *to_brokers, "--client-auth", "sasl", "--broker-identity", "client") as k:
        yield k


def _as(kafka: KafkaCluster, user: str) -> ClientSecurity:
    assert kafka.secured is not None
    return ClientSecurity(mechanism="PLAIN", username=user, password=kafka.secured.users[user])


def test_the_brokers_authorize_each_client_by_its_own_principal(apache_kafka: KafkaCluster, kfan_as_each_client: Kfan, orders: str) -> None:
    k = kfan_as_each_client
    records = keyed_records(500)
    alice = confluent_kafka_round_trip(k.bootstrap, orders, ORDERS_APP, records, _as(apache_kafka, "alice"))
    check_round_trip(alice.consumed, records, PARTITIONS)
    assert alice.committed is not None and sum(o for o in alice.committed.values() if o is not None) == len(records)

    # bob's produce: refused by the brokers, per partition, with the error a broker gives.
    bob = _as(apache_kafka, "bob").librdkafka()
    producer = Producer({"bootstrap.servers": k.bootstrap, "message.timeout.ms": 20_000, **bob})
    reports: list[KafkaError | None] = []
    producer.produce(orders, key=b"bob", value=b"never", on_delivery=lambda err, _msg: reports.append(err))
    assert producer.flush(60) == 0
    assert len(reports) == 1 and reports[0] is not None, reports
    assert reports[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, reports[0]

    # bob reads what alice wrote (no group: he may use none).
    consumer = Consumer({"bootstrap.servers": k.bootstrap, "group.id": "unused", "enable.auto.commit": False, **bob})
    consumer.assign([TopicPartition(orders, p, 0) for p in range(PARTITIONS)])
    seen: list[bytes] = []
    try:

        def read_all() -> bool:
            seen.extend(m.value() for m in consumer.consume(500, 0.5) if m.error() is None)
            return len(seen) >= len(records)

        wait_for("bob to read alice's records", read_all, 60)
    finally:
        consumer.close()
    assert sorted(seen) == sorted(v for _, v in records)

    # Kafka's authorizer saw alice and bob on those requests, never kfan.
    def decisions() -> str:
        return "\n".join(line for line in apache_kafka.authorizer_log().splitlines() if f"Topic:LITERAL:{orders}" in line)

    wait_for("bob's refused write in the authorizer log", lambda: "User:bob is Denied operation = WRITE" in decisions(), 30)
    log = decisions()
    assert "User:alice is Allowed operation = WRITE" in log, log[-3000:]
    assert "User:alice is Allowed operation = READ" in log, log[-3000:]
    assert "User:bob is Allowed operation = READ" in log, log[-3000:]
    assert not re.search(r"User:kfan is \w+ operation = (WRITE|READ)", log), "kfan wrote or read orders as itself"


def test_oauthbearer_clients_carried_to_the_brokers(apache_kafka: KafkaCluster, orders: str, tmp_path: Path) -> None:
    """An OAUTHBEARER client through ``--broker-identity client``: kfan checks the token against the JWKS and hands
    the same token to the brokers' ``OAUTH`` listener, whose validator (Kafka's, on the same JWKS) names the principal.

    Kafka's unsecured validator (the ``SASL_SSL`` listener) accepts only unsigned tokens, which kfan refuses from
    clients; carrying needs brokers that validate signed tokens, as production brokers do."""
    secured = apache_kafka.secured
    assert secured is not None
    user = f"carol-{uuid.uuid4().hex[:6]}"  # a principal of this test's own: its decisions are its own lines
    _acls(apache_kafka, apache_kafka.bootstrap, "--add", "--allow-principal", f"User:{user}", "--producer", "--topic", orders)
    to_brokers = kfan_to_brokers(_secured(apache_kafka), tmp_path)
    client_auth = (
        "--client-auth",
        "sasl",
        "--broker-identity",
        "client",
        "--client-oauth-jwks",
        str(secured.jwks_file),
        "--client-oauth-audience",
        AUDIENCE,
    )
    records = keyed_records(300)
    with kfan_at(apache_kafka.oauth_bootstrap, *to_brokers, *client_auth) as k:
        security = ClientSecurity(mechanism="OAUTHBEARER", token=lambda: secured.token(user))
        producer = Producer({"bootstrap.servers": k.bootstrap, **security.librdkafka()})
        failures: list[str] = []
        for key, value in records:
            producer.produce(orders, key=key, value=value, on_delivery=lambda err, _m: err and failures.append(str(err)))
        assert producer.flush(60) == 0
        assert failures == []
    wait_for(
        f"{user}'s OAUTHBEARER writes in the authorizer log",
        lambda: f"User:{user} is Allowed operation = WRITE" in apache_kafka.authorizer_log(),
        30,
    )
