"""The suite's Apache Kafka harness (tests/support/apache_kafka) itself."""

from __future__ import annotations

from tests.support.apache_kafka.cluster import _cluster_id


def test_cluster_ids_never_look_like_an_option() -> None:
    """Kafka's storage tool takes an id starting with "-" for an option (a clean run failed on one, 1 in 64)."""
    ids = [_cluster_id() for _ in range(5000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)
