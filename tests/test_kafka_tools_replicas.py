"""Kafka's replica tools through kfan: kafka-log-dirs, kafka-leader-election, kafka-reassign-partitions.

Each is run as its main class with ``--bootstrap-server`` pointed at kfan and,
for comparison, at Apache Kafka's brokers (side by side where the two runs
cannot disturb each other). These tools speak of brokers by id, and kfan
shows its clients one broker (node 0) holding every replica with ``--broker-ids
kfan`` (``kfan_kafka_one_node``, also when the run shows the brokers' own ids), so:

- kafka-log-dirs asks that one node, and kfan answers with every broker's
  log dirs: every replica the brokers report, with their sizes and offset
  lags, under kfan's node. A broker that does not answer shows as an offline
  log dir (asked with kafka-python, for a second: a broker paused through a
  whole JVM tool run could be fenced, and its leaders moved).
- kafka-leader-election names partitions only: the same answers as directly.
- kafka-reassign-partitions --list and --verify show replica sets as kfan's
  Metadata does (kfan's id, as many times as there are replicas); a plan
  naming real brokers can be neither generated nor executed through kfan,
  whose clients never see those brokers (README, Limitations): the tool
  refuses before it changes anything. Operators place replicas against the
  brokers themselves. --cancel names partitions only, and works through kfan.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any, NamedTuple

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from kafka import TopicPartition
from kafka.admin import KafkaAdminClient

from proxy.core.log_dirs import UNREACHABLE
from proxy.kafka.errors import KAFKA_STORAGE_ERROR
from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.apache_kafka.tools import Ran, run_tool, run_tools
from tests.support.kfan import KFAN_NODE, Kfan, start_kfan
from tests.support.waiting import wait_for


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _both(kafka: KafkaCluster, kfan: Kfan, tool: str, *args: str, check: bool = True) -> tuple[Ran, Ran]:
    """``tool`` directly and through kfan, side by side: (direct, through kfan)."""
    direct, through = run_tools(
        (tool, "--bootstrap-server", kafka.bootstrap, *args), (tool, "--bootstrap-server", kfan.bootstrap, *args), check=check
    )
    return direct, through


def _produce(bootstrap: str, topic: str, n: int, size: int = 100) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for i in range(n):
        producer.produce(topic, key=f"k{i}".encode(), value=b"v" * size)
    assert producer.flush(30) == 0


class Placement(NamedTuple):
    leader: int
    replicas: list[int]


def _placements(kafka: KafkaCluster, topic: str) -> dict[int, Placement]:
    """Each partition's leader and replicas, as the brokers' Metadata gives them."""
    md = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(topic, timeout=10)
    return {p.id: Placement(p.leader, list(p.replicas)) for p in md.topics[topic].partitions.values()}


def _write_json(path: Path, doc: object) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


# --- kafka-log-dirs ---------------------------------------------------------------------


def _log_dirs(out: str) -> tuple[list[int], dict[str, list[tuple[str, int, int, bool]]]]:
    """kafka-log-dirs' JSON (its last line): the brokers it names, and each log dir's replicas as
    (partition, size, offset lag, future)."""
    doc = json.loads(out.strip().splitlines()[-1])
    dirs = {}
    for broker in doc["brokers"]:
        for d in broker["logDirs"]:
            assert d["error"] is None, d
            dirs[d["logDir"]] = sorted((p["partition"], p["size"], p["offsetLag"], p["isFuture"]) for p in d["partitions"])
    return sorted(b["broker"] for b in doc["brokers"]), dirs


def test_kafka_log_dirs_through_kfan_shows_every_replica_the_brokers_hold(apache_kafka: KafkaCluster, kfan_kafka_one_node: Kfan) -> None:
    topic = _name("tools-logdirs")
    apache_kafka.create_topic(topic, 3)
    _produce(apache_kafka.bootstrap, topic, 300)
    direct, through = _both(apache_kafka, kfan_kafka_one_node, "kafka-log-dirs", "--describe", "--topic-list", topic)
    assert f"Received log directory information from brokers {KFAN_NODE}\n" in through.out, through.out
    (real_brokers, real), (shown_brokers, shown) = _log_dirs(direct.out), _log_dirs(through.out)
    assert (real_brokers, shown_brokers) == ([1, 2, 3], [KFAN_NODE])
    # kfan's node holds every broker's log dirs (this cluster's brokers have paths of their
    # own; brokers sharing a path: tests/test_log_dirs.py), each replica with its facts.
    assert shown == real
    replicas = sorted(r for rs in shown.values() for r in rs)
    assert [r[0] for r in replicas] == [f"{topic}-{p}" for p in range(3) for _ in range(3)], "three replicas of each partition"
    assert all(size > 0 and lag == 0 and not future for _, size, lag, future in replicas), replicas


def test_log_dirs_through_kfan_show_a_broker_that_does_not_answer_as_an_offline_log_dir(apache_kafka: KafkaCluster) -> None:
    """Kafka's Admin client ignores DescribeLogDirs' top-level error once any log dir is listed: a broker
    that did not answer must be in the list itself, as a broker lists a disk it cannot read."""
    topic = _name("tools-offline")
    apache_kafka.create_topic(topic, 3)
    direct = KafkaAdminClient(bootstrap_servers=apache_kafka.bootstrap)
    try:
        (paused_broker,) = direct.describe_log_dirs(topic_partitions=[topic], brokers=[3])
    finally:
        direct.close()
    (paused_dir,) = (d["log_dir"] for d in paused_broker["log_dirs"])
    # A kfan of its own that gives up on a broker after a second: the paused broker's
    # part is answered without it, while the controller still counts it alive (9 s).
    kfan = start_kfan(apache_kafka.bootstrap, "--request-timeout", "1", "--broker-ids", "kfan")
    try:
        admin = KafkaAdminClient(bootstrap_servers=kfan.bootstrap)
        try:
            (whole,) = admin.describe_log_dirs(topic_partitions=[topic])
            with apache_kafka.paused(3):
                (partial,) = admin.describe_log_dirs(topic_partitions=[topic])
        finally:
            admin.close()
    finally:
        alive, code = kfan.alive(), kfan.stop()
    assert alive and code == 0, "".join(kfan.log[-40:])

    def dirs(node: dict[str, Any]) -> list[tuple[str, int, list[Any]]]:
        return sorted((d["log_dir"], d["error_code"], d["topics"]) for d in node["log_dirs"])

    assert (whole["broker"], partial["broker"]) == (KFAN_NODE, KFAN_NODE)
    assert len(dirs(whole)) == 3 and paused_dir in [name for name, _, _ in dirs(whole)]
    answered = [d for d in dirs(whole) if d[0] != paused_dir]
    assert dirs(partial) == sorted([*answered, (UNREACHABLE, KAFKA_STORAGE_ERROR, [])])


# --- kafka-leader-election --------------------------------------------------------------


def _elections(out: str) -> dict[str, set[str]]:
    """kafka-leader-election's report: the partitions it elected a leader for, and those that needed none."""
    found: dict[str, set[str]] = {"elected": set(), "not needed": set()}
    for line in out.splitlines():
        if m := re.fullmatch(r"Successfully completed leader election \(PREFERRED\) for partitions (.+)", line.strip()):
            found["elected"] |= set(m[1].split(", "))
        elif m := re.fullmatch(r"Valid replica already elected for partitions (.+)", line.strip()):
            found["not needed"] |= set(m[1].split(", "))
    return found


def _election_file(path: Path, topic: str, partitions: list[int]) -> str:
    return _write_json(path, {"partitions": [{"topic": topic, "partition": p} for p in partitions]})


def test_kafka_leader_election_through_kfan(apache_kafka: KafkaCluster, kfan_kafka: Kfan, tmp_path: Path) -> None:
    topic = _name("tools-elect")
    apache_kafka.create_topic(topic, 4)
    before = _placements(apache_kafka, topic)
    # Partitions 0 and 2 get another preferred replica (the first): reordering the
    # replicas leaves the leader where it is, off the preferred replica.
    reordered = {p: before[p].replicas[1:] + before[p].replicas[:1] for p in (0, 2)}
    admin = KafkaAdminClient(bootstrap_servers=apache_kafka.bootstrap)
    try:
        accepted = admin.alter_partition_reassignments({TopicPartition(topic, p): r for p, r in reordered.items()})
    finally:
        admin.close()
    assert accepted == {TopicPartition(topic, p): None for p in reordered}
    wait_for(
        "replicas reordered",
        lambda: all(_placements(apache_kafka, topic)[p].replicas == r for p, r in reordered.items()),
        30,
    )
    moved = _placements(apache_kafka, topic)
    assert all(moved[p].leader == before[p].leader != moved[p].replicas[0] for p in reordered), moved

    def elect(bootstrap: str, partitions: list[int], name: str) -> tuple[str, ...]:
        json_file = _election_file(tmp_path / name, topic, partitions)
        return ("kafka-leader-election", "--bootstrap-server", bootstrap, "--election-type", "preferred", "--path-to-json-file", json_file)

    # Through kfan for partitions 0 and 1, directly for 2 and 3: one election needed and one not, each.
    through, direct = run_tools(elect(kfan_kafka.bootstrap, [0, 1], "through.json"), elect(apache_kafka.bootstrap, [2, 3], "direct.json"))
    assert _elections(through.out) == {"elected": {f"{topic}-0"}, "not needed": {f"{topic}-1"}}, through.out
    assert _elections(direct.out) == {"elected": {f"{topic}-2"}, "not needed": {f"{topic}-3"}}, direct.out
    wait_for(
        "every partition led by its preferred replica",
        lambda: all(p.leader == p.replicas[0] for p in _placements(apache_kafka, topic).values()),
        30,
    )
    # Now none needs one, and both say so of all four.
    every = [0, 1, 2, 3]
    through, direct = run_tools(
        elect(kfan_kafka.bootstrap, every, "all-through.json"), elect(apache_kafka.bootstrap, every, "all-direct.json")
    )
    assert _elections(through.out) == _elections(direct.out) == {"elected": set(), "not needed": {f"{topic}-{p}" for p in every}}


# --- kafka-reassign-partitions ------------------------------------------------------------


def _json_after(out: str, heading: str) -> dict[str, Any]:
    """The JSON document on the first non-empty line after ``heading`` in a tool's output."""
    lines = out.splitlines()
    rest = lines[lines.index(heading) + 1 :]
    return json.loads(next(line for line in rest if line.strip()))


def test_kafka_reassign_partitions_generate_execute_verify_through_kfan(
    apache_kafka: KafkaCluster, kfan_kafka_one_node: Kfan, tmp_path: Path
) -> None:
    topic = _name("tools-reassign")
    apache_kafka.create_topic(topic, 3)
    tool = "kafka-reassign-partitions"
    before = _placements(apache_kafka, topic)
    # A reordering of each partition's replicas: data stays, the preferred replica changes.
    target = {p: s.replicas[1:] + s.replicas[:1] for p, s in before.items()}
    plan = _write_json(
        tmp_path / "plan.json",
        {"version": 1, "partitions": [{"topic": topic, "partition": p, "replicas": r} for p, r in sorted(target.items())]},
    )
    topics = _write_json(tmp_path / "topics.json", {"version": 1, "topics": [{"topic": topic}]})
    generate = ("--generate", "--topics-to-move-json-file", topics, "--broker-list", "1,2,3")
    generated, not_generated, not_executed = run_tools(
        (tool, "--bootstrap-server", apache_kafka.bootstrap, *generate),
        (tool, "--bootstrap-server", kfan_kafka_one_node.bootstrap, *generate),
        (tool, "--bootstrap-server", kfan_kafka_one_node.bootstrap, "--execute", "--reassignment-json-file", plan),
        check=False,
    )
    assert generated.code == 0, generated.err
    current = _json_after(generated.out, "Current partition replica assignment")
    assert {p["partition"]: p["replicas"] for p in current["partitions"]} == {p: s.replicas for p, s in before.items()}
    # Through kfan there are no brokers 1, 2, 3 to place replicas on (kfan is node 0),
    # and a plan naming them is refused before anything changes.
    assert not_generated.code != 0 and "Proposed partition reassignment" not in not_generated.out, not_generated.out
    assert not_executed.code != 0 and "Unknown broker id" in not_executed.out + not_executed.err, not_executed.out
    assert _placements(apache_kafka, topic) == before
    executed = run_tool(tool, "--bootstrap-server", apache_kafka.bootstrap, "--execute", "--reassignment-json-file", plan)
    assert f"Successfully started partition reassignments for {topic}-0,{topic}-1,{topic}-2" in executed.out, executed.out
    wait_for("the replicas reordered", lambda: {p: s.replicas for p, s in _placements(apache_kafka, topic).items()} == target, 30)
    # --preserve-throttles: clearing them means altering each named broker's config, and
    # through kfan the Admin client waits its whole timeout for brokers it is never shown.
    verify = ("--verify", "--reassignment-json-file", plan, "--preserve-throttles")
    direct, through = _both(apache_kafka, kfan_kafka_one_node, tool, *verify)
    for p, replicas in sorted(target.items()):
        assert f"Reassignment of partition {topic}-{p} is completed." in direct.out, direct.out
        shown = ",".join([str(KFAN_NODE)] * len(replicas))
        wanted = ",".join(map(str, replicas))
        line = f"There is no active reassignment of partition {topic}-{p}, but replica set is {shown} rather than {wanted}."
        assert line in through.out, through.out


def _moving(kafka: KafkaCluster, topic: str) -> bool:
    """Whether partition 0 of ``topic`` is being reassigned, by the brokers' ListPartitionReassignments."""
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        return TopicPartition(topic, 0) in admin.list_partition_reassignments()
    finally:
        admin.close()


_BROKER_THROTTLES = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
_TOPIC_THROTTLES = ("leader.replication.throttled.replicas", "follower.replication.throttled.replicas")


def _throttle(kafka: KafkaCluster, topic: str, on: bool) -> None:
    """Replication of ``topic``'s replicas throttled to 1 B/s on every broker (as ``--execute --throttle 1``
    sets it), or every such throttle removed."""
    op = AlterConfigOpType.SET if on else AlterConfigOpType.DELETE
    resources = [
        ConfigResource(
            ResourceType.BROKER, str(b), incremental_configs=[ConfigEntry(k, "1", incremental_operation=op) for k in _BROKER_THROTTLES]
        )
        for b in kafka.brokers
    ]
    resources.append(
        ConfigResource(
            ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry(k, "*", incremental_operation=op) for k in _TOPIC_THROTTLES]
        )
    )
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for resource in resources:  # librdkafka takes one BROKER resource per call
        admin.incremental_alter_configs([resource])[resource].result(30)


def test_kafka_reassign_partitions_list_and_cancel_through_kfan_while_a_replica_moves(
    apache_kafka: KafkaCluster, kfan_kafka_one_node: Kfan, tmp_path: Path
) -> None:
    topic = _name("tools-moving")
    apache_kafka.create_topic(topic, 1, replication_factor=2)
    (placement,) = _placements(apache_kafka, topic).values()
    leaving, staying = placement.replicas
    (arriving,) = set(apache_kafka.brokers) - {leaving, staying}
    # More than the 1 MiB a new replica's first fetch may copy: throttled to 1 B/s, the
    # rest takes a quota window (11 s) per MiB, so the move is still on while the tool lists it.
    _produce(apache_kafka.bootstrap, topic, 6000, size=1000)
    tool = "kafka-reassign-partitions"
    plan = _write_json(
        tmp_path / "plan.json", {"version": 1, "partitions": [{"topic": topic, "partition": 0, "replicas": [arriving, staying]}]}
    )
    admin = KafkaAdminClient(bootstrap_servers=apache_kafka.bootstrap)
    _throttle(apache_kafka, topic, on=True)
    try:
        assert admin.alter_partition_reassignments({TopicPartition(topic, 0): [arriving, staying]}) == {TopicPartition(topic, 0): None}
        direct, through = _both(apache_kafka, kfan_kafka_one_node, tool, "--list")
        listed_while_moving = _moving(apache_kafka, topic)
        # Cancelling names partitions only (the throttles it would clear are per broker: kept).
        cancelled = run_tool(
            tool, "--bootstrap-server", kfan_kafka_one_node.bootstrap, "--cancel", "--reassignment-json-file", plan, "--preserve-throttles"
        )
        moving_after = _moving(apache_kafka, topic)
    finally:
        if _moving(apache_kafka, topic):
            admin.alter_partition_reassignments({TopicPartition(topic, 0): None})
        admin.close()
        _throttle(apache_kafka, topic, on=False)
    assert listed_while_moving, "the move ended before both had listed it"
    real = f"{topic}-0: replicas: {arriving},{staying},{leaving}. adding: {arriving}. removing: {leaving}."
    assert real in direct.out.splitlines(), direct.out
    k = KFAN_NODE
    assert f"{topic}-0: replicas: {k},{k},{k}. adding: {k}. removing: {k}." in through.out.splitlines(), through.out
    assert f"Successfully cancelled partition reassignment for: {topic}-0" in cancelled.out, cancelled.out
    assert not moving_after
    # Cancelled: the replicas it had (Kafka keeps their order as the move left it).
    wait_for("the replica set as before", lambda: sorted(_placements(apache_kafka, topic)[0].replicas) == sorted([leaving, staying]), 30)
