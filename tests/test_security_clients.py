"""The security acceptance matrix: real clients through a secured kfan to a secured cluster.

Behind every kfan here is a :class:`SecureCluster` (3 brokers, each reached only
over stunnel TLS, with SASL required by an independent front); kfan reaches it
over TLS with SCRAM-SHA-512 as user ``kfan`` (``broker_args``). Two kfans face
the clients:

- ``kfan_sasl``: TLS, and SASL required (``--client-auth sasl``): PLAIN and
  SCRAM against kfan's users file (alice, bob), OAUTHBEARER against the same
  RS256 key that signs the cluster's tokens;
- ``kfan_mtls``: TLS with client certificates required (``--client-auth mtls``).

The tests:

- ``test_sasl_round_trip[<client>-<mechanism>]``: confluent-kafka, kafka-python,
  aiokafka and kcat each produce 200 keyed records over SASL_SSL with each
  mechanism (OAUTHBEARER: not kcat, which has no token callback), then read
  them back in a fresh group with commits; kfan logs the login. kcat (Debian's
  1.7.1, librdkafka 2.0.2) is the old librdkafka that sends the client nonce
  twice in SCRAM's client-final-message (confluentinc/librdkafka#4895): kfan
  takes it as Kafka up to 3.9 does (the cluster's own fronts, like Kafka 4,
  would not).
- ``test_mtls_round_trip[<client>]``: the same round trip with a client
  certificate; kfan logs the certificate's subject as the principal.
- ``test_mtls_refuses_a_client_without_certificate``: a TLS client that has no
  certificate gets no answer at all; kfan logs the failed TLS handshake.
- ``test_wrong_password_is_refused[<client>]``: each client, with a wrong
  password, reports an authentication error in its own way; nothing reaches
  the topic; kfan logs the failure.
- ``test_tls_without_sasl_gets_only_api_versions``: before logging in, a client
  gets ApiVersions (which lists SaslHandshake and SaslAuthenticate) and
  nothing else: a Metadata request closes the connection.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import ssl
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest

from tests.support.client_security import ClientSecurity
from tests.support.kcat import Kcat, KcatFailed
from tests.support.kfan import Kfan, shown_ids, shows_cluster_ids, start_kfan
from tests.support.rawclient import RawClient
from tests.support.round_trip import (
    ROUND_TRIPS,
    RoundTrip,
    Trip,
    check_round_trip,
    end_offsets,
    kcat_round_trip,
    keyed_records,
)
from tests.support.secure_cluster import SecureCluster
from tests.support.secure_kfan import KfanSecrets, broker_args, kfan_secrets
from tests.support.waiting import wait_for, wait_for_line

PARTITIONS = 3
RECORDS = keyed_records(200, keys=50)
CLIENTS = ["confluent-kafka", "kafka-python", "aiokafka", "kcat"]
# The clients of the round trips: not kcat where kfan shows several broker ids at its one address
# (KFAN_BROKER_IDS=cluster; librdkafka issue 4212, as in tests/test_client_matrix.py).
ROUND_TRIP_CLIENTS = [c for c in CLIENTS if not (c == "kcat" and shows_cluster_ids())]
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]
USERS = {"PLAIN": "alice", "SCRAM-SHA-256": "bob", "SCRAM-SHA-512": "alice", "OAUTHBEARER": "alice"}
_names = itertools.count(1)


def _name(prefix: str) -> str:
    return f"{prefix}{next(_names)}-{uuid.uuid4().hex[:8]}"


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    with SecureCluster.for_tests(tmp_path_factory) as sc:
        yield sc
        assert sc.alive(), sc.front_output() + sc.stunnel_output()


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> KfanSecrets:
    return kfan_secrets(tmp_path_factory.mktemp("kfan-secrets"))


def _kfan(secure: SecureCluster, *args: str, name: str) -> Iterator[Kfan]:
    k = start_kfan(secure.bootstrap, *args, *broker_args(secure))
    yield k
    alive = k.alive()
    code = k.stop()
    assert alive, f"{name} died:\n" + "".join(k.log[-50:])
    assert code == 0, f"{name} did not stop cleanly (exit {code}):\n" + "".join(k.log[-50:])


@pytest.fixture(scope="module")
def kfan_sasl(secure: SecureCluster, secrets: KfanSecrets) -> Iterator[Kfan]:
    """TLS to clients, SASL required: PLAIN/SCRAM from the users file, OAUTHBEARER with the cluster's key."""
    yield from _kfan(secure, *secrets.tls_args(), *secrets.sasl_args(jwks=secure.jwks_file), name="kfan (SASL)")


@pytest.fixture(scope="module")
def kfan_mtls(secure: SecureCluster, secrets: KfanSecrets) -> Iterator[Kfan]:
    """TLS to clients with client certificates required; the certificate's subject is the principal."""
    yield from _kfan(secure, *secrets.tls_args(mtls=True), "--client-auth", "mtls", name="kfan (mTLS)")


def _round_trip(request: pytest.FixtureRequest, client: str) -> RoundTrip:
    if client == "kcat":
        return partial(kcat_round_trip, request.getfixturevalue("kcat"))
    return ROUND_TRIPS[client]


def _new_topic(secure: SecureCluster) -> str:
    name = _name("sc")
    secure.mock.create_topic(name, PARTITIONS)
    return name


def _new_lines(k: Kfan, start: int) -> str:
    return "".join(k.log[start:])


def _check_trip(trip: Trip, k: Kfan, start: int, secure: SecureCluster) -> None:
    """Every record once, in order per partition, all through kfan alone, with the offsets committed.

    On a failure, kfan's lines since ``start`` come with it (the client's own log is pytest's captured log)."""
    seen = lambda: f"{trip.log}\nkfan since the trip began:\n{_new_lines(k, start)[-4000:]}"  # noqa: E731
    assert sorted(trip.brokers) == [(i, k.host, k.port) for i in shown_ids(secure.mock.brokers)], trip.brokers
    assert trip.partitions == set(range(PARTITIONS)), seen()
    assert trip.assigned == set(range(PARTITIONS)), seen()
    check_round_trip(trip.consumed, RECORDS, PARTITIONS)
    assert trip.extra == []
    ends = end_offsets(trip.consumed)
    if trip.eof is not None:
        assert trip.eof == ends
    if trip.committed is not None:
        assert trip.committed == ends


# --- 1. SASL_SSL: every client with every mechanism ----------------------------------------


def _sasl_cases() -> Iterator[object]:
    for client in ROUND_TRIP_CLIENTS:
        for mechanism in MECHANISMS:
            if client == "kcat" and mechanism == "OAUTHBEARER":
                continue  # kcat has no token callback
            yield pytest.param(client, mechanism, id=f"{client}-{mechanism}")


@pytest.mark.parametrize(("client", "mechanism"), list(_sasl_cases()))
def test_sasl_round_trip(
    request: pytest.FixtureRequest, secure: SecureCluster, secrets: KfanSecrets, kfan_sasl: Kfan, client: str, mechanism: str
) -> None:
    user = USERS[mechanism]
    if mechanism == "OAUTHBEARER":
        security = ClientSecurity(ca=secrets.server.ca, mechanism=mechanism, token=lambda: secure.token(user))
    else:
        security = ClientSecurity(ca=secrets.server.ca, mechanism=mechanism, username=user, password=secrets.passwords[user])
    start = len(kfan_sasl.log)
    trip = _round_trip(request, client)(kfan_sasl.bootstrap, _new_topic(secure), _name("g"), RECORDS, security=security)
    _check_trip(trip, kfan_sasl, start, secure)
    wait_for_line(kfan_sasl.log, re.escape(f"authenticated as User:{user} ({mechanism})"), start=start)
    log = _new_lines(kfan_sasl, start)
    assert "authentication failed" not in log and "closing" not in log, log[-3000:]
    # The brokers saw kfan's own identity only (--broker-identity kfan), never the client's.
    assert {(e["principal"], e["mechanism"]) for e in secure.front_events("authenticated")} == {("kfan", "SCRAM-SHA-512")}


# --- 2. mTLS --------------------------------------------------------------------------------


@pytest.mark.parametrize("client", ROUND_TRIP_CLIENTS)
def test_mtls_round_trip(request: pytest.FixtureRequest, secure: SecureCluster, secrets: KfanSecrets, kfan_mtls: Kfan, client: str) -> None:
    cert = secrets.client_cert(f"app-{client}")
    security = ClientSecurity(ca=secrets.server.ca, cert=cert.cert, key=cert.key)
    start = len(kfan_mtls.log)
    trip = _round_trip(request, client)(kfan_mtls.bootstrap, _new_topic(secure), _name("g"), RECORDS, security=security)
    _check_trip(trip, kfan_mtls, start, secure)
    wait_for_line(kfan_mtls.log, rf"TLS client certificate of CN=app-{client}(,|$)", start=start)
    log = _new_lines(kfan_mtls, start)
    assert "TLS handshake failed" not in log, log[-3000:]


def _tls_raw_client(k: Kfan, ca: Path) -> RawClient:
    """tests/support/rawclient.py's client over TLS (kfan's certificate checked), no certificate of its own, no SASL."""
    rc = RawClient(k.address)
    rc.sock = ssl.create_default_context(cafile=str(ca)).wrap_socket(rc.sock, server_hostname=k.host)
    return rc


def test_mtls_refuses_a_client_without_certificate(secrets: KfanSecrets, kfan_mtls: Kfan) -> None:
    start = len(kfan_mtls.log)
    # A raw TLS client: with TLS 1.3 its side of the handshake completes before kfan has
    # checked for a certificate; kfan's refusal (an alert) arrives instead of any answer.
    with _tls_raw_client(kfan_mtls, secrets.server.ca) as rc:
        try:
            rc.send(ApiVersionsRequest(client_software_name="kfan-tests", client_software_version="1"))
            answer = rc.receive(5)
        except (ssl.SSLError, ConnectionError) as e:
            answer = None
            assert "CERTIFICATE" in str(e).upper() or isinstance(e, ConnectionError), e
        assert answer is None, "kfan answered a client without a certificate"
    # confluent-kafka without a certificate: no metadata.
    admin = AdminClient({"bootstrap.servers": kfan_mtls.bootstrap, **ClientSecurity(ca=secrets.server.ca).librdkafka()})
    with pytest.raises(KafkaException) as refused:
        admin.list_topics(timeout=3)
    assert refused.value.args[0].code() == KafkaError._TRANSPORT, refused.value
    # One refusal for the raw client and at least one for confluent-kafka's attempts, each logged a moment after.
    failures = wait_for(
        "two refused TLS handshakes in kfan's log",
        lambda: len(found := re.findall(r"TLS handshake failed, closing: (.*)", _new_lines(kfan_mtls, start))) >= 2 and found,
        seen=lambda: _new_lines(kfan_mtls, start)[-3000:],
    )
    log = _new_lines(kfan_mtls, start)
    assert all("CERTIFICATE" in f.upper() for f in failures), failures
    assert "TLS client certificate of" not in log


# --- 3. a wrong password ----------------------------------------------------------------------


def _topic_is_empty(k: Kfan, secrets: KfanSecrets, topic: str) -> None:
    """Every partition's high watermark is 0, read through kfan by a correctly authenticated client.

    It logs in as bob, never as alice: a wrong-password test checks that no alice login follows its own,
    and this reader's login line may still be on its way into the log when the next test begins."""
    good = ClientSecurity(ca=secrets.server.ca, mechanism="SCRAM-SHA-256", username="bob", password=secrets.passwords["bob"])
    reader = Consumer({"bootstrap.servers": k.bootstrap, "group.id": _name("wm"), **good.librdkafka()})
    try:
        marks = [reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(PARTITIONS)]
    finally:
        reader.close()
    assert marks == [(0, 0)] * PARTITIONS, marks


def _confluent_wrong_password(bootstrap: str, topic: str, security: ClientSecurity, caplog: pytest.LogCaptureFixture) -> None:
    errors: list[KafkaError] = []
    delivered: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 3000, "error_cb": errors.append, **security.librdkafka()})
    producer.produce(topic, key=b"k", value=b"v", on_delivery=lambda err, _msg: delivered.append(err))
    assert producer.flush(10) == 0
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors
    assert "Authentication failed: invalid user name or password" in errors[0].str()
    [err] = delivered
    assert err is not None and err.code() == KafkaError._MSG_TIMED_OUT, err


def _kafka_python_wrong_password(bootstrap: str, topic: str, security: ClientSecurity, caplog: pytest.LogCaptureFixture) -> None:
    """kafka-python 3 keeps retrying the bootstrap; the SASL error is logged, a timeout raised."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    with caplog.at_level(logging.WARNING, logger="kafka"), pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaProducer(bootstrap_servers=bootstrap, bootstrap_timeout_ms=3000, **security.kafka_python())
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("kafka")]
    assert any("SaslAuthenticationFailedError" in m and "invalid user name or password" in m for m in logged), logged[-10:]


def _aiokafka_wrong_password(bootstrap: str, topic: str, security: ClientSecurity, caplog: pytest.LogCaptureFixture) -> None:
    """aiokafka gives up the bootstrap at once: KafkaConnectionError, the SASL error logged."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaConnectionError

    async def start() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=5000, **security.aiokafka())
        try:
            await producer.start()
        finally:
            await producer.stop()

    with caplog.at_level(logging.ERROR, logger="aiokafka"), pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
        asyncio.run(start())
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("aiokafka")]
    assert any("SaslAuthenticationFailed" in m and "invalid user name or password" in m for m in logged), logged[-10:]


WrongPassword = Callable[[str, str, ClientSecurity, pytest.LogCaptureFixture], None]
WRONG_PASSWORD: dict[str, WrongPassword] = {
    "confluent-kafka": _confluent_wrong_password,
    "kafka-python": _kafka_python_wrong_password,
    "aiokafka": _aiokafka_wrong_password,
}


@pytest.mark.parametrize("client", CLIENTS)
def test_wrong_password_is_refused(
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
    secure: SecureCluster,
    secrets: KfanSecrets,
    kfan_sasl: Kfan,
    client: str,
) -> None:
    mechanism = "SCRAM-SHA-512"
    security = ClientSecurity(ca=secrets.server.ca, mechanism=mechanism, username="alice", password="not-alice-secret")
    topic = _new_topic(secure)
    start = len(kfan_sasl.log)
    if client == "kcat":
        kcat: Kcat = request.getfixturevalue("kcat")
        with pytest.raises(KcatFailed, match=r"Authentication failure.*Authentication failed: invalid user name or password"):
            kcat.produce(kfan_sasl.bootstrap, topic, RECORDS[:5], *security.kcat(), "-X", "message.timeout.ms=3000", timeout=15)
    else:
        WRONG_PASSWORD[client](kfan_sasl.bootstrap, topic, security, caplog)
    # Each client reported the refusal as such (not a timeout); kfan logs it a moment after answering.
    wait_for_line(kfan_sasl.log, re.escape(f"authentication failed ({mechanism}, User:alice): invalid user name or password"), start=start)
    log = _new_lines(kfan_sasl, start)
    assert "authenticated as User:alice" not in log, log[-3000:]
    _topic_is_empty(kfan_sasl, secrets, topic)


# --- 4. TLS without SASL: ApiVersions only ------------------------------------------------------


def test_tls_without_sasl_gets_only_api_versions(secrets: KfanSecrets, kfan_sasl: Kfan) -> None:
    start = len(kfan_sasl.log)
    with _tls_raw_client(kfan_sasl, secrets.server.ca) as rc:
        versions = rc.call(ApiVersionsRequest(client_software_name="kfan-tests", client_software_version="1"))
        assert versions.error_code == 0
        keys = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
        assert keys[17] == (0, 1) and keys[36] == (0, 2), keys  # SaslHandshake, SaslAuthenticate
        rc.send(MetadataRequest(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False))
        assert rc.closed_by_peer(5), "kfan answered Metadata before authentication"
    wait_for_line(kfan_sasl.log, "api_key 3 before authentication", start=start)
    # confluent-kafka over TLS without SASL: no metadata either.
    start = len(kfan_sasl.log)
    admin = AdminClient({"bootstrap.servers": kfan_sasl.bootstrap, **ClientSecurity(ca=secrets.server.ca).librdkafka()})
    with pytest.raises(KafkaException) as refused:
        admin.list_topics(timeout=3)
    assert refused.value.args[0].code() == KafkaError._TRANSPORT, refused.value
    wait_for_line(kfan_sasl.log, "before authentication", start=start)
