"""Running kfan in production: metrics, health, configuration, workers, graceful stop.

Real kfan processes over real sockets: /metrics scraped during traffic,
/readyz before and after the cluster answers, `--workers 2` sharing one port,
SIGTERM during a produce run, and the flag > env > file > default order.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from proxy.server import config
from proxy.tools.mock_cluster import MockCluster
from tests.support import ROOT
from tests.support.kfan import SERVING, start_kfan
from tests.support.metrics import http_get, metrics_port_in, parse_samples
from tests.support.processes import follow_output
from tests.support.sockets import ESTABLISHED, tcp_sockets
from tests.support.tansu import Tansu
from tests.support.waiting import wait_for, wait_for_line

FAMILIES = [
    "kfan_client_requests_total",
    "kfan_client_request_duration_seconds_count",
    "kfan_broker_request_duration_seconds_count",
    "kfan_fanout_width_count",
    "kfan_bytes_total",
    "kfan_inflight_requests",
    "kfan_client_connections",
    "kfan_broker_connections",
    "kfan_errors_total",
    "kfan_topology_refreshes_total",
    "kfan_topology_age_seconds",
    "kfan_broker_reachable",
]


@contextmanager
def reserved_port() -> Iterator[int]:
    """A port of 127.0.0.1 held, for the block, by a socket bound to it but not listening.

    Connecting to it is refused, as to any free port, but nothing else can take it: the
    kernel picks neither it for another socket's port 0 nor as the local port of a
    connection (not even of one to this same port, which would connect to itself).
    Only a server binding it by number with SO_REUSEADDR, as Tansu does, shares it
    (Linux lets sockets with SO_REUSEADDR share a port none of them listens on yet).
    """
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


def test_readyz_waits_for_the_cluster_and_metrics_cover_the_traffic() -> None:
    # kfan starts before its broker does, so the broker's port is chosen first; held
    # until Tansu listens on it (free_port would let another process take it meanwhile).
    with reserved_port() as port:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "proxy",
                "serve",
                "--bootstrap",
                f"127.0.0.1:{port}",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
        )
        log, _ = follow_output(proc, SERVING, 0)  # its output, as it comes
        try:
            base = f"http://127.0.0.1:{metrics_port_in(log)}"
            assert http_get(base + "/healthz")[0] == 200
            assert http_get(base + "/readyz")[0] == 503, "no broker has answered yet"
            with Tansu(port) as tansu:
                _readyz_and_metrics(base, log, tansu)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0


def _readyz_and_metrics(base: str, log: list[str], tansu: Tansu) -> None:
    wait_for("/readyz to say ready once the broker answers", lambda: http_get(base + "/readyz")[0] == 200, 30)
    # kfan prints where it serves once its listener is up, which may be just after it turned ready.
    served = wait_for_line(log, SERVING)
    bootstrap = f"{served.group(1)}:{served.group(2)}"
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"m{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, 2, 1)]).values():
        f.result(20)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(200):
        producer.produce(topic, value=str(i).encode(), partition=i % 2)
    assert producer.flush(20) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"m-{uuid.uuid4()}"})
    consumer.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
    got = [0]

    def all_consumed() -> bool:
        got[0] += sum(1 for m in consumer.consume(100, timeout=0.5) if m.error() is None)
        return got[0] >= 200

    try:
        wait_for("the 200 records consumed", all_consumed, 30, seen=lambda: f"{got[0]} records")
        assert got[0] == 200

        # A metric is updated as kfan handles a request, which may be just after the client has
        # its answer: the scrape is taken again until every family shows the traffic.
        def missing(text: str) -> list[str]:
            samples = parse_samples(text)
            nonzero = {name for name, rows in samples.items() if any(v != 0 for _, v in rows)}
            return [f for f in FAMILIES if f not in nonzero and f not in ("kfan_errors_total", "kfan_inflight_requests")]

        last: list[str] = [""]

        def scrape() -> str | None:
            last[0] = http_get(base + "/metrics")[1]
            return None if missing(last[0]) else last[0]

        text = wait_for("every family to have nonzero samples after traffic", scrape, 30, seen=lambda: missing(last[0]))
    finally:
        consumer.close()
    samples = parse_samples(text)
    for family in FAMILIES:
        base_name = re.sub(r"_(total|count)$", "", family)
        assert re.search(rf"^# TYPE {base_name}(_total)? ", text, re.M), f"{family} missing from /metrics"
    produce = [v for labels, v in samples["kfan_client_requests_total"] if 'api_key="0"' in labels]
    assert sum(produce) >= 1
    directions = {labels: v for labels, v in samples["kfan_bytes_total"]}
    for d in ("client_in", "client_out", "broker_in", "broker_out"):
        assert directions[f'{{direction="{d}"}}'] > 0
    assert dict(samples["kfan_broker_reachable"])['{broker="111"}'] == 1
    tansu.stop()


def test_configuration_precedence_flag_env_file_default(tmp_path: Path) -> None:
    path = tmp_path / "kfan.toml"
    path.write_text('listen = "0.0.0.0:7000"\nnode_id = 5\nmetadata-refresh = 9\nlog-level = "DEBUG"\nbootstrap = ["a:1", "b:2"]\n')
    env = {"KFAN_NODE_ID": "6", "KFAN_METADATA_REFRESH": "8"}
    options = config.resolve({"config": path, "metadata_refresh": 7.0}, env)
    assert options["metadata_refresh"] == 7.0, "flag beats env and file"
    assert options["node_id"] == 6, "env beats file"
    assert options["listen"] == ("0.0.0.0", 7000), "file beats default"
    assert options["bootstrap"] == [("a", 1), ("b", 2)]
    assert options["log_level"] == "DEBUG"
    assert options["workers"] == 1, "default when nothing sets it"
    assert config.resolve({}, {"KFAN_CONFIG": str(path)})["node_id"] == 5, "KFAN_CONFIG names the file"
    (tmp_path / "bad.toml").write_text("no_such_option = 1\n")
    try:
        config.resolve({"config": tmp_path / "bad.toml"}, {})
        raise AssertionError("an unknown option in the file must be refused")
    except ValueError as e:
        assert "no-such-option" in str(e)


def test_readme_configuration_table_lists_every_option() -> None:
    readme = (ROOT / "README.md").read_text()
    # `--name` for an option with a flag; `name` (no flag) for one taken from the environment or file only.
    rows = re.findall(r"^\| `(--)?([a-z-]+)`( \(no flag\))? \| `(KFAN_[A-Z_]+)` \|", readme, re.M)
    assert rows == [("--", o.name, "", o.env) if o.flag else ("", o.name, " (no flag)", o.env) for o in config.OPTIONS]


def _owners_of_established(port: int, pids: list[int]) -> dict[int, int]:
    """pid -> number of established TCP sockets it holds with local port ``port``."""
    return {pid: sum(1 for s in tcp_sockets(pid) if s.state == ESTABLISHED and s.local_port == port) for pid in pids}


def test_two_workers_share_the_port_and_both_serve(cluster: MockCluster, topic: str) -> None:
    # The metrics listener set through the environment, as the Dockerfile's users do: only the
    # parent binds it. On port 0 (a free port picked here could be taken before kfan binds it),
    # so a worker that bound one too would not fail: it would log a second listener.
    k = start_kfan(cluster.bootstrap, "--workers", "2", env={"KFAN_METRICS_LISTEN": "127.0.0.1:0"})
    try:
        serving = next(i for i, line in enumerate(k.log) if "workers (pids" in line)  # the line start_kfan waited for
        pids = [int(p) for p in re.findall(r"\d+", k.log[serving].split("pids", 1)[1])]
        assert len(pids) == 2
        # Each worker logs its own start before the parent hears it is serving: all of it is above that line.
        listeners = [line for line in k.log[:serving] if "metrics and health on" in line]
        assert len(listeners) == 1, "only the parent serves metrics:\n" + "".join(listeners)
        metrics_port = metrics_port_in(k.log)
        producers = [Producer({"bootstrap.servers": k.bootstrap}) for _ in range(16)]
        for i, p in enumerate(producers):
            p.produce(topic, value=str(i).encode(), key=str(i).encode())
        assert all(p.flush(20) == 0 for p in producers)
        owners = _owners_of_established(k.port, pids)
        assert all(n > 0 for n in owners.values()), f"each worker holds client connections: {owners}"
        assert http_get(f"http://127.0.0.1:{metrics_port}/readyz")[0] == 200
        assert k.process.poll() is None, "".join(k.log)
        del producers
    finally:
        assert k.stop() == 0


def test_sigterm_during_produce_answers_every_accepted_request(cluster: MockCluster, topic: str) -> None:
    k = start_kfan(cluster.bootstrap, "--shutdown-timeout", "10")
    producer = Producer({"bootstrap.servers": k.bootstrap, "linger.ms": 5, "message.timeout.ms": 8000, "enable.idempotence": True})
    reports: list[tuple[int, str | None]] = []

    def on_delivery(err: object, msg: object) -> None:
        reports.append((int(msg.value()), None if err is None else str(err)))  # type: ignore[attr-defined]

    sent = 0
    t_end = time.monotonic() + 2.0
    while time.monotonic() < t_end:
        producer.produce(topic, value=str(sent).encode(), key=str(sent % 7).encode(), on_delivery=on_delivery)
        producer.poll(0)
        sent += 1
        if sent % 200 == 0:
            time.sleep(0.01)
    k.process.send_signal(signal.SIGTERM)
    producer.flush(30)
    assert k.process.wait(30) == 0
    # kfan has exited, but the thread copying its output may still be behind: waited for.
    wait_for_line(k.log, r"stopping: every connection drained")
    failed = [(v, e) for v, e in reports if e is not None]
    # After kfan is gone the rest can only time out or fail to connect: retriable, never a false success.
    assert all(("Timed out" in e or "TRANSPORT" in e.upper() or "timed out" in e.lower() or "Broker" in e) for _, e in failed), failed[:5]
    delivered = {v for v, e in reports if e is None}
    assert delivered, "some records were acknowledged before the stop"
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"s-{uuid.uuid4()}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(6)])
    seen: set[int] = set()

    def every_acknowledged_record_read() -> bool:
        seen.update(int(m.value()) for m in consumer.consume(1000, timeout=0.5) if m.error() is None)
        return delivered <= seen

    try:
        wait_for(
            "every acknowledged record read back from the brokers",
            every_acknowledged_record_read,
            30,
            seen=lambda: f"{len(delivered - seen)} acknowledged records missing",
        )
    finally:
        consumer.close()
