"""A real Apache Kafka cluster in KRaft mode: a controller and three brokers, each its own JVM.

Racks ``a``, ``b``, ``c`` for brokers 1, 2, 3; replication factor 3 and
``min.insync.replicas=2`` by default; Kafka's ``RackAwareReplicaSelector``, so
a consumer naming its rack reads from the replica there (KIP-392). Separate
processes let a test stop, kill or restart one broker; :meth:`KafkaCluster.paused`
holds one still for a moment. The controller does not move leaders back to
preferred replicas by itself: only tests do.

Each node's log dir is formatted once with Kafka's storage tool; its output
(log4j2, to stdout) is kept in ``<workdir>/<node>.log`` for diagnosis, and
the work directory is left in place when the cluster fails to start.
"""

from __future__ import annotations

import base64
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.apache_kafka.distribution import KAFKA_4, classpath
from tests.support.processes import free_port, stop_process
from tests.support.waiting import wait_for

CONTROLLER_ID = 100
BROKER_RACKS = {1: "a", 2: "b", 3: "c"}
START_TIMEOUT_S = 120.0
HEAP = "-Xmx384m"

_LOG4J2 = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
logger.controller.name = org.apache.kafka.controller
logger.controller.level = WARN
"""


def _cluster_id() -> str:
    """A random cluster id as Kafka makes them: URL-safe base64 of 16 bytes, never starting with "-"
    (the storage tool would take it for an option)."""
    while (cid := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
        pass
    return cid


@dataclass
class _Node:
    node_id: int
    roles: str
    port: int
    config: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None


@dataclass
class KafkaCluster:
    """``with KafkaCluster(workdir) as kc: kc.bootstrap`` — a controller and three brokers on 127.0.0.1."""

    workdir: Path
    version: str = KAFKA_4
    extra_broker_config: dict[str, str] = field(default_factory=dict)
    nodes: dict[int, _Node] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes.values() if n.roles == "broker")

    @property
    def brokers(self) -> dict[int, tuple[str, int]]:
        return {i: ("127.0.0.1", n.port) for i, n in self.nodes.items() if n.roles == "broker"}

    def __enter__(self) -> KafkaCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cp = classpath(self.version)
        (self.workdir / "log4j2.properties").write_text(_LOG4J2)
        cluster_id = _cluster_id()
        controller_port = free_port()
        voters = f"{CONTROLLER_ID}@127.0.0.1:{controller_port}"
        self.nodes[CONTROLLER_ID] = self._node(CONTROLLER_ID, "controller", controller_port, voters)
        for broker_id in BROKER_RACKS:
            self.nodes[broker_id] = self._node(broker_id, "broker", free_port(), voters)
        self._format(cp, cluster_id)
        for node in self.nodes.values():
            self._launch(cp, node)
        wait_for(
            "three brokers registered with the controller",
            self._all_brokers_up,
            START_TIMEOUT_S,
            seen=self.logs_tail,
        )

    def _node(self, node_id: int, roles: str, port: int, voters: str) -> _Node:
        data = self.workdir / f"node-{node_id}"
        props = {
            "process.roles": roles,
            "node.id": str(node_id),
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(data),
        }
        if roles == "controller":
            props |= {
                "listeners": f"CONTROLLER://127.0.0.1:{port}",
                "listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
                "default.replication.factor": "3",  # topics are created by the controller
                "min.insync.replicas": "2",
                # Leaders move only when a test moves them: the controller's own
                # rebalancing (every 5 minutes) would elect preferred leaders
                # behind a test's back.
                "auto.leader.rebalance.enable": "false",
            }
        else:
            props |= {
                "listeners": f"PLAINTEXT://127.0.0.1:{port}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                "broker.rack": BROKER_RACKS[node_id],
                "replica.selector.class": "org.apache.kafka.common.replica.RackAwareReplicaSelector",
                "min.insync.replicas": "2",
                "offsets.topic.replication.factor": "3",
                "offsets.topic.num.partitions": "6",
                "transaction.state.log.replication.factor": "3",
                "transaction.state.log.min.isr": "2",
                "transaction.state.log.num.partitions": "6",
                "group.initial.rebalance.delay.ms": "0",
                "auto.create.topics.enable": "false",
                **self.extra_broker_config,
            }
        config = self.workdir / f"node-{node_id}.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return _Node(node_id, roles, port, config, self.workdir / f"node-{node_id}.log")

    def _java(self, cp: str, main: str, *args: str) -> list[str]:
        java = shutil.which("java") or "java"
        return [java, HEAP, f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}", "-cp", cp, main, *args]

    def _format(self, cp: str, cluster_id: str) -> None:
        """Every node's log dir, formatted with Kafka's storage tool (all at once: each is a JVM of seconds)."""
        formats = {
            n.node_id: subprocess.Popen(
                self._java(cp, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(n.config)),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for n in self.nodes.values()
        }
        for node_id, p in formats.items():
            out, _ = p.communicate(timeout=120)
            if p.returncode != 0:
                raise RuntimeError(f"formatting node {node_id} failed (exit {p.returncode}):\n{out[-3000:]}")

    def _launch(self, cp: str, node: _Node) -> None:
        out = open(node.log_path, "ab")  # noqa: SIM115 (the child writes to it until it ends)
        node.process = subprocess.Popen(self._java(cp, "kafka.Kafka", str(node.config)), stdout=out, stderr=subprocess.STDOUT)
        out.close()

    def _all_brokers_up(self) -> bool:
        from confluent_kafka.admin import AdminClient

        for node in self.nodes.values():
            if node.process is not None and node.process.poll() is not None:
                raise RuntimeError(f"node {node.node_id} exited ({node.process.returncode}):\n{self.logs_tail()}")
        try:
            # Quiet: until the brokers listen, librdkafka would log every refused connection.
            md = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0}).list_topics(timeout=2)
        except Exception:
            return False
        return sorted(md.brokers) == sorted(BROKER_RACKS)

    def logs_tail(self, lines: int = 30) -> str:
        out = []
        for node in self.nodes.values():
            if node.log_path.exists():
                tail = node.log_path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- node {node.node_id} ({node.roles}) ---\n" + "\n".join(tail))
        return "\n".join(out)

    def stop(self) -> None:
        for node in sorted(self.nodes.values(), key=lambda n: n.roles == "controller"):  # brokers first
            if node.process is not None:
                stop_process(node.process, 30)
                node.process = None

    @contextmanager
    def paused(self, broker_id: int) -> Iterator[None]:
        """Broker ``broker_id`` stopped (SIGSTOP) for the with-block: its connections stay open and nothing
        answers. Keep it short: past the controller's broker session timeout (9 s) the broker is fenced
        and its partitions get other leaders."""
        process = self.nodes[broker_id].process
        assert process is not None and process.poll() is None, f"broker {broker_id} is not running"
        process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            process.send_signal(signal.SIGCONT)

    def create_topic(self, name: str, partitions: int, replication_factor: int = 3, config: dict[str, str] | None = None) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(name, partitions, replication_factor, config=config or {})], operation_timeout=30)
        futures[name].result(60)
        # Every partition's leader known to every broker before a test produces to it.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            topic = admin.list_topics(name, timeout=5).topics.get(name)
            if topic is not None and not topic.error and len(topic.partitions) == partitions:
                if all(p.leader >= 0 and len(p.isrs) == replication_factor for p in topic.partitions.values()):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"topic {name}: partitions without a leader or a full ISR after 30 s")
