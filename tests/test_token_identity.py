"""SCRAM clients' own identities at the brokers, as delegation tokens kfan makes for them (KIP-48, KIP-373).

With ``--broker-identity client`` kfan checks a SCRAM login against its users file, then has the brokers make a
delegation token owned by that client's principal (kfan is a super user at the session's brokers, so it may), and
the client's links log in with it. The brokers' authorizer then judges each SCRAM client as itself: alice may
write ``tokens-*`` topics, bob may only read them. kfan expires each token when its client leaves.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer

from backends.tokens import TokenRefused
from proxy.kafka import errors
from proxy.security.users import add_user
from proxy.server.token_identity import EXPIRE_WITHIN_S, TOKEN_KNOWN_WITHIN_S, worth_expiring_again
from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.apache_kafka.security import SCRAM, kfan_to_brokers
from tests.support.apache_kafka.tools import run_tool
from tests.support.client_security import ClientSecurity
from tests.support.kfan import Kfan, kfan_at
from tests.support.round_trip import check_round_trip, confluent_kafka_round_trip, keyed_records
from tests.support.waiting import wait_for

PARTITIONS = 3


@pytest.fixture(scope="module")
def kfan_with_tokens(apache_kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kfan]:
    """kfan checking SCRAM-SHA-512 logins itself (alice and bob, with the brokers' passwords), carrying each to the
    brokers as a token, and PLAIN logins replayed; its own requests log in as ``kfan`` with SCRAM."""
    assert apache_kafka.secured is not None
    secrets = tmp_path_factory.mktemp("kfan-token-secrets")
    users = secrets / "users.toml"
    for name in ("alice", "bob"):
        add_user(users, name, apache_kafka.secured.users[name], (SCRAM,))
    to_brokers = kfan_to_brokers(apache_kafka.secured, secrets)
    offered = f"PLAIN,{SCRAM}"
    options = ["--client-auth", "sasl", "--broker-identity", "client", "--client-users", str(users), "--client-sasl-mechanisms", offered]
    with kfan_at(apache_kafka.secure_bootstrap, *to_brokers, *options) as k:
        yield k


def _as(kafka: KafkaCluster, user: str) -> ClientSecurity:
    assert kafka.secured is not None
    return ClientSecurity(mechanism=SCRAM, username=user, password=kafka.secured.users[user])


def test_scram_clients_reach_the_brokers_as_themselves(apache_kafka: KafkaCluster, kfan_with_tokens: Kfan) -> None:
    topic = f"tokens-{uuid.uuid4().hex[:8]}"
    apache_kafka.create_topic(topic, PARTITIONS)
    acl = ("kafka-acls", "--bootstrap-server", apache_kafka.bootstrap, "--add")
    run_tool(*acl, "--allow-principal", "User:alice", "--producer", "--topic", topic)
    run_tool(*acl, "--allow-principal", "User:alice", "--consumer", "--topic", topic, "--group", f"{topic}-app")
    run_tool(*acl, "--allow-principal", "User:bob", "--operation", "Read", "--topic", topic)
    k = kfan_with_tokens

    records = keyed_records(300)
    alice = confluent_kafka_round_trip(k.bootstrap, topic, f"{topic}-app", records, _as(apache_kafka, "alice"))
    check_round_trip(alice.consumed, records, PARTITIONS)

    # bob's produce: the brokers judge bob, and refuse him.
    producer = Producer({"bootstrap.servers": k.bootstrap, "message.timeout.ms": 20_000, **_as(apache_kafka, "bob").librdkafka()})
    reports: list[KafkaError | None] = []
    producer.produce(topic, key=b"bob", value=b"never", on_delivery=lambda err, _msg: reports.append(err))
    assert producer.flush(60) == 0
    assert len(reports) == 1 and reports[0] is not None and reports[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, reports
    del producer

    # Kafka's authorizer saw the tokens' owners, alice and bob, never kfan, on that topic.
    def decisions() -> str:
        return "\n".join(line for line in apache_kafka.authorizer_log().splitlines() if f"Topic:LITERAL:{topic}" in line)

    wait_for("bob's refused write in the authorizer log", lambda: "User:bob is Denied operation = WRITE" in decisions(), 30)
    log = decisions()
    assert "User:alice is Allowed operation = WRITE" in log, log[-3000:]
    assert not re.search(r"User:kfan is \w+ operation = (WRITE|READ)", log), "kfan wrote or read as itself"
    # One token per client connection, each expired when its client left.
    made = re.findall(r"delegation token (\S+) made for User:(alice|bob)", "".join(k.log))
    assert {user for _, user in made} == {"alice", "bob"}, "".join(k.log[-40:])
    # kfan asks again for up to EXPIRE_WITHIN_S when a broker could not reach the controller in time.
    wait_for(
        "the tokens to be expired",
        lambda: all(f"delegation token {t} expired" in "".join(k.log) for t, _ in made),
        EXPIRE_WITHIN_S + 30,
        seen=lambda: "".join(line for line in k.log if "delegation token" in line),
    )


def test_a_wrong_scram_password_is_refused_before_any_token_is_made(apache_kafka: KafkaCluster, kfan_with_tokens: Kfan) -> None:
    made_before = "".join(kfan_with_tokens.log).count("delegation token")
    wrong = ClientSecurity(mechanism=SCRAM, username="alice", password="not-alices-password")
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": kfan_with_tokens.bootstrap, "error_cb": errors.append, **wrong.librdkafka()})

    def refused() -> bool:
        producer.poll(0.5)
        return any(e.code() == KafkaError._AUTHENTICATION for e in errors)

    wait_for("the refused login", refused, 30)
    assert "".join(kfan_with_tokens.log).count("delegation token") == made_before


def _command_config(path: Path, lines: dict[str, str]) -> str:
    path.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
    return str(path)


def _tokens(out: str) -> list[list[str]]:
    """The rows of kafka-delegation-tokens' table (TOKENID HMAC OWNER ...), header left out."""
    rows = [line.split() for line in out.splitlines() if line.strip()]
    start = next(i for i, r in enumerate(rows) if r[:2] == ["TOKENID", "HMAC"])
    return rows[start + 1 :]


def test_delegation_tokens_are_made_described_and_expired_through_kfan(
    apache_kafka: KafkaCluster, kfan_with_tokens: Kfan, tmp_path: Path
) -> None:
    """alice, logged in to kfan with PLAIN (carried as herself), makes a token through kfan: its owner is alice, as
    the brokers (described directly, as the super user kfan) say; she expires it through kfan."""
    assert apache_kafka.secured is not None
    alice = _command_config(
        tmp_path / "alice.properties",
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" '
            f'password="{apache_kafka.secured.users["alice"]}";',
        },
    )
    admin = _command_config(
        tmp_path / "kfan.properties",
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM,
            "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="kfan" '
            f'password="{apache_kafka.secured.users["kfan"]}";',
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(apache_kafka.secured.ca_file),
        },
    )
    tool = "kafka-delegation-tokens"
    made = run_tool(
        tool, "--bootstrap-server", kfan_with_tokens.bootstrap, "--command-config", alice, "--create", "--max-life-time-period", "-1"
    )
    ((token_id, hmac, owner, *_),) = _tokens(made.out)
    assert owner == "User:alice"

    def described() -> list[list[str]]:
        out = run_tool(
            tool,
            "--bootstrap-server",
            apache_kafka.secure_bootstrap,
            "--command-config",
            admin,
            "--describe",
            "--owner-principal",
            "User:alice",
        ).out
        return [row for row in _tokens(out) if row[0] == token_id]

    assert [row[2] for row in described()] == ["User:alice"]
    expired = run_tool(
        tool,
        "--bootstrap-server",
        kfan_with_tokens.bootstrap,
        "--command-config",
        alice,
        "--expire",
        "--hmac",
        hmac,
        "--expiry-time-period",
        "-1",
    )
    assert "Completed expire operation" in expired.out, expired.out
    wait_for("the token to be gone", lambda: not described(), 30)


@pytest.mark.parametrize(
    ("code", "made_ago", "again"),
    [
        # The controller learns a new token from the metadata log a moment after making it: "not found" then passes.
        (errors.DELEGATION_TOKEN_NOT_FOUND, 0.3, True),
        (errors.DELEGATION_TOKEN_NOT_FOUND, TOKEN_KNOWN_WITHIN_S + 1, False),
        (errors.REQUEST_TIMED_OUT, TOKEN_KNOWN_WITHIN_S + 1, True),
        (None, TOKEN_KNOWN_WITHIN_S + 1, True),  # no broker answered
        (errors.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED, 0.3, False),
    ],
)
def test_an_expiry_is_asked_again_while_it_may_succeed(code: int | None, made_ago: float, again: bool) -> None:
    assert worth_expiring_again(TokenRefused("refused", code), made_ago) is again
