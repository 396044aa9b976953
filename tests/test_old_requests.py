"""Requests of the versions Kafka 4 removed, sent raw through the real kfan to real brokers.

Encoded and read back with kafka-python's hand-written structs of those
versions (not kfan's codec), and compared with the same request sent to the
brokers directly: Produce v0-2 and Fetch v0-3 carry message sets (magic 0
and 1) across brokers, OffsetCommit v0-1 and OffsetFetch v0 keep a group's
offsets, ListOffsets v0 answers as the broker does, and the admin APIs'
v0 (CreateTopics, DescribeConfigs, DeleteTopics) keep their connection.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition

from proxy.kafka import apis, errors
from proxy.tools.mock_cluster import MockCluster
from tests.support.kfan import Kfan
from tests.support.rawclient import RawClient
from tests.support.records import legacy_set
from tests.support.tansu import Tansu
from tests.support.waiting import wait_for

PARTITIONS = [0, 1, 2]  # led by brokers 1, 2 and 3 (the `topic` fixture)


def _address(bootstrap: str) -> tuple[str, int]:
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    return host, int(port)


def _message_set(partition: int, version: int) -> bytes:
    magic = 1 if version == 2 else 0  # as clients of each version send them
    return legacy_set([(f"k{partition}-{i}".encode(), f"v{partition}-{i}".encode(), 1_700_000_000_000 + i) for i in range(5)], magic)


def _fetch(client: RawClient, version: int, topic: str, partitions: list[int]) -> dict[int, tuple[int, int, bytes]]:
    """partition -> (error code, high watermark, records), by Fetches of ``version`` from offset 0.

    Asked again while a partition whose high watermark says it holds records comes back
    empty: kfan, like a broker, may answer before every broker's data is in.
    """
    parts = [(p, 0, 1 << 20) for p in partitions]
    request: tuple[object, ...] = (-1, 100, 1, [(topic, parts)])
    if version == 3:
        request = (-1, 100, 1, 1 << 20, [(topic, parts)])
    out: dict[int, tuple[int, int, bytes]] = {}

    def every_partition_with_records_brought_them() -> bool:
        answer = client.call_old(apis.FETCH, version, request)
        responses = answer[0] if version == 0 else answer[1]
        for t in responses:
            for p in t[1]:
                if p[0] not in out or not out[p[0]][2]:
                    out[p[0]] = (p[1], p[2], p[3])
        return all(records or high_watermark == 0 for _, high_watermark, records in out.values())

    wait_for(
        f"Fetch v{version} to bring the records of every partition that has some",
        every_partition_with_records_brought_them,
        60,
        seen=lambda: {p: (error, high_watermark, len(records)) for p, (error, high_watermark, records) in out.items()},
    )
    return out


@pytest.mark.parametrize("version", [0, 1, 2])
def test_produce_message_sets_split_by_leader_and_fetch_back_at_every_old_version(
    kfan: Kfan, cluster: MockCluster, topic: str, version: int
) -> None:
    sets = {p: _message_set(p, version) for p in PARTITIONS}
    corrupt = bytearray(_message_set(1, version))
    corrupt[-1] ^= 0x01  # the last message's value: its CRC-32 no longer matches
    sent = {**sets, 1: bytes(corrupt)}
    with RawClient(kfan.address) as client:
        answer = client.call_old(apis.PRODUCE, version, (-1, 5000, [(topic, [(p, sent[p]) for p in PARTITIONS])]))
        results = {p[0]: p[1] for t in answer[0] for p in t[1]}
        assert results == {0: 0, 1: errors.CORRUPT_MESSAGE, 2: 0}
        for fetch_version in (0, 1, 2, 3):
            through_kfan = _fetch(client, fetch_version, topic, PARTITIONS)
            direct = {}
            for p, broker in zip(PARTITIONS, (1, 2, 3), strict=True):
                with RawClient(cluster.brokers[broker]) as direct_client:
                    direct.update(_fetch(direct_client, fetch_version, topic, [p]))
            assert through_kfan == direct, fetch_version
            assert through_kfan[1][1] == 0 and not through_kfan[1][2], "the corrupt set never reached its broker"
            for p in (0, 2):
                error, high_watermark, records = through_kfan[p]
                assert (error, high_watermark) == (0, 5)
                # The broker stored the client's messages as they were (offsets 0-4 assigned as sent).
                assert records == sets[p]


@pytest.mark.parametrize("version", [0, 1])
def test_group_offsets_committed_with_old_versions_read_back_at_every_version(
    kfan: Kfan, cluster: MockCluster, topic: str, version: int
) -> None:
    group = f"old-commit-{uuid.uuid4().hex[:8]}"
    offsets = {p: 10 * (p + 1) + version for p in range(6)}
    if version == 0:
        request: tuple[object, ...] = (group, [(topic, [(p, o, "meta") for p, o in offsets.items()])])
    else:  # v1: generation -1 and no member: a commit outside group membership, as simple consumers make
        request = (group, -1, "", [(topic, [(p, o, -1, "meta") for p, o in offsets.items()])])
    with RawClient(kfan.address) as client:
        answer = client.call_old(apis.OFFSET_COMMIT, version, request)
        assert {p[0]: p[1] for t in answer[0] for p in t[1]} == dict.fromkeys(offsets, 0)
        fetched = client.call_old(apis.OFFSET_FETCH, 0, (group, [(topic, list(offsets))]))
        assert {p[0]: (p[1], p[2], p[3]) for t in fetched[0] for p in t[1]} == {p: (o, "meta", 0) for p, o in offsets.items()}
    # Read back directly from the cluster by a current client (OffsetFetch v7+), not through kfan.
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in offsets], timeout=20)
    finally:
        consumer.close()
    assert {tp.partition: tp.offset for tp in committed} == offsets


def test_list_offsets_v0_answers_as_the_leaders_do(kfan: Kfan, cluster: MockCluster, topic: str) -> None:
    with RawClient(kfan.address) as client:
        answer = client.call_old(apis.PRODUCE, 2, (-1, 5000, [(topic, [(p, _message_set(p, 2)) for p in PARTITIONS])]))
        assert all(p[1] == 0 for t in answer[0] for p in t[1])
        latest = client.call_old(apis.LIST_OFFSETS, 0, (-1, [(topic, [(p, -1, 1) for p in PARTITIONS])]))
    through_kfan = {p[0]: (p[1], p[2]) for t in latest[0] for p in t[1]}
    direct = {}
    for p, broker in zip(PARTITIONS, (1, 2, 3), strict=True):
        with RawClient(cluster.brokers[broker]) as direct_client:
            answer = direct_client.call_old(apis.LIST_OFFSETS, 0, (-1, [(topic, [(p, -1, 1)])]))
            direct.update({e[0]: (e[1], e[2]) for t in answer[0] for e in t[1]})
    assert through_kfan == direct
    assert through_kfan[0] == (0, [5])


def test_admin_v0_requests_keep_their_connection(kfan_tansu: Kfan, tansu: Tansu) -> None:
    """CreateTopics v0, DescribeConfigs v0 and DeleteTopics v0 on one connection, as Tansu answers them.

    Tansu's DescribeConfigs v0 answer lacks each config's is_default (v1's
    layout without synonyms): kfan forwards it as it came, as it must a
    broker's answer it does not need to change, and the connection goes on.
    """
    name = f"old-admin-{uuid.uuid4().hex[:8]}"
    with RawClient(kfan_tansu.address) as client:
        created = client.call_old(apis.CREATE_TOPICS, 0, ([(name, 2, 1, [], [("retention.ms", "123456")])], 10_000))
        assert [(t[0], t[1]) for t in created[0]] == [(name, 0)]
        every_config = ([(2, name, None)],)
        described = client.call_old_raw(apis.DESCRIBE_CONFIGS, 0, every_config)
        with RawClient(_address(tansu.bootstrap)) as direct:
            assert described == direct.call_old_raw(apis.DESCRIBE_CONFIGS, 0, every_config)
        assert b"retention.ms" in described and b"123456" in described
        deleted = client.call_old(apis.DELETE_TOPICS, 0, ([name], 10_000))
        assert [(t[0], t[1]) for t in deleted[0]] == [(name, 0)]
