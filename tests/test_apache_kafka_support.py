"""The suite's Apache Kafka harness (tests/support/apache_kafka) itself."""

from __future__ import annotations

import pytest

from tests.support.apache_kafka.cluster import _cluster_id
from tests.support.apache_kafka.distribution import KAFKA_3, KAFKA_4, kafka_jars, logs_through_reload4j


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
