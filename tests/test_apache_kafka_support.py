"""The suite's Apache Kafka harness (tests/support/apache_kafka) itself."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from tests.support.apache_kafka.cluster import KafkaCluster, _cluster_id
from tests.support.apache_kafka.distribution import KAFKA_3, KAFKA_4, kafka_jars, logs_through_reload4j
from tests.support.waiting import wait_for


def test_cluster_ids_never_look_like_an_option() -> None:
    """Kafka's storage tool takes an id starting with "-" for an option (a clean run failed on one, 1 in 64)."""
    ids = [_cluster_id() for _ in range(5000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize(
    ("version", "binding", "other"), [(KAFKA_4, "log4j-slf4j-impl", "slf4j-reload4j"), (KAFKA_3, "slf4j-reload4j", "log4j-slf4j-impl")]
)
def test_each_version_has_one_logging_binding(version: str, binding: str, other: str) -> None:
    """Kafka 4 gets the pom's log4j2 binding; Kafka 3 keeps its own (reload4j) and no second one,
    which SLF4J would pick from at random."""
    jars = {p.name for p in kafka_jars(version).glob("*.jar")}
    assert any(j.startswith(f"{binding}-") for j in jars), sorted(jars)
    assert not any(j.startswith(f"{other}-") for j in jars), sorted(jars)
    assert logs_through_reload4j(version) == (binding == "slf4j-reload4j")


def test_kafka_3_nodes_log_through_their_configuration(apache_kafka_3: KafkaCluster) -> None:
    """Kafka 3.9's nodes read the log4j 1 configuration: each logs its start at INFO with its pattern
    (without one, log4j 1 prints only a warning that it has no appenders)."""

    def logged_start(node_id: int, log: Path) -> bool:
        return f"INFO [KafkaRaftServer nodeId={node_id}] Kafka Server started (kafka.server.KafkaRaftServer)" in log.read_text(
            errors="replace"
        )

    for node in apache_kafka_3.nodes.values():
        # A broker is listed as soon as it registers, a moment before it logs that it started.
        wait_for(f"node {node.node_id} to log its start", partial(logged_start, node.node_id, node.log_path), seen=apache_kafka_3.logs_tail)
        assert "No appenders could be found" not in node.log_path.read_text(errors="replace")
