"""Zone-aware fetching through the real kfan process, with real clients (KIP-392).

librdkafka's mock brokers get racks: broker 1 in zone-a, 2 in zone-b, 3 in
zone-c. Every partition is led by broker 1 or 3 and has broker 2 as its
follower, which the mock's leader names as preferred read replica in every
Fetch v11+ it answers (with no records, whatever the rack asked). kfan runs
with ``--rack zone-b``, so every Fetch should be served by the same-rack
follower, for clients that name no rack at all.

What must hold: everything produced is consumed exactly once and in order;
kfan's ``kfan_fetch_bytes_total`` shows the records came from broker 2
(same-rack), none from the leaders; a lagging follower never gives the
consumer an offset or a watermark beyond the leader's, and its records come
once it catches up; a follower that goes down costs the consumer no error
and nothing is lost or read twice, kfan reading from the leaders from the
next Fetch on.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from proxy.tools.mock_cluster import MockCluster
from tests.support.flows import PARTITIONS, Flow, Reports, check_in_order
from tests.support.kfan import Kfan, kfan_on
from tests.support.metrics import http_get, labels_of, metrics_port_in, parse_samples
from tests.support.waiting import wait_for

RACKS = {1: "zone-a", 2: "zone-b", 3: "zone-c"}
LEADERS = [1, 3, 1, 3, 1, 3]
FOLLOWER = 2
KFAN = ("--rack", "zone-b", "--metrics-listen", "127.0.0.1:0")


def racked_cluster() -> tuple[MockCluster, str]:
    """The cluster (racks set) and a topic whose partitions all name broker 2 as their follower."""
    cluster = MockCluster(3)
    for broker, rack in RACKS.items():
        cluster.set_rack(broker, rack)
    topic = f"zones-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, PARTITIONS, replication_factor=3, leaders=LEADERS)
    for p in range(PARTITIONS):
        cluster.set_follower(topic, p, FOLLOWER)
    return cluster, topic


def fetched_bytes(k: Kfan) -> dict[tuple[int, str], float]:
    """kfan_fetch_bytes_total: (broker, locality) -> bytes of records it sent kfan."""
    _, text = http_get(f"http://127.0.0.1:{metrics_port_in(k.log)}/metrics")
    out: dict[tuple[int, str], float] = {}
    for labels, value in parse_samples(text).get("kfan_fetch_bytes_total", []):
        lab = labels_of(labels)
        out[(int(lab["broker"]), lab["locality"])] = value
    return out


def fetches_asked(k: Kfan) -> float:
    """Fetch requests kfan has read from its clients (kfan_client_requests_total, api_key 1)."""
    _, text = http_get(f"http://127.0.0.1:{metrics_port_in(k.log)}/metrics")
    return sum(value for labels, value in parse_samples(text).get("kfan_client_requests_total", []) if labels_of(labels)["api_key"] == "1")


def by_broker(counts: dict[tuple[int, str], float]) -> dict[int, float]:
    out: dict[int, float] = defaultdict(float)
    for (broker, _), n in counts.items():
        out[broker] += n
    return dict(out)


@pytest.mark.parametrize("client_rack", [None, "zone-c"])
def test_a_group_reads_everything_from_the_same_rack_follower(client_rack: str | None) -> None:
    """No client.rack: kfan's zone picks the replica. With one (the bug this fixes: such a client got no data
    through kfan), the client's rack goes to the leaders; the mock ignores it and names broker 2 all the same."""
    cluster, topic = racked_cluster()
    with cluster, kfan_on(cluster, *KFAN) as k:
        group = f"g-{uuid.uuid4().hex[:8]}"
        extra = {} if client_rack is None else {"client.rack": client_rack}
        flow = Flow(topic, produce_via=k, consume_via=k, rate=2500, group=group, consumer_config=extra).start()
        try:
            wait_for("10,000 records produced", lambda: flow.sent >= 10_000 or bool(flow.failures), timeout=60)
        finally:
            flow.finish(timeout=90)
        values = sorted(int(v) for _, _, _, v in flow.consumed)
        assert len(values) >= 10_000
        assert values == sorted(flow.reports.ok) == list(range(flow.sent)), "records lost or read twice"
        check_in_order(flow.consumed)
        assert flow.consumer_errors == [] and flow.reports.failed == {}, flow.consumer_errors
        fetched = fetched_bytes(k)
        print(f"records bytes kfan fetched, (broker, locality) -> bytes: {fetched}")
        per_broker = by_broker(fetched)
        assert per_broker.get(FOLLOWER, 0) >= sum(len(str(v)) for v in values), "the follower did not serve the records"
        assert per_broker.get(1, 0) == 0 and per_broker.get(3, 0) == 0, "records came from the leaders"
        assert set(fetched) <= {(1, "cross-rack"), (2, "same-rack"), (3, "cross-rack")}


def produce(bootstrap: str, topic: str, first: int, per_partition: int) -> dict[int, int]:
    """``per_partition`` records to each partition, values ``first``...; each partition's offset after them."""
    reports = Reports()
    ends: dict[int, int] = {}

    def delivered(err: object, msg: object) -> None:
        reports(err, msg)  # type: ignore[arg-type]
        if err is None:
            p, o = msg.partition(), msg.offset()  # type: ignore[attr-defined]
            ends[p] = max(ends.get(p, 0), o + 1)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    n = first
    for _ in range(per_partition):
        for p in range(PARTITIONS):
            producer.produce(topic, value=str(n).encode(), partition=p, on_delivery=delivered)
            n += 1
    assert producer.flush(30) == 0
    assert not reports.failed and len(reports.ok) == n - first
    return ends


def test_a_lagging_follower_never_shows_more_than_the_leader_and_everything_comes_once_it_catches_up() -> None:
    cluster, topic = racked_cluster()
    with cluster, kfan_on(cluster, *KFAN) as k:
        caught_up_to = produce(k.bootstrap, topic, 0, 200)
        # The follower stops at the first 200 records of each partition (its high watermark is the
        # mock's last offset it serves); 200 more reach the leader only.
        for p in range(PARTITIONS):
            cluster.set_follower_wmarks(topic, p, -1, caught_up_to[p] - 1)
        leader_end = produce(k.bootstrap, topic, 1200, 200)
        consumer = Consumer(
            {
                "bootstrap.servers": k.bootstrap,
                "group.id": f"lag-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
            }
        )
        partitions = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        rows: list[tuple[int, int, bytes | None, bytes]] = []

        def consume() -> int:
            """What one consume call brings (the watermarks the consumer knows checked): the count of records so far."""
            for m in consumer.consume(500, timeout=0.2):
                assert m.error() is None, m.error()
                rows.append((m.partition(), m.offset(), m.key(), m.value()))
            for p in range(PARTITIONS):
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
                assert high <= leader_end[p], f"partition {p}: high watermark {high} beyond the leader's {leader_end[p]}"
            return len(rows)

        try:
            follower_has = sum(caught_up_to.values())
            wait_for("the records the follower has to be consumed", lambda: consume() >= follower_has, timeout=60)
            # Then the consumer asks again and again (each Fetch answered at its max wait) and gets nothing more.
            asked = fetches_asked(k)
            wait_for("the consumer to ask for more, five more times", lambda: consume() >= 0 and fetches_asked(k) >= asked + 5, timeout=60)
            lagging = defaultdict(list)
            for p, o, _, _ in rows:
                lagging[p].append(o)
            # What the follower has, all of it, once; nothing it does not have yet.
            assert {p: sorted(os) for p, os in lagging.items()} == {p: list(range(caught_up_to[p])) for p in range(PARTITIONS)}
            # The follower catches up: the rest arrives, from where the consumer stopped.
            for p in range(PARTITIONS):
                cluster.set_follower_wmarks(topic, p, -1, -1)
            wait_for("every record to be consumed once the follower caught up", lambda: consume() >= 2400, timeout=60)
        finally:
            consumer.close()
        assert sorted(int(v) for _, _, _, v in rows) == list(range(2400)), "records lost or read twice"
        check_in_order(rows)
        assert all(o < leader_end[p] for p, o, _, _ in rows)
        per_broker = by_broker(fetched_bytes(k))
        assert per_broker.get(1, 0) == per_broker.get(3, 0) == 0 and per_broker[FOLLOWER] > 0


def test_the_follower_going_down_sends_fetches_back_to_the_leaders_and_loses_nothing() -> None:
    cluster, topic = racked_cluster()
    with cluster, kfan_on(cluster, *KFAN) as k:
        group = f"g-{uuid.uuid4().hex[:8]}"
        cluster.set_coordinator("group", group, 1)  # the group outlives broker 2
        flow = Flow(topic, produce_via=k, consume_via=k, rate=1000, group=group).start()
        try:
            wait_for("records to flow from the follower", lambda: len(flow.consumed) >= 2000 or bool(flow.failures))
            before = by_broker(fetched_bytes(k))
            assert before.get(1, 0) == before.get(3, 0) == 0
            cluster.broker_down(FOLLOWER)
            down_at, sent_at_down = time.monotonic(), flow.sent
            # Kafka's leader stops naming a replica that left the cluster; the mock's must be told.
            for p in range(PARTITIONS):
                cluster.set_follower(topic, p, -1)
            wait_for(
                "records produced after the follower went down to be consumed from every partition",
                lambda: bool(flow.failures) or all(max(flow.values_from(p), default=-1) >= sent_at_down for p in range(PARTITIONS)),
                timeout=30,
            )
            print(f"records produced after the follower went down were consumed {time.monotonic() - down_at:.2f} s after")
        finally:
            flow.finish(timeout=90)
        values = sorted(int(v) for _, _, _, v in flow.consumed)
        assert values == sorted(flow.reports.ok) == list(range(flow.sent)), "records lost or read twice"
        check_in_order(flow.consumed)
        assert flow.consumer_errors == [] and flow.reports.failed == {}, flow.consumer_errors
        after = by_broker(fetched_bytes(k))
        assert after.get(1, 0) > 0 and after.get(3, 0) > 0, "the leaders did not take over"
