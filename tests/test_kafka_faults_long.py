"""Kafka's bad days one at a time: the long mode of ``tests/test_kafka_faults.py``.

CI runs the faults one after another under one continuous load (that module);
this one gives each fault its own load, its own figures and its own recovery,
which takes twice as long. It is collected only with ``KFAN_LONG_FAULTS=1``
(see ``tests/conftest.py``); the README says how to run it.

Each scenario runs Kafka's ``VerifiableProducer`` (acks=all, idempotent) and
``VerifiableConsumer`` (a group, committing after every poll) twice side by
side, on two topics of the same shape: directly against the brokers and
through kfan. The fault hits both at once. What must hold, the same for both:
every acknowledged record consumed, none written twice, each partition's
offsets in the order the values were sent, the consumer still consuming after
the fault, and kfan the same process throughout. After a scenario the cluster
is as it was: every node up, every partition's ISR full, preferred leaders
elected.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.apache_kafka.faults import RECOVER_TIMEOUT_S, grow_and_move, isr_full, leader_election, leaders, leading_most, restore
from tests.support.apache_kafka.verifiable import Verdict, VerifiableRun
from tests.support.kfan import Kfan
from tests.support.metrics import metric_total
from tests.support.waiting import wait_for

PARTITIONS = 6
THROUGHPUT = 200  # records a second, per producer
WARM_ACKS = 400  # acknowledged (and some consumed) before the fault
AFTER_ACKS = 400  # more acknowledged after it, before the producers stop


@dataclass
class Side:
    name: str  # "direct" or "kfan"
    topic: str
    run: VerifiableRun


@pytest.fixture
def sides(quorum_kafka: KafkaCluster, quorum_kfan: Kfan, tmp_path: Path) -> Iterator[list[Side]]:
    """Producer and consumer directly and through kfan, each side on its own fresh topic, running and warm."""
    kafka, kfan = quorum_kafka, quorum_kfan
    run = uuid.uuid4().hex[:8]
    out: list[Side] = []
    for name, bootstrap in (("direct", kafka.bootstrap), ("kfan", kfan.bootstrap)):
        topic = f"faults-{name}-{run}"
        kafka.create_topic(topic, PARTITIONS)
        out.append(Side(name, topic, VerifiableRun(bootstrap, topic, tmp_path / name, throughput=THROUGHPUT, name=name)))
    pid = kfan.process.pid
    try:
        for side in out:
            side.run.start()
        for side in out:
            wait_for(
                f"{side.name}: {WARM_ACKS} records acknowledged and consumption under way",
                lambda s=side: s.run.acked() >= WARM_ACKS and s.run.consuming(),  # type: ignore[misc]
                RECOVER_TIMEOUT_S,
                seen=side.run.log_tail,
            )
        yield out
    finally:
        for side in out:
            side.run.stop()
        restore(kafka, *(s.topic for s in out))
    assert kfan.alive() and kfan.process.pid == pid, "kfan exited during the fault:\n" + "".join(kfan.log[-60:])


def _judged(sides: list[Side], scenario: str) -> dict[str, Verdict]:
    """Produce some more after the fault, stop the producers, let the consumers catch up: each side's verdict."""
    start = {s.name: s.run.acked() for s in sides}
    for side in sides:
        wait_for(
            f"{side.name}: {AFTER_ACKS} more records acknowledged after the fault",
            lambda s=side: s.run.acked() >= start[s.name] + AFTER_ACKS,  # type: ignore[misc]
            RECOVER_TIMEOUT_S,
            seen=side.run.log_tail,
        )
    verdicts = {s.name: s.run.finish(RECOVER_TIMEOUT_S) for s in sides}
    for name, v in verdicts.items():
        print(f"{scenario} | {name:6} | {v.row()} | {dict(v.send_errors)}")
    for name, v in verdicts.items():
        assert v.lost == [], f"{scenario}, {name}: {len(v.lost)} acknowledged records never consumed: {v.lost[:20]}"
        assert v.written_twice == [], f"{scenario}, {name}: records written twice despite idempotence: {v.written_twice[:20]}"
        assert v.out_of_order == [], f"{scenario}, {name}: partitions out of order: {v.out_of_order}"
        assert v.acked >= WARM_ACKS + AFTER_ACKS
    return verdicts


def test_rolling_restart_of_every_broker(quorum_kafka: KafkaCluster, sides: list[Side]) -> None:
    """Controlled shutdown of one broker at a time, each back and in sync before the next: the everyday operation."""
    for broker_id in quorum_kafka.racks:
        with quorum_kafka.stopped(broker_id):
            time.sleep(3)  # traffic runs a while without it
        isr_full(quorum_kafka, *(s.topic for s in sides))
    _judged(sides, "rolling restart")


def test_the_broker_leading_a_third_of_the_partitions_killed(quorum_kafka: KafkaCluster, sides: list[Side]) -> None:
    victim = leading_most(quorum_kafka, sides[0].topic)
    with quorum_kafka.stopped(victim, kill=True):
        time.sleep(10)  # the controller fences it (session timeout 9 s) and elects new leaders
    isr_full(quorum_kafka, *(s.topic for s in sides))
    _judged(sides, "SIGKILL of a leader")


def test_a_broker_that_stops_answering_without_closing(quorum_kafka: KafkaCluster, sides: list[Side]) -> None:
    """SIGSTOP for 20 s: its connections stay open and nothing answers; then SIGCONT."""
    victim = leading_most(quorum_kafka, sides[0].topic)
    with quorum_kafka.paused(victim):
        time.sleep(20)
    isr_full(quorum_kafka, *(s.topic for s in sides))
    _judged(sides, "SIGSTOP 20 s")


def test_the_active_controller_killed(quorum_kafka: KafkaCluster, sides: list[Side]) -> None:
    """The quorum elects another controller; the brokers, the clients and kfan carry on."""
    active = quorum_kafka.active_controller()
    with quorum_kafka.stopped(active, kill=True):
        wait_for(
            "another active controller", lambda: quorum_kafka.active_controller() != active, RECOVER_TIMEOUT_S, seen=quorum_kafka.logs_tail
        )
        time.sleep(3)
    _judged(sides, "controller failover")


def test_a_preferred_leader_election_during_the_load(quorum_kafka: KafkaCluster, sides: list[Side]) -> None:
    """One broker restarted (its partitions led elsewhere meanwhile), then its leadership given back by election under load."""
    topics = [s.topic for s in sides]
    victim = leading_most(quorum_kafka, topics[0])
    quorum_kafka.stop_broker(victim)
    quorum_kafka.start_broker(victim)
    isr_full(quorum_kafka, *topics)
    assert victim not in leaders(quorum_kafka, *topics)
    leader_election(quorum_kafka)
    assert victim in leaders(quorum_kafka, *topics)
    _judged(sides, "preferred election")


def test_a_broker_added_and_partitions_moved_to_it(
    quorum_kafka: KafkaCluster, quorum_kfan: Kfan, sides: list[Side], tmp_path: Path
) -> None:
    """A fourth broker joins; a reassignment (kafka-reassign-partitions --execute) under load makes it a replica
    of every partition and, by election, the leader of them: kfan learns it and sends to it, without a restart."""
    new = grow_and_move(quorum_kafka, [s.topic for s in sides], tmp_path)
    before = metric_total(quorum_kfan.log, "kfan_broker_request_duration_seconds_count", broker=str(new))
    _judged(sides, "broker added, partitions moved")
    after = metric_total(quorum_kfan.log, "kfan_broker_request_duration_seconds_count", broker=str(new))
    assert after > before, "kfan sent nothing to the added broker"
