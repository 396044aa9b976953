"""Faults on the real cluster, and the figures a fault's time window gives.

The fault suites (``tests/test_kafka_faults.py``, and its long mode
``tests/test_kafka_faults_long.py``) run Kafka's verifiable clients and a
confluent-kafka transactional run directly and through kfan, side by side,
while these helpers break the cluster and wait for it to heal. A
:class:`Timeline` keeps when each fault began and when the cluster was whole
again, so one continuous run can be judged fault by fault: records
acknowledged, errors the clients saw and the longest produce stall within
each window.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.apache_kafka.tools import run_tool
from tests.support.waiting import wait_for

RECOVER_TIMEOUT_S = 120.0


def now_ms() -> int:
    """The clock the verifiable clients stamp their events with (milliseconds since the epoch)."""
    return int(time.time() * 1000)


def placements(kafka: KafkaCluster, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    """partition -> (leader, replicas, isr), as the brokers' Metadata gives them."""
    md = AdminClient({"bootstrap.servers": kafka.bootstrap, "log_level": 0}).list_topics(topic, timeout=10)
    return {p.id: (p.leader, list(p.replicas), list(p.isrs)) for p in md.topics[topic].partitions.values()}


def leaders(kafka: KafkaCluster, *topics: str) -> set[int]:
    return {leader for t in topics for leader, _, _ in placements(kafka, t).values()}


def leading_most(kafka: KafkaCluster, topic: str) -> int:
    """The broker leading the most partitions of ``topic`` (about a third of them, placed by Kafka)."""
    led = [leader for leader, _, _ in placements(kafka, topic).values()]
    return max(kafka.racks, key=led.count)


def isr_full(kafka: KafkaCluster, *topics: str) -> None:
    def full() -> bool:
        try:
            return all(len(isr) == len(replicas) for t in topics for _, replicas, isr in placements(kafka, t).values())
        except Exception:
            return False

    wait_for(f"every replica of {topics} back in sync", full, RECOVER_TIMEOUT_S, seen=kafka.logs_tail)


def elect_preferred(kafka: KafkaCluster, *topics: str) -> None:
    """Preferred leaders back for every partition of ``topics`` (Kafka's ElectLeaders, as kafka-leader-election sends it)."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap, "log_level": 0})
    partitions = [TopicPartition(t, p) for t in topics for p in placements(kafka, t)]
    # (No timeout arguments: confluent-kafka 2.16 fails on them with a SystemError; its defaults are the socket timeout.)
    admin.elect_leaders(ElectionType.PREFERRED, partitions).result(60)

    def preferred() -> bool:
        return all(leader == replicas[0] for t in topics for leader, replicas, _ in placements(kafka, t).values())

    wait_for("every partition led by its preferred leader", preferred, RECOVER_TIMEOUT_S, seen=kafka.logs_tail)


def restore(kafka: KafkaCluster, *topics: str) -> None:
    """Every node up, ISRs full, preferred leaders back: the cluster as the next test expects it."""
    for node in kafka.nodes.values():
        if node.process is None:
            kafka.start_broker(node.node_id)
    isr_full(kafka, *topics)
    elect_preferred(kafka, *topics)


@dataclass
class Window:
    """One fault: from its first blow to the cluster whole again, in the verifiable clients' clock."""

    name: str
    start_ms: int
    end_ms: int = 0


@dataclass
class Timeline:
    windows: list[Window] = field(default_factory=list)

    @contextmanager
    def fault(self, name: str) -> Iterator[Window]:
        window = Window(name, now_ms())
        self.windows.append(window)
        try:
            yield window
        finally:
            window.end_ms = now_ms()


@dataclass
class Figures:
    """What a client saw during one window: acknowledged sends (or committed transactions' records), errors, the stall."""

    acked: int
    errors: Counter[str]
    longest_stall_ms: int

    def cell(self) -> str:
        errors = ", ".join(f"{k} x{v}" for k, v in sorted(self.errors.items())) or "none"
        return f"acked {self.acked:>6} | errors {sum(self.errors.values()):>3} ({errors}) | longest stall {self.longest_stall_ms:>6} ms"


def figures(acks: list[tuple[int, int]], errors: list[tuple[int, str]], window: Window) -> Figures:
    """``acks``: (time, records) of each acknowledgement; ``errors``: (time, name). The longest stall is the longest
    gap between two acknowledgements that overlaps the window (a stall that began before it counts)."""
    times = sorted(t for t, _ in acks)
    inside = sum(n for t, n in acks if window.start_ms <= t <= window.end_ms)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b >= window.start_ms and a <= window.end_ms]
    seen = Counter(name for t, name in errors if window.start_ms <= t <= window.end_ms)
    return Figures(inside, seen, max(gaps, default=0))


def leader_election(kafka: KafkaCluster) -> None:
    """A preferred leader election of every partition with Kafka's own tool, as an operator runs it."""
    run_tool("kafka-leader-election", "--bootstrap-server", kafka.bootstrap, "--election-type", "preferred", "--all-topic-partitions")


def grow_and_move(kafka: KafkaCluster, topics: list[str], workdir: Path) -> int:
    """A broker added to the cluster, then made by ``kafka-reassign-partitions --execute`` the first (preferred)
    replica of every partition of ``topics``, in place of its last one, and by an election their leader: its id."""
    new = max(kafka.racks) + 1
    kafka.add_broker(new, "a")
    plan = {
        "version": 1,
        "partitions": [
            {"topic": t, "partition": p, "replicas": [new, *replicas[:-1]]}
            for t in topics
            for p, (_, replicas, _) in sorted(placements(kafka, t).items())
        ],
    }
    path = workdir / "reassignment.json"
    path.write_text(json.dumps(plan))
    tool = ("kafka-reassign-partitions", "--bootstrap-server", kafka.bootstrap, "--reassignment-json-file", str(path))
    run_tool(*tool, "--execute")
    wanted = {(m["topic"], m["partition"]): m["replicas"] for m in plan["partitions"]}

    def moved() -> bool:
        # Read from Metadata (a JVM per --verify poll cost seconds of CPU each): every partition on its new
        # replicas, all in sync.
        now = {(t, p): (replicas, isr) for t in topics for p, (_, replicas, isr) in placements(kafka, t).items()}
        return all(now[k][0] == r and sorted(now[k][1]) == sorted(r) for k, r in wanted.items())

    # (Not confirmed with --verify as well: another JVM, seconds of CPU, to say what Metadata says.)
    wait_for("the reassignment to complete", moved, RECOVER_TIMEOUT_S, seen=kafka.logs_tail)
    elect_preferred(kafka, *topics)  # the tool's election is a scenario of its own
    led = leaders(kafka, *topics)
    assert led == {new}, f"after the election the added broker leads every partition: leaders {led}"
    return new
