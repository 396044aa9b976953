"""Preferred read replicas in the sans-IO core: the store, what a Fetch merge learns and
forgets, the bytes it counts by locality, and the ISR the topology keeps for it."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core import Context, FetchForward, ForgetReadReplicas, LearnReadReplicas, Response, plan_request
from proxy.core.fetch import locality
from proxy.core.read_replicas import ReadReplicas
from proxy.core.topology import Broker, Topology
from proxy.kafka import apis, errors
from tests.support.core_inputs import ALL_VERSIONS, IDENTITY, effects_of, without_topics
from tests.support.messages import answer_bytes, request_bytes
from tests.support.records import record_batch

RACKED = {1: Broker(1, "b1", 9092, "zone-a"), 2: Broker(2, "b2", 9092, "zone-b"), 3: Broker(3, "b3", 9092, None)}
TOPOLOGY = Topology(brokers=RACKED, leaders={"t": {0: 1, 1: 1}}, isr={"t": {0: frozenset({1, 2}), 1: frozenset({1, 2})}})
FETCH_V = 12


def test_a_preference_holds_until_its_age() -> None:
    store = ReadReplicas(max_age=10.0)
    store.learn({("zone-b", "t", 0): 2}, now=100.0)
    assert store.get(("zone-b", "t", 0), now=109.9) == 2
    assert store.get(("zone-c", "t", 0), now=100.0) is None, "another rack's clients have their own replicas"
    assert store.get(("zone-b", "t", 0), now=110.0) is None
    assert len(store) == 0, "an aged preference is dropped, not kept"


def test_learning_again_renews_and_the_oldest_go_first_beyond_the_bound() -> None:
    store = ReadReplicas(max_age=10.0, max_entries=2)
    store.learn({("r", "t", 0): 2, ("r", "t", 1): 2}, now=0.0)
    store.learn({("r", "t", 0): 3}, now=5.0)  # named again (another replica): the newest now
    store.learn({("r", "t", 2): 2}, now=6.0)
    assert len(store) == 2
    assert store.get(("r", "t", 1), now=6.0) is None, "the oldest was not the one dropped"
    assert store.get(("r", "t", 0), now=14.0) == 3, "learning again did not renew the age"
    store.forget([("r", "t", 0), ("r", "t", 9)])
    assert store.get(("r", "t", 0), now=6.0) is None and store.get(("r", "t", 2), now=6.0) == 2


@pytest.mark.parametrize(
    ("kfan_rack", "broker", "expected"),
    [("zone-b", 2, "same-rack"), ("zone-b", 1, "cross-rack"), ("zone-b", 3, "unknown"), ("", 2, "unknown"), ("zone-b", 9, "unknown")],
)
def test_locality_is_the_brokers_rack_against_kfans(kfan_rack: str, broker: int, expected: str) -> None:
    assert locality(TOPOLOGY, kfan_rack, broker) == expected


def test_the_topology_keeps_each_partitions_isr_through_its_json_form() -> None:
    metadata = {
        "brokers": [{"node_id": 1, "host": "b1", "port": 9092, "rack": "zone-a"}, {"node_id": 2, "host": "b2", "port": 9092, "rack": None}],
        "topics": [{"name": "t", "error_code": 0, "partitions": [{"partition_index": 0, "leader_id": 1, "isr_nodes": [1, 2]}, {"partition_index": 1, "leader_id": 2, "isr_nodes": [2]}]}],
    }  # fmt: skip
    topology = Topology().with_metadata(metadata)
    assert topology.can_read_from("t", 0, 2) and not topology.can_read_from("t", 1, 1)
    assert not topology.can_read_from("t", 0, 3), "not a live broker"
    assert Topology.from_json(topology.to_json()) == topology
    assert without_topics(topology, ["t"]).isr == {}


def _fetch(rack: str) -> bytes:
    parts = [{"partition": p, "current_leader_epoch": -1, "fetch_offset": 5, "last_fetched_epoch": -1, "log_start_offset": -1,
              "partition_max_bytes": 1 << 20} for p in (0, 1)]  # fmt: skip
    body = {"replica_id": -1, "max_wait": 500, "min_bytes": 1, "max_bytes": 50 << 20, "isolation_level": 0, "session_id": 0,
            "session_epoch": -1, "topics": [{"topic": "t", "partitions": parts}], "forgotten_topics_data": [], "rack_id": rack}  # fmt: skip
    return request_bytes(apis.FETCH, FETCH_V, body, 7)


def _answer(partitions: list[dict[str, Any]]) -> Response:
    entries = [{"error_code": 0, "high_watermark": 20, "last_stable_offset": 20, "log_start_offset": 0, "aborted_transactions": None,
                "preferred_read_replica": -1, "records": None, **p} for p in partitions]  # fmt: skip
    body = {"throttle_time": 0, "error_code": 0, "session_id": 0, "responses": [{"topic": "t", "partitions": entries}]}
    return Response(answer_bytes(apis.FETCH, FETCH_V, body, 7))


def test_a_merge_learns_what_leaders_name_forgets_what_replicas_fail_and_counts_bytes_by_locality() -> None:
    preferred = {("zone-b", "t", 1): 2}
    ctx = Context(IDENTITY, TOPOLOGY, ALL_VERSIONS, rack="zone-b", read_replica=preferred.get)
    plan = plan_request(ctx, _fetch(""))
    assert isinstance(plan, FetchForward) and set(plan.subs) == {1, 2}
    batch = record_batch(b"x" * 50)
    # Partition 0's leader names broker 2; partition 1's replica (broker 2) answers records.
    reply = plan.merge(
        plan, {1: _answer([{"partition_index": 0, "preferred_read_replica": 2}]), 2: _answer([{"partition_index": 1, "records": batch}])}
    )
    assert effects_of(reply, LearnReadReplicas) == [LearnReadReplicas({("zone-b", "t", 0): 2})]
    assert effects_of(reply, ForgetReadReplicas) == []
    assert reply.fetched == {(1, "cross-rack"): 0, (2, "same-rack"): len(batch)}
    # The replica errs: forgotten, and the client is not told the replica's error.
    reply = plan.merge(
        plan, {1: _answer([{"partition_index": 0}]), 2: _answer([{"partition_index": 1, "error_code": errors.OFFSET_NOT_AVAILABLE}])}
    )
    assert effects_of(reply, ForgetReadReplicas) == [ForgetReadReplicas(frozenset({("zone-b", "t", 1)}))]
    assert reply.errors[(errors.OFFSET_NOT_AVAILABLE, 2)] == 1, "the replica's error is not counted for metrics"


def test_a_leader_naming_a_replica_kfan_cannot_read_from_is_not_followed_and_a_stale_preference_is_forgotten() -> None:
    topology = Topology(brokers=RACKED, leaders={"t": {0: 1, 1: 1}}, isr={"t": {0: frozenset({1}), 1: frozenset({1})}})
    preferred = {("zone-b", "t", 1): 2}  # no longer in the ISR
    plan = plan_request(Context(IDENTITY, topology, ALL_VERSIONS, rack="zone-b", read_replica=preferred.get), _fetch(""))
    assert isinstance(plan, FetchForward) and set(plan.subs) == {1}
    reply = plan.merge(
        plan, {1: _answer([{"partition_index": 0, "preferred_read_replica": 2}, {"partition_index": 1, "preferred_read_replica": 9}])}
    )
    assert effects_of(reply, LearnReadReplicas) == []
    assert effects_of(reply, ForgetReadReplicas) == [ForgetReadReplicas(frozenset({("zone-b", "t", 1)}))]


def test_a_fetch_before_v11_goes_to_leaders_and_learns_nothing() -> None:
    parts = [{"partition": 0, "fetch_offset": 5, "partition_max_bytes": 1 << 20}]
    payload = request_bytes(apis.FETCH, 4, {"replica_id": -1, "max_wait": 500, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
                                            "topics": [{"topic": "t", "partitions": parts}]}, 7)  # fmt: skip
    preferred = {(rack, "t", 0): 2 for rack in ("", "zone-b")}
    plan = plan_request(Context(IDENTITY, TOPOLOGY, ALL_VERSIONS, rack="zone-b", read_replica=preferred.get), payload)
    assert isinstance(plan, FetchForward) and set(plan.subs) == {1}
