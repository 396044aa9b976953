"""Fan-out, acks=0 and ordering, seen on the wire and on the brokers themselves."""

from __future__ import annotations

import struct

from confluent_kafka import Consumer, Producer
from kio.schema.list_offsets.v5.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

from proxy.tools.mock_cluster import MockCluster
from tests.support.kfan import Kfan
from tests.support.rawclient import RawClient
from tests.support.records import produce_request
from tests.support.waiting import wait_for


def _high_watermarks_from_brokers(cluster: MockCluster, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (leader broker, high watermark), asked of each broker directly."""
    out: dict[int, tuple[int, int]] = {}
    for broker, address in cluster.brokers.items():
        with RawClient(address) as c:
            req = ListOffsetsRequest(
                replica_id=-1,  # type: ignore[arg-type]
                isolation_level=0,  # type: ignore[arg-type]
                topics=(
                    ListOffsetsTopic(
                        name=topic,
                        partitions=tuple(ListOffsetsPartition(partition_index=p, current_leader_epoch=-1, timestamp=-1) for p in range(6)),
                    ),
                ),  # type: ignore[arg-type]
            )
            for p in c.call(req).topics[0].partitions:
                if p.error_code.value == 0:
                    out[p.partition_index] = (broker, p.offset)
    return out


def test_one_produce_reaches_all_three_leaders(kfan: Kfan, cluster: MockCluster, topic: str) -> None:
    order = [4, 0, 5, 2, 1, 3]  # deliberately not broker order
    with RawClient(kfan.address) as c:
        resp = c.call(produce_request(topic, order, acks=-1))
    assert [t.name for t in resp.responses] == [topic]
    assert [p.index for p in resp.responses[0].partition_responses] == order, "every partition once, in the client's order"
    assert all(p.error_code.value == 0 for p in resp.responses[0].partition_responses)
    marks = _high_watermarks_from_brokers(cluster, topic)
    assert {p: b for p, (b, _) in marks.items()} == {0: 1, 1: 2, 2: 3, 3: 1, 4: 2, 5: 3}
    assert all(hw == 1 for _, hw in marks.values()), marks


def test_acks_zero_gets_no_response_and_later_requests_keep_order(kfan: Kfan, cluster: MockCluster, topic: str) -> None:
    with RawClient(kfan.address) as c:
        quiet = [c.send(produce_request(topic, [0, 1, 2, 3, 4, 5], acks=0)) for _ in range(20)]
        md_cid = c.send(
            MetadataRequest(
                topics=(MetadataRequestTopic(topic_id=None, name=topic),),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        )  # type: ignore[arg-type]
        more_quiet = [c.send(produce_request(topic, [5, 4], acks=0)) for _ in range(5)]
        produce_cid = c.send(produce_request(topic, [3, 0], acks=1))
        first, second = c.receive(), c.receive()
        assert first is not None and second is not None
        assert struct.unpack_from(">i", first)[0] == md_cid
        assert struct.unpack_from(">i", second)[0] == produce_cid
        try:
            stray = c.receive(timeout=1.5)
        except TimeoutError:
            stray = None
        assert stray is None, f"unexpected response with correlation id {struct.unpack_from('>i', stray)[0]}"
        assert set(quiet).isdisjoint({md_cid, produce_cid}) and more_quiet
    # 20 x all six, 5 x partitions 5 and 4, 1 x partitions 3 and 0. The answer to the acks=1 request
    # (to broker 1 only) says nothing of when brokers 2 and 3 read the acks=0 ones kfan sent them before.
    expected = {0: 21, 1: 20, 2: 20, 3: 21, 4: 25, 5: 25}
    wait_for(
        f"the brokers' high watermarks {expected}",
        lambda: {p: hw for p, (_, hw) in _high_watermarks_from_brokers(cluster, topic).items()} == expected,
        seen=lambda: _high_watermarks_from_brokers(cluster, topic),
        every=0.1,
    )


def test_acks_zero_ten_thousand_records_all_arrive(kfan: Kfan, cluster: MockCluster, topic: str) -> None:
    producer = Producer({"bootstrap.servers": kfan.bootstrap, "acks": 0, "linger.ms": 5})
    for i in range(10_000):
        producer.produce(topic, key=str(i % 97).encode(), value=str(i).encode())
        producer.poll(0)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": kfan.bootstrap,
            "group.id": f"acks0-{topic}",
            "auto.offset.reset": "earliest",
            # The mock holds a rejoin for session timeout - 1 s (see tests/support/round_trip.py).
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    seen: set[int] = set()

    def consume() -> bool:
        seen.update(int(m.value()) for m in consumer.consume(1000, timeout=1) if m.error() is None)
        return len(seen) >= 10_000

    try:
        consumer.subscribe([topic])
        wait_for("the 10,000 records", consume, 120, seen=lambda: f"{len(seen)} distinct records")
    finally:
        consumer.close()
    assert seen == set(range(10_000))
    assert sum(hw for _, hw in _high_watermarks_from_brokers(cluster, topic).values()) == 10_000
