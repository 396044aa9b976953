"""A real Apache Kafka cluster in KRaft mode: a controller (or a quorum of three) and three brokers, each its own JVM.

Racks ``a``, ``b``, ``c`` for brokers 1, 2, 3; replication factor 3 and
``min.insync.replicas=2`` by default; Kafka's ``RackAwareReplicaSelector``, so
a consumer naming its rack reads from the replica there (KIP-392). Separate
processes let a test stop, kill or restart one broker; :meth:`KafkaCluster.paused`
holds one still for a moment. The controller does not move leaders back to
preferred replicas by itself: only tests do.

Each broker of Kafka 4 has three listeners: PLAINTEXT (:attr:`KafkaCluster.bootstrap`)
for most tests, and SASL_SSL and OAUTH (:attr:`KafkaCluster.secure_bootstrap`,
:attr:`KafkaCluster.oauth_bootstrap`) with Kafka's ``StandardAuthorizer`` for
the security tests (see :mod:`.security`); Kafka 3.9's, PLAINTEXT only.

Any version :mod:`distribution` resolves: Kafka 4 (the default) or Kafka 3.9
(``version=KAFKA_3``, for the request versions Kafka 4 removed). Each node's
log dir is formatted once with Kafka's storage tool; its output (to stdout,
through log4j2 for Kafka 4, reload4j (log4j 1) for Kafka 3, each configured
with the same levels) is kept in ``<workdir>/<node>.log`` for diagnosis, and
the work directory is left in place when the cluster fails to start.

``controllers=3`` makes a quorum of three controllers (ids 100-102), so that
the active one can be killed and another takes over
(:meth:`KafkaCluster.active_controller`); :meth:`KafkaCluster.add_broker`
starts a fourth broker (or more) in the running cluster.
"""

from __future__ import annotations

import base64
import csv
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.apache_kafka import security
from tests.support.apache_kafka.distribution import BROKER_JVM, KAFKA_4, classpath, logs_through_reload4j, shared_classes
from tests.support.processes import free_port, stop_process
from tests.support.waiting import wait_for

CONTROLLER_ID = 100
BROKER_RACKS = {1: "a", 2: "b", 3: "c"}
START_TIMEOUT_S = 120.0

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
# The same, for Kafka 3's reload4j (log4j 1 properties: log4j2's would be ignored, and log4j 1
# without a configuration prints nothing but a warning).
_LOG4J1 = """\
log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaRaftServer=INFO
log4j.logger.org.apache.kafka.controller=WARN
"""


def _jmx_flags(port: int) -> list[str]:
    """Remote JMX on ``port`` (RMI on the same port), unauthenticated, on the loopback: the broker's own metrics."""
    flags = {"port": port, "rmi.port": port, "authenticate": "false", "ssl": "false", "local.only": "true"}
    return [f"-Dcom.sun.management.jmxremote.{k}={v}" for k, v in flags.items()] + ["-Djava.rmi.server.hostname=127.0.0.1"]


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
    secure_port: int = 0
    oauth_port: int = 0
    jmx_port: int = 0
    process: subprocess.Popen[bytes] | None = None


@dataclass
class KafkaCluster:
    """``with KafkaCluster(workdir) as kc: kc.bootstrap`` — a controller and three brokers on 127.0.0.1."""

    workdir: Path
    version: str = KAFKA_4
    extra_broker_config: dict[str, str] = field(default_factory=dict)
    controllers: int = 1
    nodes: dict[int, _Node] = field(default_factory=dict)
    racks: dict[int, str] = field(default_factory=lambda: dict(BROKER_RACKS))  # the brokers, and theirs
    secured: security.Secured | None = None
    _secure_props: dict[str, str] = field(default_factory=dict)
    _cluster_id: str = ""
    _voters: str = ""

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes.values() if n.roles == "broker")

    @property
    def secure_bootstrap(self) -> str:
        """The brokers' SASL_SSL listeners (trust :attr:`secured` ``.ca_file``; users in ``.users``)."""
        return ",".join(f"127.0.0.1:{n.secure_port}" for n in self.nodes.values() if n.roles == "broker")

    @property
    def oauth_bootstrap(self) -> str:
        """The brokers' ``OAUTH`` listeners: SCRAM-SHA-512, or OAUTHBEARER with JWTs from ``secured.token``."""
        return ",".join(f"127.0.0.1:{n.oauth_port}" for n in self.nodes.values() if n.roles == "broker")

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
        if logs_through_reload4j(self.version):
            self._log_config().write_text(_LOG4J1)
        else:
            self._log_config().write_text(_LOG4J2 + security.LOG4J2_AUTHORIZER)
            self.secured, self._secure_props = security.prepare(self.workdir)
        self._cluster_id = _cluster_id()
        controller_ports = {CONTROLLER_ID + i: free_port() for i in range(self.controllers)}
        self._voters = ",".join(f"{node_id}@127.0.0.1:{port}" for node_id, port in controller_ports.items())
        for node_id, port in controller_ports.items():
            self.nodes[node_id] = self._node(node_id, "controller", port, self._voters)
        for broker_id in self.racks:
            self.nodes[broker_id] = self._node(broker_id, "broker", free_port(), self._voters, free_port(), free_port())
        self._format(cp, list(self.nodes.values()))
        for node in self.nodes.values():
            self._launch(cp, node)
        wait_for(
            f"{len(self.racks)} brokers registered with the controller",
            self._all_brokers_up,
            START_TIMEOUT_S,
            seen=self.logs_tail,
        )

    def add_broker(self, broker_id: int, rack: str) -> None:
        """One more broker in the running cluster (formatted, started, registered): a cluster that grows."""
        assert broker_id not in self.nodes
        self.racks[broker_id] = rack
        node = self.nodes[broker_id] = self._node(broker_id, "broker", free_port(), self._voters, free_port(), free_port())
        cp = classpath(self.version)
        self._format(cp, [node])
        self._launch(cp, node)
        wait_for(f"broker {broker_id} registered with the controller", self._all_brokers_up, START_TIMEOUT_S, seen=self.logs_tail)

    def active_controller(self) -> int:
        """The node id of the quorum's leader, the active controller (Kafka's kafka-metadata-quorum tool)."""
        from tests.support.apache_kafka.tools import run_tool

        out = run_tool("kafka-metadata-quorum", "--bootstrap-server", self.bootstrap, "describe", "--status").out
        found = re.search(r"^LeaderId:\s*(\d+)", out, re.MULTILINE)
        assert found is not None, f"kafka-metadata-quorum named no leader:\n{out}"
        return int(found.group(1))

    def _node(self, node_id: int, roles: str, port: int, voters: str, secure_port: int = 0, oauth_port: int = 0) -> _Node:
        data = self.workdir / f"node-{node_id}"
        props = {
            "process.roles": roles,
            "node.id": str(node_id),
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(data),
            **(security.authorizer_props() if self.secured is not None else {}),
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
            listeners, protocols = f"PLAINTEXT://127.0.0.1:{port}", "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
            if self.secured is not None:
                listeners += f",SASL_SSL://127.0.0.1:{secure_port},OAUTH://127.0.0.1:{oauth_port}"
                protocols += ",SASL_SSL:SASL_SSL,OAUTH:SASL_SSL"
            props |= {
                "listeners": listeners,
                "advertised.listeners": listeners,
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": protocols,
                **self._secure_props,
                "broker.rack": self.racks[node_id],
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
        jmx_port = free_port() if roles == "broker" else 0
        return _Node(node_id, roles, port, config, self.workdir / f"node-{node_id}.log", secure_port, oauth_port, jmx_port)

    def _log_config(self) -> Path:
        return self.workdir / ("log4j.properties" if logs_through_reload4j(self.version) else "log4j2.properties")

    def _java(self, cp: str, main: str, *args: str, node_id: int = 0) -> list[str]:
        java = shutil.which("java") or "java"
        if logs_through_reload4j(self.version):
            logs = [f"-Dlog4j.configuration={self._log_config().as_uri()}"]
        else:
            logs = [f"-Dlog4j2.configurationFile={self._log_config()}", f"-Dkfan.authorizer.log={self.authorizer_log_path(node_id)}"]
        node = self.nodes.get(node_id)
        jmx = _jmx_flags(node.jmx_port) if node is not None and node.jmx_port else []
        oauth = security.java_flags(self.secured) if self.secured is not None else []
        return [java, *BROKER_JVM, *shared_classes(self.version), *logs, *jmx, *oauth, "-cp", cp, main, *args]

    def metric(self, broker_id: int, mbean: str, attribute: str = "Count") -> float:
        """One attribute of one of the broker's own metrics (a JMX MBean), read with Kafka's JmxTool; 0 when the
        broker has not created the MBean (Kafka makes per-topic metrics on first use). An MBean pattern
        (``...,request=Metadata,*``) sums the attribute over every MBean it matches."""
        from tests.support.apache_kafka.tools import run_tool

        url = f"service:jmx:rmi:///jndi/rmi://127.0.0.1:{self.nodes[broker_id].jmx_port}/jmxrmi"
        ran = run_tool("kafka-jmx", "--jmx-url", url, "--object-name", mbean, "--attributes", attribute, "--one-time", "true", check=False)
        if ran.code != 0 and "No matched attributes" in ran.out + ran.err:
            return 0.0  # a pattern no MBean matches yet
        assert ran.code == 0, f"kafka-jmx on broker {broker_id}: exit {ran.code}\n{ran.out[-2000:]}\n{ran.err[-2000:]}"
        out = ran.out
        # CSV: a header naming each "<mbean>:<attribute>" (quoted: MBean names hold commas), then one row of values (time first).
        rows = [row for row in csv.reader(out.splitlines()) if row]
        if len(rows) < 2:
            return 0.0
        header, values = rows[0], rows[-1]
        return sum(float(v) for name, v in zip(header, values, strict=False) if name.endswith(f":{attribute}"))

    def authorizer_log_path(self, node_id: int) -> Path:
        return self.workdir / f"authorizer-{node_id}.log"

    def authorizer_log(self) -> str:
        """Every broker's authorizer decisions so far (principals other than ANONYMOUS; Kafka 4 only)."""
        paths = [self.authorizer_log_path(i) for i in self.brokers]
        return "".join(p.read_text(errors="replace") for p in paths if p.exists())

    def _format(self, cp: str, nodes: list[_Node]) -> None:
        """The nodes' log dirs, formatted with Kafka's storage tool (all at once: each is a JVM of seconds)."""
        scram = security.scram_format_args(self.secured.users) if self.secured is not None else []
        formats = {
            n.node_id: subprocess.Popen(
                self._java(cp, "kafka.tools.StorageTool", "format", "-t", self._cluster_id, "-c", str(n.config), *scram),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for n in nodes
        }
        for node_id, p in formats.items():
            out, _ = p.communicate(timeout=120)
            if p.returncode != 0:
                raise RuntimeError(f"formatting node {node_id} failed (exit {p.returncode}):\n{out[-3000:]}")

    def _launch(self, cp: str, node: _Node) -> None:
        out = open(node.log_path, "ab")  # noqa: SIM115 (the child writes to it until it ends)
        node.process = subprocess.Popen(
            self._java(cp, "kafka.Kafka", str(node.config), node_id=node.node_id), stdout=out, stderr=subprocess.STDOUT
        )
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
        return sorted(md.brokers) == sorted(self.racks)

    def logs_tail(self, lines: int = 30) -> str:
        out = []
        for node in self.nodes.values():
            if node.log_path.exists():
                tail = node.log_path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- node {node.node_id} ({node.roles}) ---\n" + "\n".join(tail))
        return "\n".join(out)

    def stop(self) -> None:
        """Every node: the brokers together (SIGTERM to all first: each one's controlled shutdown takes
        seconds, one after another they took 10-20 s of every run), then the controller they report to."""
        for controllers in (False, True):
            nodes = [n for n in self.nodes.values() if (n.roles == "controller") == controllers and n.process is not None]
            for node in nodes:
                if node.process is not None and node.process.poll() is None:
                    node.process.terminate()
            for node in nodes:
                if node.process is not None:
                    stop_process(node.process, 30)  # already told to stop: waits, then SIGKILL
                    node.process = None

    def kill(self) -> None:
        """Every node SIGKILLed at once: a cluster thrown away, whose controlled shutdown would only cost time."""
        for node in self.nodes.values():
            if node.process is not None:
                node.process.kill()
                node.process.wait(30)
                node.process = None

    def stop_broker(self, broker_id: int, *, kill: bool = False) -> None:
        """Stop one broker (or controller): a controlled shutdown (SIGTERM), or ``kill``: SIGKILL, as a crash would."""
        node = self.nodes[broker_id]
        assert node.process is not None, f"node {broker_id} is not running"
        if kill:
            node.process.kill()
            node.process.wait(30)
        else:
            stop_process(node.process, 60)
        node.process = None

    def start_broker(self, broker_id: int) -> None:
        """Start a stopped broker (or controller) again, with its log dir and ports as they were."""
        node = self.nodes[broker_id]
        assert node.process is None, f"node {broker_id} is running"
        self._launch(classpath(self.version), node)

    @contextmanager
    def stopped(self, broker_id: int, *, kill: bool = False) -> Iterator[None]:
        """Broker (or controller) ``broker_id`` stopped for the with-block (:meth:`stop_broker`), started again at
        its end, also when the block fails: the next tests share the cluster."""
        self.stop_broker(broker_id, kill=kill)
        try:
            yield
        finally:
            self.start_broker(broker_id)

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

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int = 3,
        config: dict[str, str] | None = None,
        replicas: list[list[int]] | None = None,
    ) -> None:
        """``replicas``: each partition's replicas, its preferred leader first (default: Kafka places them)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        if replicas is not None:
            assert len(replicas) == partitions and all(len(r) == replication_factor for r in replicas)
            new = NewTopic(name, partitions, replica_assignment=replicas, config=config or {})
        else:
            new = NewTopic(name, partitions, replication_factor, config=config or {})
        futures = admin.create_topics([new], operation_timeout=30)
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
