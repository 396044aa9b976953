"""kfan's configuration reloaded while it serves, without disconnects.

The Reloader on its own: what changes live, what needs a restart (refused, the old value kept), what an invalid
file does (nothing). Then the real kfan in front of Apache Kafka: 60 s of producing and consuming in a group over
SASL_SSL while the configuration is reloaded 10 times (quotas changed, the certificate rotated, a user added, the
log level changed, an invalid file, a restart-only change): no connection is lost, no group rebalances, no client
sees an error, and what changed is in force.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from proxy.security.users import add_user
from proxy.server.config import resolve
from proxy.server.reload import Reloader
from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.certs import Authority
from tests.support.client_security import ClientSecurity
from tests.support.kfan import kfan_at
from tests.support.metrics import http_get, metrics_port_in, parse_samples
from tests.support.waiting import wait_for


class _Applied:
    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[frozenset[str]] = []
        self.fail = fail

    def __call__(self, options: Mapping[str, Any], changed: frozenset[str]) -> None:
        if self.fail is not None and options["log_level"] == self.fail:
            raise ValueError("options that do not fit together")
        self.calls.append(changed)


def _reloader(tmp_path: Path, text: str, applied: _Applied) -> tuple[Reloader, Path]:
    path = tmp_path / "kfan.toml"
    path.write_text(text)
    flags = {"config": path, "bootstrap": [("b", 9092)]}
    return Reloader(flags, {}, resolve(flags, {}), applied), path


def test_a_reload_applies_what_changed_live_and_keeps_what_needs_a_restart(tmp_path: Path) -> None:
    applied = _Applied()
    reloader, path = _reloader(tmp_path, 'idle-timeout = 600\nlisten = "127.0.0.1:9092"\n', applied)
    assert reloader.reload("test") == "unchanged" and reloader.generation == 1
    path.write_text('idle-timeout = 300\nlisten = "127.0.0.1:9092"\n')
    assert reloader.reload("test") == "ok" and reloader.generation == 2
    assert applied.calls[-1] == {"idle_timeout"} and reloader.options["idle_timeout"] == 300.0
    # The listen address needs a restart: kept, and said; the live change beside it still applies.
    path.write_text('idle-timeout = 200\nlisten = "0.0.0.0:9999"\n')
    assert reloader.reload("test") == "restart_needed" and reloader.generation == 3
    assert applied.calls[-1] == {"idle_timeout"}
    assert reloader.options["listen"] == ("127.0.0.1", 9092) and reloader.options["idle_timeout"] == 200.0


def test_flags_and_environment_still_win_over_the_reloaded_file(tmp_path: Path) -> None:
    path = tmp_path / "kfan.toml"
    path.write_text("idle-timeout = 600\nframe-timeout = 10\n")
    flags = {"config": path, "bootstrap": [("b", 9092)], "idle_timeout": 5.0}
    env = {"KFAN_FRAME_TIMEOUT": "7"}
    applied = _Applied()
    reloader = Reloader(flags, env, resolve(flags, env), applied)
    path.write_text("idle-timeout = 100\nframe-timeout = 20\nmax-hold = 60\n")
    assert reloader.reload("test") == "ok"
    assert applied.calls == [{"max_hold"}]
    assert (reloader.options["idle_timeout"], reloader.options["frame_timeout"]) == (5.0, 7.0)


@pytest.mark.parametrize(
    "text",
    [
        "idle-timeout = [",  # not TOML
        "idle-timeout = 300\nno-such-option = 1\n",  # unknown option
        'idle-timeout = 300\nmax-frame-bytes = "big"\n',  # a value kfan cannot read
        'idle-timeout = 300\nlog-level = "BAD"\n',  # options the server refuses together (see _Applied)
    ],
)
def test_an_invalid_file_changes_nothing_at_all(tmp_path: Path, text: str) -> None:
    applied = _Applied(fail="BAD")
    reloader, path = _reloader(tmp_path, "idle-timeout = 600\n", applied)
    path.write_text(text)
    assert reloader.reload("test") == "invalid"
    assert reloader.generation == 1 and reloader.options["idle_timeout"] == 600.0
    assert applied.calls == []  # nothing applied: the failing apply raised before changing anything


# --- the real kfan, Apache Kafka, real clients ------------------------------------------------------------------

RUN_S = 60.0
PASSWORD = "app-secret"


def _config_text(files: Path, **changes: Any) -> str:
    options: dict[str, Any] = {
        "client-auth": "sasl",
        "client-users": str(files / "users.toml"),
        "client-sasl-mechanisms": "PLAIN",
        "tls-cert": str(files / "tls.crt"),
        "tls-key": str(files / "tls.key"),
        "quota-file": str(files / "quotas.toml"),
        "metrics-listen": "127.0.0.1:0",
        "log-level": "INFO",
        **changes,
    }
    return "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items())


def _replace(path: Path, data: bytes) -> None:
    """As a Secret or ConfigMap is updated: a new file moved over the old one."""
    tmp = path.with_suffix(path.suffix + ".new")
    tmp.write_bytes(data)
    tmp.replace(path)


def _serial(address: tuple[str, int], ca: Path) -> int:
    from cryptography import x509

    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(address, timeout=5) as raw, ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


class _Client:
    """A client's errors, group assignments and whether it reported statistics yet (it is connected)."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.assignments = 0
        self.statistics = 0

    def stats(self, text: str) -> None:
        self.statistics += 1

    def error(self, err: Any) -> None:
        self.errors.append(str(err))


def test_sixty_seconds_of_traffic_through_ten_reloads(apache_kafka: KafkaCluster, tmp_path: Path) -> None:
    files = tmp_path / "files"
    authority = Authority("reload")
    first, second = authority.server(files / "a"), authority.server(files / "b")
    (files / "tls.crt").write_bytes(first.cert.read_bytes())
    (files / "tls.key").write_bytes(first.key.read_bytes())
    users = files / "users.toml"
    add_user(users, "app", PASSWORD, ("SCRAM-SHA-512",))
    quotas = files / "quotas.toml"
    quotas.write_text('[[quotas]]\nuser = "app"\nproducer_byte_rate = 104857600\n')
    config = files / "kfan.toml"
    config.write_text(_config_text(files))
    topic = f"reload-{uuid.uuid4().hex[:8]}"
    apache_kafka.create_topic(topic, 6, replication_factor=1, config={"min.insync.replicas": "1"})

    with kfan_at(apache_kafka.bootstrap, "--config", str(config), log_level=None) as k:
        port = metrics_port_in(k.log)

        def samples(name: str) -> dict[str, float]:
            status, text = http_get(f"http://127.0.0.1:{port}/metrics")
            assert status == 200
            return dict(parse_samples(text).get(name, []))

        def ended() -> int:
            """Client connections that logged in and are gone (each one logs in)."""
            logins = samples("kfan_authentications_total")['{mechanism="PLAIN",result="ok"}']
            return int(logins - samples("kfan_client_connections")[""])

        def connections_ended() -> int:
            """:func:`ended`, read until two reads 0.5 s apart agree: a connection being opened counts as open
            before it logs in."""

            def agreed() -> tuple[int] | None:
                first = ended()
                time.sleep(0.5)
                second = ended()
                return (second,) if first == second else None

            return wait_for("the client connections to settle", agreed, 20)[0]

        security = ClientSecurity(ca=first.ca, mechanism="PLAIN", username="app", password=PASSWORD).librdkafka()
        stop = threading.Event()
        producer_state, consumer_states = _Client(), [_Client(), _Client()]
        group = f"reload-{uuid.uuid4().hex[:6]}"

        def produce() -> None:
            producer = Producer(
                {
                    "bootstrap.servers": k.bootstrap,
                    **security,
                    "linger.ms": 5,
                    "statistics.interval.ms": 1000,
                    "stats_cb": producer_state.stats,
                    "error_cb": producer_state.error,
                }
            )

            def delivered(err: Any, msg: Any) -> None:
                if err is not None:
                    producer_state.errors.append(str(err))

            while not stop.is_set():
                producer.produce(topic, b"r" * 1000, on_delivery=delivered)
                producer.poll(0.005)
            assert producer.flush(30) == 0

        def consume(state: _Client) -> None:
            consumer = Consumer(
                {
                    "bootstrap.servers": k.bootstrap,
                    **security,
                    "group.id": group,
                    "auto.offset.reset": "earliest",
                    "statistics.interval.ms": 1000,
                    "stats_cb": state.stats,
                    "error_cb": state.error,
                }
            )

            def assigned(c: Any, partitions: Any) -> None:
                state.assignments += 1

            consumer.subscribe([topic], on_assign=assigned)
            try:
                while not stop.is_set():
                    msg = consumer.poll(0.2)
                    if msg is not None and msg.error():
                        state.errors.append(str(msg.error()))
            finally:
                consumer.close()

        threads = [threading.Thread(target=produce)] + [threading.Thread(target=consume, args=(s,)) for s in consumer_states]
        for t in threads:
            t.start()
        began = time.monotonic()
        try:
            wait_for("both consumers to have partitions", lambda: all(s.assignments for s in consumer_states), 60)
            wait_for("the clients' first statistics", lambda: all(c.statistics for c in (producer_state, *consumer_states)), 30)
            joins = sum(samples("kfan_client_requests_total").get(f'{{api_key="11",api_version="{v}"}}', 0) for v in range(10))
            ended_then = connections_ended()
            # The group as formed (the first member may have had the partitions alone before the second joined).
            assignments = [s.assignments for s in consumer_states]
            generation = samples("kfan_config_generation")[""]

            def reload_by(action: str, result: str, step: Any) -> None:
                before = samples("kfan_config_reloads_total").get(f'{{result="{result}"}}', 0)
                step()
                if action == "sighup":
                    os.kill(k.pid, signal.SIGHUP)
                wait_for(
                    f"a reload with result {result}",
                    lambda: samples("kfan_config_reloads_total").get(f'{{result="{result}"}}', 0) > before,
                    20,
                )
                time.sleep(max(0.0, began + 5 * (len(done) + 1) - time.monotonic()))  # spread over the run
                done.append(result)

            done: list[str] = []
            # 1. quotas changed (the quota file, then SIGHUP)
            reload_by(
                "sighup",
                "unchanged",
                lambda: quotas.write_text(
                    '[[quotas]]\nuser = "app"\nproducer_byte_rate = 209715200\n[[quotas]]\nuser = "<default>"\nconsumer_byte_rate = 209715200\n'
                ),
            )

            # 2. the certificate rotated
            def rotate() -> None:
                _replace(files / "tls.key", second.key.read_bytes())
                _replace(files / "tls.crt", second.cert.read_bytes())

            reload_by("sighup", "unchanged", rotate)
            # 3. a user added
            reload_by("sighup", "unchanged", lambda: add_user(users, "late", "late-secret", ("SCRAM-SHA-512",)))
            # 4. the log level changed (the config file: reloaded as it changes)
            reload_by("file", "ok", lambda: _replace(config, _config_text(files, **{"log-level": "WARNING"}).encode()))
            # 5. timeouts changed
            reload_by(
                "file", "ok", lambda: _replace(config, _config_text(files, **{"log-level": "WARNING", "idle-timeout": 500.0}).encode())
            )
            # 6. an invalid file: nothing changes, and it is reported
            reload_by("file", "invalid", lambda: _replace(config, b"idle-timeout = [\n"))

            def write(**changes: Any) -> Callable[[], None]:
                return lambda: _replace(config, _config_text(files, **changes).encode())

            # 7. valid again, fetching ahead changed
            settled = {"idle-timeout": 500.0, "fetch-ahead-bytes": 8388608}
            reload_by("file", "ok", write(**settled))
            # 8. a setting that needs a restart: refused, the old value kept
            reload_by("file", "restart_needed", write(**settled, **{"node-id": 7, "request-timeout": 20.0}))
            # 9. the request timeout changed (applied; the node id still differs from the one in force: said again)
            reload_by("file", "restart_needed", write(**settled, **{"node-id": 7, "request-timeout": 25.0}))
            # 10. SIGHUP, nothing changed
            reload_by("sighup", "restart_needed", lambda: None)
            time.sleep(max(0.0, began + RUN_S - time.monotonic()))
            # A client may open a connection it did not need before (to another broker id, in cluster mode); none
            # that it had, or opened since, may be gone.
            assert not samples("kfan_client_connections_closed_total"), "kfan closed a client connection"
            assert connections_ended() == ended_then, "a client connection ended"
            # Read before the clients stop: the first consumer to close leaves the group, and the other may
            # rejoin before it closes too. That is the clients' shutdown, not a rebalance the reloads caused.
            joins_at_end = sum(samples("kfan_client_requests_total").get(f'{{api_key="11",api_version="{v}"}}', 0) for v in range(10))
            assignments_at_end = [s.assignments for s in consumer_states]
        finally:
            stop.set()
            for t in threads:
                t.join(60)

        clients = (producer_state, *consumer_states)
        assert [c.errors for c in clients] == [[], [], []]
        assert assignments_at_end == assignments, "a group rebalanced"
        assert joins_at_end == joins, "a consumer joined its group again"
        # What changed is in force: 4 reloads changed live settings; quotas, users and certificates are read as they change.
        assert samples("kfan_config_generation")[""] == generation + 5
        assert samples("kfan_config_reloads_total")['{result="invalid"}'] == 1
        assert samples("kfan_quota_entries")[""] == 2
        assert _serial(k.address, first.ca) != _serial_of(first.cert)
        late = ClientSecurity(ca=first.ca, mechanism="PLAIN", username="late", password="late-secret").librdkafka()
        p = Producer({"bootstrap.servers": k.bootstrap, **late})
        p.produce(topic, b"late")
        assert p.flush(30) == 0, "the user added while kfan ran logs in"
        assert any("was not reloaded, the one in force stays whole" in line for line in k.log)
        assert any("node-id changed to 7, which needs a restart" in line for line in k.log)


def _serial_of(pem: Path) -> int:
    from cryptography import x509

    return x509.load_pem_x509_certificate(pem.read_bytes()).serial_number
