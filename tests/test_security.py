"""kfan's security end to end, through real sockets and real TLS and SASL peers:
each client's identity carried to the brokers, re-authentication on both
sides (KIP-368), certificate rotation, the wrong protocol on a port, kfan in
front of kfan, a refused broker login, and the options that cannot work
together. The client-library matrix is tests/test_security_clients.py.
"""

from __future__ import annotations

import re
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient

from proxy.security.users import Users
from proxy.server import config
from proxy.server.security_options import security_from
from proxy.tools.mock_cluster import MockCluster
from tests.support import ROOT
from tests.support.certs import Authority
from tests.support.client_security import ClientSecurity
from tests.support.flows import Flow
from tests.support.kfan import Kfan, start_kfan
from tests.support.metrics import http_get, metrics_port_in, parse_samples
from tests.support.round_trip import check_round_trip, confluent_kafka_round_trip, keyed_records
from tests.support.secure_cluster import SecureCluster
from tests.support.secure_kfan import KfanSecrets, broker_args, kfan_secrets
from tests.support.waiting import wait_for, wait_for_line


def _topic(cluster: SecureCluster | MockCluster, partitions: int = 3) -> str:
    name = f"sec-{uuid.uuid4().hex[:8]}"
    (cluster.mock if isinstance(cluster, SecureCluster) else cluster).create_topic(name, partitions)
    return name


def _counter(k: Kfan, family: str, **labels: str) -> float:
    _, text = http_get(f"http://127.0.0.1:{metrics_port_in(k.log)}/metrics")
    want = [f'{name}="{value}"' for name, value in labels.items()]
    return sum(v for lab, v in parse_samples(text).get(family, []) if all(w in lab for w in want))


def _close_producer(flow: Flow) -> None:
    """End a Flow's producer (Flow closes only its consumer). Left alone it lives on, in a reference cycle
    when the Flow is a group member, and keeps reconnecting to this test's kfan port, which a later test's
    server may have by then: that test would get this one's logins."""
    flow.producer.purge()  # nothing to purge once finish() flushed it; after a failure, close() must not wait
    flow.producer.close()


def _stopped(k: Kfan) -> None:
    alive = k.alive()
    code = k.stop()
    assert alive, "kfan died:\n" + "".join(k.log[-40:])
    assert code == 0, f"kfan exited {code}:\n" + "".join(k.log[-40:])


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> KfanSecrets:
    return kfan_secrets(tmp_path_factory.mktemp("kfan-secrets"))


# --- each client's identity at the brokers ---------------------------------------------


def test_each_client_logs_in_to_the_brokers_as_itself(tmp_path_factory: pytest.TempPathFactory) -> None:
    """--broker-identity client: the fronts before the brokers see alice and bob on their links, kfan on
    its own; credentials the brokers refuse get error 58 at login for that client only; a client's
    re-authentication (KIP-368) logs its links in again."""
    with SecureCluster.for_tests(tmp_path_factory) as cluster:
        k = start_kfan(
            cluster.bootstrap,
            *broker_args(cluster),
            "--client-auth", "sasl", "--broker-identity", "client", "--client-session-lifetime", "3",
            "--metrics-listen", "127.0.0.1:0",
        )  # fmt: skip
        try:
            topic = _topic(cluster)
            for user in ("alice", "bob"):
                security = ClientSecurity(mechanism="PLAIN", username=user, password=cluster.users[user])
                records = keyed_records(100)
                trip = confluent_kafka_round_trip(k.bootstrap, topic, f"g-{user}", records, security)
                assert Counter((key, v) for _, _, key, v in trip.consumed) >= Counter(records), f"{user} lost records"

            # The fronts write each login to their event files, read here as they grow.
            def logged_in() -> bool:
                logins = cluster.front_events("authenticated")
                alice_at = {e["broker"] for e in logins if e["principal"] == "alice"}
                return alice_at == set(cluster.brokers) and {"bob", "kfan"} <= {e["principal"] for e in logins}

            wait_for("alice, bob and kfan's logins at the fronts", logged_in, 30, seen=lambda: cluster.front_events("authenticated"))
            logins = cluster.front_events("authenticated")
            by_principal = Counter(e["principal"] for e in logins)
            assert by_principal["alice"] >= 1 and by_principal["bob"] >= 1, by_principal
            assert by_principal["kfan"] >= 1, "kfan's own metadata requests log in as kfan"
            # Produce and Fetch went over links logged in as the client, to every broker that leads a partition.
            assert {e["broker"] for e in logins if e["principal"] == "alice"} == {1, 2, 3}

            # Credentials the brokers refuse: error 58 for that client; alice keeps working meanwhile.
            bad = Producer({"bootstrap.servers": k.bootstrap, "message.timeout.ms": 5000,
                            **ClientSecurity(mechanism="PLAIN", username="bob", password="wrong").librdkafka()})  # fmt: skip
            errors: list[KafkaError] = []
            bad.produce(topic, b"never", on_delivery=lambda e, m: errors.append(e))
            assert bad.flush(60) == 0, "the refused record's delivery report (message.timeout.ms 5000) never came"
            assert errors and errors[0] is not None, "a refused client's record must not be delivered"
            bad.close()  # else it keeps logging in as bob, with the wrong password, until the test ends
            wait_for_line(k.log, r"authentication failed.*User:bob.*refused")
            wait_for(
                "the fronts' record of bob's refused login",
                lambda: any(e["event"] == "failed" and e["principal"] in ("bob", None) for e in cluster.front_events()),
                30,
                seen=cluster.front_events,
            )

            # alice, meanwhile, produces over a session kfan ends every 3 s: she re-authenticates, and so do her links.
            def alice_links_reauthenticated() -> int:
                return len([e for e in cluster.front_events("reauthenticated") if e["principal"] == "alice"])

            def client_reauthentications() -> float:
                return _counter(k, "kfan_authentications_total", mechanism="PLAIN", result="reauthenticated")

            links_before, clients_before = alice_links_reauthenticated(), client_reauthentications()
            flow = Flow(
                _topic(cluster, 6), k, k, rate=100, security=ClientSecurity(mechanism="PLAIN", username="alice", password="alice-secret")
            ).start()
            try:
                # Her producer and consumer each log in again about every 2.7 s while the flow runs.
                wait_for("alice's clients to re-authenticate twice with kfan", lambda: client_reauthentications() >= clients_before + 2, 60)
                wait_for(
                    "alice's links to log in again at the fronts",
                    lambda: alice_links_reauthenticated() > links_before,
                    60,
                    seen=lambda: cluster.front_events("reauthenticated"),
                )
            finally:
                try:
                    flow.finish()
                finally:
                    _close_producer(flow)
            assert flow.reports.failed == {}
            assert flow.reports.ok, "alice's records were delivered across her re-authentications"
        finally:
            _stopped(k)


# --- re-authentication on both sides -----------------------------------------------------


def test_thirty_seconds_of_short_sessions_lose_and_duplicate_nothing(
    tmp_path_factory: pytest.TempPathFactory, secrets: KfanSecrets
) -> None:
    """Broker sessions of 3 s and client sessions of 3 s: every link and every client logs in again
    about every 2.5 s for half a minute (a dozen times each), and the records arrive exactly once, in order."""
    with SecureCluster.for_tests(tmp_path_factory, session_lifetime_ms=3000) as cluster:
        k = start_kfan(
            cluster.bootstrap, *broker_args(cluster), *secrets.sasl_args(), "--client-session-lifetime", "3",
            "--metrics-listen", "127.0.0.1:0",
        )  # fmt: skip
        try:
            cluster.mock.create_topic(topic := f"reauth-{uuid.uuid4().hex[:6]}", 6)
            security = ClientSecurity(mechanism="SCRAM-SHA-512", username="alice", password=secrets.passwords["alice"])
            flow = Flow(topic, k, k, rate=200, group=f"g-{uuid.uuid4().hex[:6]}", security=security).start()
            try:
                time.sleep(30)  # real time: sessions of 3 s ending, one after the other, for half a minute
                flow.finish(timeout=60)
            finally:
                _close_producer(flow)
            delivered = flow.reports.ok
            assert flow.reports.failed == {}, list(flow.reports.failed.values())[:3]
            assert len(delivered) == flow.sent > 5_000
            values = [int(v) for _, _, _, v in flow.consumed]
            assert len(values) == len(set(values)) == len(delivered), "records lost or consumed twice"
            assert _counter(k, "kfan_broker_authentications_total", result="reauthenticated") >= 20
            assert _counter(k, "kfan_authentications_total", mechanism="SCRAM-SHA-512", result="reauthenticated") >= 10
            assert _counter(k, "kfan_authentications_total", result="expired") == 0
            fronts = Counter(e["event"] for e in cluster.front_events())
            assert fronts["reauthenticated"] >= 20 and fronts["expired"] == 0 and fronts["failed"] == 0, fronts
        finally:
            _stopped(k)


# --- TLS on the client listener ---------------------------------------------------------


def _served_certificate(address: tuple[str, int], ca: Path) -> int:
    """The serial number of the certificate kfan presents to a new connection."""
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(address, timeout=5) as raw, ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    from cryptography import x509

    return x509.load_der_x509_certificate(der).serial_number


def test_rotated_certificate_files_are_served_to_new_connections(cluster: MockCluster, tmp_path: Path) -> None:
    authority = Authority("rotation")
    first, second = authority.server(tmp_path / "a"), authority.server(tmp_path / "b")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(first.cert.read_bytes())
    key.write_bytes(first.key.read_bytes())
    k = start_kfan(cluster.bootstrap, "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        from cryptography import x509

        serial = {x509.load_pem_x509_certificate(p.cert.read_bytes()).serial_number: n for n, p in (("first", first), ("second", second))}
        assert serial[_served_certificate(k.address, first.ca)] == "first"
        topic = _topic(cluster)
        producer = Producer({"bootstrap.servers": k.bootstrap, **ClientSecurity(ca=first.ca).librdkafka()})
        producer.produce(topic, b"before")
        assert producer.flush(60) == 0
        # A Secret's rotation: both files replaced (as the kubelet swaps its ..data link).
        for src, dst in ((second.key, key), (second.cert, cert)):
            tmp = dst.with_suffix(".new")
            tmp.write_bytes(src.read_bytes())
            tmp.replace(dst)
        wait_for("new connections to get the new certificate", lambda: serial[_served_certificate(k.address, first.ca)] == "second", 30)
        failures: list[Any] = []
        producer.produce(topic, b"after", on_delivery=lambda e, m: e and failures.append(e))
        assert producer.flush(60) == 0 and failures == [], "a connection opened before the rotation keeps working"
        wait_for_line(k.log, "TLS: certificate files changed")
    finally:
        _stopped(k)


def test_the_wrong_protocol_on_a_port_is_closed_at_once_with_a_log_line(cluster: MockCluster, secrets: KfanSecrets) -> None:
    tls_kfan = start_kfan(cluster.bootstrap, *secrets.tls_args())
    plain_kfan = start_kfan(cluster.bootstrap)
    try:
        # "At once": kfan tells the wrong protocol by its first bytes. Its only other way to close such a
        # connection is its 30 s handshake (frame) timeout, which the clients' 20 s timeouts below never
        # reach: a close they see, and a log line naming the bytes rather than a timeout, prove it.
        # How long it took is printed, never judged (a loaded machine is slow).
        api_versions = bytes.fromhex("0000000f0012000000000001000568656c6c6f")  # ApiVersions v0, client "hello"
        started = time.monotonic()
        with socket.create_connection(tls_kfan.address, timeout=20) as s:
            s.sendall(api_versions)
            assert s.recv(100) == b"", "a plaintext client on the TLS port is closed, not answered"
        print(f"the plaintext client was closed after {time.monotonic() - started:.3f} s")
        line = wait_for_line(tls_kfan.log, r"TLS handshake failed, closing: .*plaintext client").string
        assert "TooSlow" not in line, f"closed by the handshake timeout, not at once: {line}"

        started = time.monotonic()
        ctx = ssl.create_default_context(cafile=str(secrets.server.ca))
        with (
            socket.create_connection(plain_kfan.address, timeout=20) as raw,
            pytest.raises((ssl.SSLError, ConnectionError, OSError)) as refused,
        ):
            ctx.wrap_socket(raw, server_hostname="localhost")
        assert not isinstance(refused.value, TimeoutError), f"the TLS client was not closed but timed out: {refused.value!r}"
        print(f"the TLS client was closed after {time.monotonic() - started:.3f} s")
        wait_for_line(plain_kfan.log, "a TLS handshake on a plaintext listener, closing")
        # Both still serve.
        assert AdminClient({"bootstrap.servers": plain_kfan.bootstrap}).list_topics(timeout=30).brokers
        admin = AdminClient({"bootstrap.servers": tls_kfan.bootstrap, **ClientSecurity(ca=secrets.server.ca).librdkafka()})
        assert admin.list_topics(timeout=30).brokers
    finally:
        _stopped(tls_kfan)
        _stopped(plain_kfan)


# --- kfan as a SASL client of kfan ----------------------------------------------------------


def test_kfan_logs_in_to_a_kfan_that_authenticates_clients(cluster: MockCluster, secrets: KfanSecrets) -> None:
    """Two independent code paths meet: kfan's broker-side TLS and SCRAM client against kfan's
    client-side TLS and SCRAM server."""
    inner = start_kfan(cluster.bootstrap, *secrets.tls_args(), *secrets.sasl_args())
    try:
        password = secrets.workdir / "alice-password"
        password.write_text(secrets.passwords["alice"])
        outer = start_kfan(
            inner.bootstrap, "--broker-tls", "true", "--broker-tls-ca", str(secrets.server.ca),
            "--broker-sasl-mechanism", "SCRAM-SHA-256", "--broker-sasl-username", "alice", "--broker-sasl-password-file", str(password),
        )  # fmt: skip
        try:
            topic = _topic(cluster)
            records = keyed_records(300)
            trip = confluent_kafka_round_trip(outer.bootstrap, topic, f"g-{uuid.uuid4().hex[:6]}", records)
            check_round_trip(trip.consumed, records, 3)
            wait_for_line(inner.log, re.escape("authenticated as User:alice (SCRAM-SHA-256)"))
        finally:
            _stopped(outer)
    finally:
        _stopped(inner)


# --- a refused broker login ---------------------------------------------------------------------


def test_a_refused_broker_login_shows_in_readyz_and_metrics_and_heals_when_the_file_is_fixed(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with SecureCluster.for_tests(tmp_path_factory) as cluster:
        args = broker_args(cluster, password="not-the-password")
        password_file = Path(args[args.index("--broker-sasl-password-file") + 1])
        k = start_kfan(cluster.bootstrap, "--metrics-listen", "127.0.0.1:0", *args, wait=False)
        proc = k.process
        try:
            port = metrics_port_in(k.log, 60)
            wait_for("a refused login", lambda: _counter(k, "kfan_broker_authentications_total", result="failed") >= 1, 60)
            wait_for(
                "/readyz to say why", lambda: "SCRAM-SHA-512 authentication failed" in http_get(f"http://127.0.0.1:{port}/readyz")[1], 30
            )
            assert http_get(f"http://127.0.0.1:{port}/readyz")[0] == 503
            wait_for_line(k.log, "SASL SCRAM-SHA-512 authentication failed")
            assert proc.poll() is None
            # The password file is read at each login: a fixed file heals kfan without a restart.
            password_file.write_text(cluster.users["kfan"] + "\n")
            wait_for("kfan to become ready", lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 60)
        finally:
            _stopped(k)  # SIGTERM ends even a kfan still looking for a broker it can log in to


# --- the users file command ------------------------------------------------------------------------


def test_users_add_writes_salted_credentials_never_the_password(tmp_path: Path) -> None:
    users = tmp_path / "users.json"
    for name, password in (("carol", "carol-pw-1"), ("dave", "dave-pw")):
        done = subprocess.run(
            [sys.executable, "-m", "proxy", "users", "add", name, "--client-users", str(users)],
            input=password + "\n", capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    text = users.read_text()
    assert "carol-pw-1" not in text and "dave-pw" not in text
    assert users.stat().st_mode & 0o777 == 0o600
    loaded = Users.load(users)
    assert loaded.names == {"carol", "dave"}
    assert loaded.check_password("carol", "carol-pw-1") and not loaded.check_password("carol", "dave-pw")
    assert loaded.scram("dave", "SCRAM-SHA-512") is not None and loaded.scram("dave", "SCRAM-SHA-256") is not None


# --- combinations refused at start-up -----------------------------------------------------------------


def _options(**values: Any) -> dict[str, Any]:
    return config.resolve({k.replace("-", "_"): v for k, v in values.items()}, env={})


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"tls-cert": Path("a.pem")}, "--tls-cert and --tls-key go together"),
        ({"client-auth": "mtls"}, "--client-auth mtls needs --tls-client-ca"),
        ({"broker-identity": "client"}, "--broker-identity client needs --client-auth sasl"),
        ({"client-auth": "sasl"}, "--client-auth sasl needs --client-users"),
        ({"broker-tls-ca": Path("ca.pem")}, "need --broker-tls"),
        ({"broker-sasl-mechanism": "SCRAM-SHA-512"}, "needs --broker-sasl-username"),
        ({"broker-sasl-mechanism": "PLAIN", "broker-sasl-username": "kfan"}, "KFAN_BROKER_SASL_PASSWORD"),
        ({"broker-sasl-mechanism": "OAUTHBEARER"}, "needs --broker-sasl-token-file"),
    ],
)
def test_options_that_cannot_work_together_are_refused(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint.replace("-", "\\-")):
        security_from(_options(**values))


def test_client_identity_offers_scram_only_when_asked_as_it_needs_delegation_tokens(secrets: KfanSecrets) -> None:
    base = {
        "client-auth": "sasl",
        "broker-identity": "client",
        "client-users": secrets.users_file,
        "broker-sasl-mechanism": "PLAIN",
        "broker-sasl-username": "kfan",
        "broker-sasl-password": "x",
    }
    offered = security_from(_options(**base)).client_auth
    assert offered is not None and offered.authenticator.mechanisms == ("PLAIN",)
    assert offered.carry_identity
    # Asked for, SCRAM is offered: those logins reach the brokers as delegation tokens (tests/test_token_identity.py).
    asked = security_from(_options(**base, **{"client-sasl-mechanisms": ("PLAIN", "SCRAM-SHA-256")})).client_auth
    assert asked is not None and asked.authenticator.mechanisms == ("PLAIN", "SCRAM-SHA-256")
    no_users = {k: v for k, v in base.items() if k != "client-users"}
    with pytest.raises(ValueError, match="SCRAM-SHA-256: nothing to check them against"):
        security_from(_options(**no_users, **{"client-sasl-mechanisms": ("SCRAM-SHA-256",)}))
    without_identity = security_from(_options(**{k: v for k, v in base.items() if k != "broker-identity"})).client_auth
    assert without_identity is not None and without_identity.authenticator.mechanisms == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def test_a_kfan_refusing_its_options_says_why_and_exits(cluster: MockCluster) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--bootstrap", cluster.bootstrap, "--client-auth", "mtls"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "kfan serve: --client-auth mtls needs --tls-client-ca" in done.stderr


# --- SaslHandshake v0: bare SASL tokens ------------------------------------------------------------


def test_sasl_handshake_v0_logins_take_bare_tokens(cluster: MockCluster, secrets: KfanSecrets) -> None:
    """Clients older than KIP-152 send the mechanism's tokens in bare frames after SaslHandshake v0;
    a PLAIN success is an empty frame, a failure a closed connection with nothing written."""
    from kio.schema.metadata.v1 import MetadataRequest
    from kio.schema.sasl_handshake.v0 import SaslHandshakeRequest

    from proxy.kafka.frames import frame
    from tests.support.rawclient import CLOSED_WITHIN_S, RawClient

    k = start_kfan(cluster.bootstrap, *secrets.sasl_args())
    try:
        with RawClient(k.address) as rc:
            answer = rc.call(SaslHandshakeRequest(mechanism="PLAIN"))
            assert answer.error_code == 0 and "PLAIN" in answer.mechanisms
            rc.send_bytes(frame([b"\0alice\0" + secrets.passwords["alice"].encode()]))
            assert rc.receive() == b"", "PLAIN's success over bare tokens is an empty frame"
            assert rc.call(MetadataRequest(topics=None)).brokers, "logged in: requests are served"
        with RawClient(k.address) as rc:
            assert rc.call(SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
            rc.send_bytes(frame([b"\0alice\0wrong"]))
            assert rc.closed_by_peer(CLOSED_WITHIN_S), "a failed bare-token login is closed, nothing answered"
        with RawClient(k.address) as rc:
            answer = rc.call(SaslHandshakeRequest(mechanism="GSSAPI"))
            assert answer.error_code == 33, "UNSUPPORTED_SASL_MECHANISM"
            assert sorted(answer.mechanisms) == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"], "with the enabled ones"
            assert rc.closed_by_peer(CLOSED_WITHIN_S)
        with RawClient(k.address) as rc:
            rc.send(MetadataRequest(topics=None))
            assert rc.closed_by_peer(CLOSED_WITHIN_S), "nothing but ApiVersions and SASL before a login"
        wait_for_line(k.log, "api_key 3 before authentication")
    finally:
        _stopped(k)


# --- the brokers' certificates ------------------------------------------------------------------------


def test_broker_certificates_are_checked_against_the_advertised_host_or_the_name_given(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The brokers' certificates name localhost: kfan checks each against the host it connects to,
    and --broker-tls-server-name replaces that name (a wrong one is refused, never ignored)."""
    with SecureCluster.for_tests(tmp_path_factory) as cluster:
        wrong = start_kfan(cluster.bootstrap, "--metrics-listen", "127.0.0.1:0", "--broker-tls-server-name", "kafka.elsewhere.example",
                           *broker_args(cluster), wait=False)  # fmt: skip
        try:
            port = metrics_port_in(wrong.log, 60)
            wait_for_line(wrong.log, "CERTIFICATE_VERIFY_FAILED", 60)
            wait_for("/readyz to say why", lambda: "CERTIFICATE_VERIFY_FAILED" in http_get(f"http://127.0.0.1:{port}/readyz")[1], 30)
            assert http_get(f"http://127.0.0.1:{port}/readyz")[0] == 503
        finally:
            _stopped(wrong)
        named = start_kfan(cluster.bootstrap, "--broker-tls-server-name", "localhost", *broker_args(cluster))
        try:
            assert AdminClient({"bootstrap.servers": named.bootstrap}).list_topics(timeout=30).brokers
        finally:
            _stopped(named)
