"""Brokers that left the cluster's Metadata, as kfan remembers them (``Topology.departed``).

With ``--broker-ids cluster`` a client is still shown such a broker for a
while (tests/test_broker_ids.py checks the rewrite): librdkafka drops a broker
missing from Metadata and counts the requests out on it as not written, which
through kfan they may have been. Here: what the topology keeps, and that the
cluster forgets them after ``DEPARTED_SHOWN_S``, at most ``MAX_DEPARTED``.
"""

from __future__ import annotations

from typing import Any

import trio.testing

from backends.cluster import DEPARTED_SHOWN_S, MAX_DEPARTED, Cluster
from proxy.core.topology import Broker, Topology


def _metadata(*ids: int) -> dict[str, Any]:
    return {"brokers": [{"node_id": i, "host": f"b{i}", "port": 9000 + i, "rack": f"az-{i}"} for i in ids], "topics": []}


def test_a_broker_that_leaves_is_departed_until_it_is_back() -> None:
    three = Topology().with_metadata(_metadata(1, 2, 3))
    assert three.departed == {}
    two = three.with_metadata(_metadata(1, 3))
    assert two.departed == {2: Broker(2, "b2", 9002, "az-2")} and set(two.brokers) == {1, 3}
    assert two.with_metadata(_metadata(1, 3), described_only=True).departed == two.departed  # still gone: still kept
    assert two.with_metadata(_metadata(1)).departed.keys() == {2, 3}
    assert two.with_metadata(_metadata(1, 2, 3)).departed == {}  # back: a broker again
    assert two.forgetting([2]).departed == {} and two.forgetting([7]) is two
    assert three.refreshed_by(_metadata(1, 3)).departed == two.departed  # kfan's own refresh: the same
    assert Topology.from_json(two.to_json()) == two  # a capture's row keeps them for the replay
    assert Topology.from_json(three.to_json().replace(', "departed": []', "")) == three  # captures made before


async def test_the_cluster_forgets_a_departed_broker_after_a_clients_metadata_max_age(mock_clock: trio.testing.MockClock) -> None:
    cluster = Cluster([("127.0.0.1", 1)])
    cluster.fold_metadata(_metadata(1, 2, 3))
    cluster.fold_metadata(_metadata(1, 3))
    mock_clock.jump(DEPARTED_SHOWN_S / 2)
    cluster.fold_metadata(_metadata(1))
    assert cluster.topology.departed.keys() == {2, 3}
    mock_clock.jump(DEPARTED_SHOWN_S / 2 + 1)
    cluster.fold_metadata(_metadata(1))  # 2 left longer ago than a client keeps its metadata; 3 did not
    assert cluster.topology.departed.keys() == {3}
    cluster.fold_metadata(_metadata(1, 3))
    cluster.fold_metadata(_metadata(1))  # 3 back, then gone again: shown for the whole time from now
    mock_clock.jump(DEPARTED_SHOWN_S / 2 + 1)
    cluster.fold_metadata(_metadata(1))
    assert cluster.topology.departed.keys() == {3}


async def test_the_cluster_keeps_at_most_so_many_departed_brokers(mock_clock: trio.testing.MockClock) -> None:
    cluster = Cluster([("127.0.0.1", 1)])
    cluster.fold_metadata(_metadata(*range(MAX_DEPARTED + 10)))  # a broker's answer may name any number
    mock_clock.jump(1)
    cluster.fold_metadata(_metadata(0, 1))
    mock_clock.jump(1)
    cluster.fold_metadata(_metadata(0))  # 1 left last: it is kept before any of the others
    departed = cluster.topology.departed
    assert len(departed) == MAX_DEPARTED and 1 in departed and 0 not in departed


async def test_an_answer_that_changes_nothing_keeps_the_same_snapshot(mock_clock: trio.testing.MockClock) -> None:
    """What is kept by snapshot (a captured exchange's topology document) stays valid only while the snapshot is the
    same object: an answer describing what kfan already holds does not replace it; one that changes it does."""
    cluster = Cluster([("127.0.0.1", 1)])
    cluster.fold_metadata(_metadata(1, 2))
    before = cluster.topology
    mock_clock.jump(1)
    cluster.fold_metadata(_metadata(1, 2))
    assert cluster.topology is before
    cluster.fold_metadata(_metadata(1))
    assert cluster.topology is not before and cluster.topology.departed.keys() == {2}


async def test_an_answer_describing_a_recent_snapshot_again_brings_back_that_same_snapshot(mock_clock: trio.testing.MockClock) -> None:
    """While brokers disagree, their answers switch the topology between a few states: each state stays one object."""
    cluster = Cluster([("127.0.0.1", 1)])
    cluster.fold_metadata(_metadata(1, 2))
    first = cluster.topology
    cluster.fold_metadata(_metadata(1, 2, 3))
    second = cluster.topology
    cluster.fold_metadata(_metadata(1, 2))
    assert cluster.topology is not second and cluster.topology.departed.keys() == {3}
    third = cluster.topology
    cluster.fold_metadata(_metadata(1, 2, 3))
    assert cluster.topology is second
    cluster.fold_metadata(_metadata(1, 2))
    assert cluster.topology is third and first != third
