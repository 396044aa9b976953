"""The reference Java client (kafka-clients 4.4) against Apache Kafka, directly and through kfan, with the same checks.

Produce with an idempotent producer (acks=all), consume in a group with
commits, under both group protocols (``classic`` and KIP-848's ``consumer``),
then ask the admin client for the group's offsets, state and type and the
topic's end offsets;
and transactions: a committed batch and an aborted one, read read_committed,
where the aborted records must stay invisible through kfan exactly as
directly (the mock's Fetch ignores transaction markers, so only a real
broker can show this).
"""

from __future__ import annotations

import uuid

import pytest

from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.apache_kafka.java_client import java_round_trip
from tests.support.kfan import Kfan, shown_ids
from tests.support.round_trip import check_exactly_once_in_order, committed_offsets, end_offsets, round_trip_records

PARTITIONS = 6


def _names(prefix: str) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"{prefix}-{tag}", f"{prefix}-g-{tag}"


@pytest.fixture(params=["direct", "kfan", "kfan-ids"])
def target(request: pytest.FixtureRequest, apache_kafka: KafkaCluster) -> tuple[str, list[tuple[int, str, int]]]:
    """Where the client connects, and the brokers its metadata must show (kfan-ids: ``--broker-ids cluster``)."""
    if request.param == "direct":
        return apache_kafka.bootstrap, sorted((i, host, port) for i, (host, port) in apache_kafka.brokers.items())
    if request.param == "kfan-ids":
        k: Kfan = request.getfixturevalue("kfan_kafka_ids")
        return k.bootstrap, [(i, k.host, k.port) for i in sorted(apache_kafka.brokers)]
    k = request.getfixturevalue("kfan_kafka")
    return k.bootstrap, [(i, k.host, k.port) for i in shown_ids(apache_kafka.brokers)]


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_java_round_trip(apache_kafka: KafkaCluster, target: tuple[str, list[tuple[int, str, int]]], protocol: str) -> None:
    bootstrap, brokers = target
    topic, group = _names(f"java-{protocol}")
    apache_kafka.create_topic(topic, PARTITIONS)
    trip = java_round_trip(bootstrap, topic, group, round_trip_records(), protocol=protocol)
    assert trip.brokers == brokers
    assert trip.partitions == set(range(PARTITIONS))
    assert trip.assigned == set(range(PARTITIONS)), trip.log
    check_exactly_once_in_order(trip.consumed)
    assert trip.extra == []
    ends = end_offsets(trip.consumed)
    assert trip.committed == ends
    assert committed_offsets(bootstrap, group, topic, PARTITIONS) == ends  # read back by another client
    # The admin client, through the same address: the group's offsets, its state and type, the log ends.
    assert trip.group_offsets == ends
    assert (trip.group_state, trip.group_members, trip.group_type) == ("Empty", 0, protocol.capitalize()), trip.log
    assert trip.end_offsets == ends


def test_java_transactions_hide_aborted_records(apache_kafka: KafkaCluster, target: tuple[str, list[tuple[int, str, int]]]) -> None:
    bootstrap, _ = target
    topic, group = _names("java-tx")
    apache_kafka.create_topic(topic, PARTITIONS)
    trip = java_round_trip(bootstrap, topic, group, round_trip_records(), aborted=1000)
    assert not [r for r in trip.consumed + trip.extra if r[3].startswith(b"aborted")], "an aborted record was read"
    check_exactly_once_in_order(trip.consumed)
    assert trip.extra == []
    # The committed positions are past the records: the commit and abort markers take offsets too.
    ends = end_offsets(trip.consumed)
    assert trip.committed is not None and all(trip.committed[p] > ends[p] for p in ends), (trip.committed, ends)
    assert trip.group_offsets == trip.committed
    assert trip.end_offsets == trip.committed  # the last stable offset: past the abort marker
