"""Connections rebalanced after a scale-out, and a replica drained a few connections at a time.

Two kfan processes share one port on this host (``--reuse-port``: the kernel spreads new connections, as a load
balancer spreads them over replicas), in front of Apache Kafka. Clients (confluent-kafka producers and consumers
in groups) connect while only the first runs; the second starts; a max age is then set on the first by a reload
of its config file. About half the connections move to the second within the age plus its jitter, with no client
error and no group rebalancing (JoinGroup requests are counted on both). Then SIGTERM with a drain period moves
the second's connections back to the first one at a time.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer

from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.kfan import Kfan, start_kfan
from tests.support.metrics import http_get, metrics_port_in, parse_samples
from tests.support.processes import free_port
from tests.support.waiting import wait_for

AGE_S, JITTER_S = 4.0, 3.0
PRODUCERS, GROUPS, CONSUMERS_PER_GROUP = 4, 2, 4


def _config(path: Path, **extra: Any) -> None:
    options = {"metrics-listen": "127.0.0.1:0", **extra}
    tmp = path.with_suffix(".new")
    tmp.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items()))
    tmp.replace(path)


def _samples(k: Kfan, port: int, name: str) -> dict[str, float]:
    status, text = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    return dict(parse_samples(text).get(name, []))


class _Clients:
    """Producers and group consumers in threads: their errors and their partition assignments."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.errors: list[str] = []
        self.reconnects = 0
        self.assignments: dict[str, int] = {}
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def _error(self, err: Any) -> None:
        # librdkafka reports its one broker connection closing as "all brokers down", an event it says it recovers
        # from on its own (a broker restarting looks the same): counted, not an error of the application's.
        if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            self.reconnects += 1
        else:
            self.errors.append(str(err))

    def start(self) -> None:
        for i in range(PRODUCERS):
            self.threads.append(threading.Thread(target=self._produce, args=(f"producer-{i}",)))
        for g in range(GROUPS):
            group = f"scale-{g}-{uuid.uuid4().hex[:6]}"
            for i in range(CONSUMERS_PER_GROUP):
                self.threads.append(threading.Thread(target=self._consume, args=(group, f"consumer-{g}-{i}")))
        for t in self.threads:
            t.start()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def _produce(self, name: str) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "client.id": name, "linger.ms": 5, "error_cb": self._error})

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                self.errors.append(f"{name}: {err}")

        while not self.stop.is_set():
            producer.produce(self.topic, b"s" * 200, on_delivery=delivered)
            producer.poll(0.02)
        assert producer.flush(30) == 0

    def _consume(self, group: str, name: str) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": name,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "error_cb": self._error,
            }
        )

        def assigned(c: Any, partitions: Any) -> None:
            self.assignments[name] = self.assignments.get(name, 0) + 1

        consumer.subscribe([self.topic], on_assign=assigned)
        try:
            while not self.stop.is_set():
                msg = consumer.poll(0.2)
                if msg is not None and msg.error():
                    self.errors.append(f"{name}: {msg.error()}")
        finally:
            consumer.close()


def test_a_max_age_moves_about_half_the_connections_to_a_new_replica(apache_kafka: KafkaCluster, tmp_path: Path) -> None:
    port = free_port()
    topic = f"scale-{uuid.uuid4().hex[:8]}"
    apache_kafka.create_topic(topic, 6, replication_factor=1, config={"min.insync.replicas": "1"})
    first_config, second_config = tmp_path / "first.toml", tmp_path / "second.toml"
    _config(first_config)
    _config(second_config, **{"drain-period": 4.0})
    shared = ("--listen", f"127.0.0.1:{port}", "--reuse-port", "true")
    first = start_kfan(apache_kafka.bootstrap, "--config", str(first_config), *shared)
    second: Kfan | None = None
    clients = _Clients(f"127.0.0.1:{port}", topic)
    try:
        first_metrics = metrics_port_in(first.log)

        def connections(k: Kfan, metrics_port: int) -> int:
            return int(_samples(k, metrics_port, "kfan_client_connections").get("", 0))

        clients.start()
        members = GROUPS * CONSUMERS_PER_GROUP
        wait_for("every consumer to have partitions", lambda: len(clients.assignments) == members, 90)
        opened = connections(first, first_metrics)
        assert opened >= PRODUCERS + members

        second = start_kfan(apache_kafka.bootstrap, "--config", str(second_config), *shared)
        second_metrics = metrics_port_in(second.log)
        assert connections(second, second_metrics) == 0  # nothing moves by itself

        def requests(k: Kfan, metrics_port: int, api_key: int) -> float:
            samples = _samples(k, metrics_port, "kfan_client_requests_total").items()
            return sum(value for labels, value in samples if f'api_key="{api_key}"' in labels)

        def joins() -> float:
            return requests(first, first_metrics, 11) + requests(second, second_metrics, 11)

        joined = joins()
        _config(first_config, **{"connection-max-age": AGE_S, "connection-max-age-jitter": JITTER_S})
        wait_for("the first to reload", lambda: _samples(first, first_metrics, "kfan_config_generation").get("") == 2, 20)
        reloaded = time.monotonic()
        time.sleep(max(0.0, reloaded + AGE_S + JITTER_S + 2 - time.monotonic()))
        moved, total = connections(second, second_metrics), connections(first, first_metrics) + connections(second, second_metrics)
        closed = _samples(first, first_metrics, "kfan_client_connections_closed_total").get('{reason="max_age"}', 0)
        print(
            f"{opened} connections on the first; after {AGE_S}+{JITTER_S} s: {moved} of {total} on the second, {closed} closed for age; librdkafka's 'all brokers down' events: {clients.reconnects}"
        )
        # Each client's connections to the first are closed for their age, or by the client itself once another of
        # its connections was (librdkafka reconnects its group coordinator's with its broker's): most for age.
        assert closed >= opened / 2, (closed, opened)
        assert 0.15 * total <= moved <= 0.85 * total, (moved, total)  # the kernel's spread of 2 listeners: about half
        assert joins() == joined, "a group rebalanced"
        assert clients.errors == [], clients.errors[:5]

        # The second is removed, drained a connection at a time: its clients come back to the first, without errors.
        first_joins, produced = requests(first, first_metrics, 11), requests(first, first_metrics, 0)
        leaving = second
        second.process.send_signal(signal.SIGTERM)
        wait_for("the second to stop", lambda: not leaving.alive(), 30)
        assert leaving.process.returncode == 0, "".join(leaving.log[-30:])
        assert any(re.search(r"closing [1-9]\d* client connections over 4 s \(--drain-period\)", line) for line in leaving.log), (
            leaving.log[-20:]
        )
        wait_for("the producers to go on through the first", lambda: requests(first, first_metrics, 0) > produced + 50, 30)
        assert requests(first, first_metrics, 11) == first_joins, "a group rebalanced"
        assert clients.errors == [], clients.errors[:5]
    finally:
        clients.close()
        for k in (first, second):
            if k is not None and k.alive():
                k.stop()
