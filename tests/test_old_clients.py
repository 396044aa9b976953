"""Old clients through kfan: kafka-python pinned to a pre-2.0 broker release.

With ``api_version`` pinned, kafka-python sends at most the request versions of
that release, whatever kfan advertises: 0.10.x clients produce and fetch
message-format v1 message sets (Produce v2, Fetch v2/v3; ListOffsets v0 for
0.10.0), 0.11 and 1.0 clients magic-2 batches (Produce v3/v5). Kafka 4 removed
Produce v0-2, Fetch v0-3 and ListOffsets v0; kfan serves them anyway.

The acceptance test: each pinned client produces 1,000 keyed records through
kfan in front of the embedded 3-broker cluster, consumes them in a group and
commits; a new member of the group (the restart) reads the commits back at the
pinned version, finds nothing left to read, and the brokers hold the same
commits.

The same round trip runs against real brokers: Apache Kafka 3.9 (the last line
that still serves those versions), through kfan and, for comparison, directly.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.net.connection import KafkaConnection
from kafka.protocol.api_key import ApiKey

from proxy.tools.mock_cluster import MockCluster
from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.kcat import Row
from tests.support.kfan import Kfan
from tests.support.round_trip import (
    check_round_trip,
    committed_offsets,
    end_offsets,
    high_watermarks,
    kafka_python_subscribe,
    keyed_records,
)
from tests.support.waiting import wait_for

N = 1000
PARTITIONS = 6
# Generous deadlines (to deliver, to consume every record, to get an assignment): a loaded machine
# is slow, and each wait ends as soon as what it waits for is there.
DEADLINE_S = 90
# The mock coordinator holds a (re)join for session timeout - 1 s: a short session keeps the test short.
MEMBER = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 300}
# Kafka refuses a session shorter than its group.min.session.timeout.ms (6 s by default);
# its coordinator finishes a join as soon as every member is in, so a longer one costs nothing.
KAFKA_MEMBER = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500}
# Not shorter than a loaded machine may take to answer: the producers are not idempotent, so a
# request that times out and is sent again would store its records twice (or out of order).
TIMEOUTS = {"request_timeout_ms": 30_000, "bootstrap_timeout_ms": 30_000}

# Exact keys of kafka-python's BROKER_API_VERSIONS (a near miss is resolved with a warning),
# with the versions such a client must send on the data path: that release's maxima.
PINNED: dict[str, tuple[tuple[int, ...], dict[ApiKey, int]]] = {
    "0.10.0": (
        (0, 10, 0),
        {ApiKey.Produce: 2, ApiKey.Fetch: 2, ApiKey.ListOffsets: 0, ApiKey.OffsetCommit: 2, ApiKey.OffsetFetch: 1},
    ),
    "0.10.2": (
        (0, 10, 2),
        {ApiKey.Produce: 2, ApiKey.Fetch: 3, ApiKey.ListOffsets: 1, ApiKey.OffsetCommit: 2, ApiKey.OffsetFetch: 2},
    ),
    "0.11": (
        (0, 11),
        {ApiKey.Produce: 3, ApiKey.Fetch: 5, ApiKey.ListOffsets: 2, ApiKey.OffsetCommit: 3, ApiKey.OffsetFetch: 3},
    ),
    "1.0": (
        (1, 0),
        {ApiKey.Produce: 5, ApiKey.Fetch: 6, ApiKey.ListOffsets: 2, ApiKey.OffsetCommit: 3, ApiKey.OffsetFetch: 3},
    ),
}

RELEASES = list(PINNED)

# librdkafka's mock answers Produce v5 without log_start_offset (it writes that field
# from v6 on; Kafka's ProduceResponse has it from v5), so no Produce v5 answer decodes,
# whether the client asks the mock directly or through kfan. A 1.0 client therefore
# produces with acks=0 there, which asks for no answer: the records still go as Produce v5.
# A quirk of the mock only: against Apache Kafka every release waits for every replica.
ACKS = {"1.0": 0}
KAFKA_ACKS = "all"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> set[tuple[int, int]]:
    """(api key, version) of every request kafka-python sends during the test."""
    seen: set[tuple[int, int]] = set()
    send = KafkaConnection._send_request

    def recording(self: KafkaConnection, request: object, *args: object, **kwargs: object) -> object:
        future = send(self, request, *args, **kwargs)  # sets the version of a request that has none
        seen.add((request.API_KEY, request.API_VERSION))  # type: ignore[attr-defined]
        return future

    monkeypatch.setattr(KafkaConnection, "_send_request", recording)
    return seen


def _consumer(bootstrap: str, pinned: tuple[int, ...], group: str, member: dict[str, int]) -> KafkaConsumer:
    # Metadata refreshed every second: a member whose metadata lacks a partition learns of it soon
    # (the first join waits for the topic's metadata: round_trip.kafka_python_subscribe).
    return KafkaConsumer(
        bootstrap_servers=bootstrap,
        api_version=pinned,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        metadata_max_age_ms=1000,
        **member,
        **TIMEOUTS,
    )


def _poll(consumer: KafkaConsumer, timeout_ms: int = 200) -> list[Row]:
    """The records one poll brings."""
    return [
        (r.partition, r.offset, r.key, r.value) for batch in consumer.poll(timeout_ms=timeout_ms, max_records=500).values() for r in batch
    ]


def _poll_for(consumer: KafkaConsumer, seconds: float) -> list[Row]:
    """Records polled for ``seconds`` (to see that nothing more comes)."""
    rows: list[Row] = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        rows += _poll(consumer)
    return rows


def _round_trip(
    bootstrap: str, brokers: str, topic: str, release: str, sent: set[tuple[int, int]], *, acks: int | str, member: dict[str, int]
) -> None:
    """The pinned ``release`` produces, consumes in a group and commits through ``bootstrap``;
    a restarted member finds the commits; ``brokers`` (asked directly) hold them."""
    pinned, versions = PINNED[release]
    records = keyed_records(N)
    group = f"old-{release}-{topic}"
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]

    # Not idempotent, as producers of those releases were not by default. (With idempotence,
    # kafka-python holds a partition's later batches for good once one expires: it never closes.)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        api_version=pinned,
        enable_idempotence=False,
        acks=acks,
        linger_ms=5,
        delivery_timeout_ms=60_000,
        max_block_ms=30_000,
        **TIMEOUTS,
    )
    try:
        futures = [producer.send(topic, key=k, value=v) for k, v in records]
        deadline = time.monotonic() + DEADLINE_S  # each batch fails by itself after delivery_timeout_ms
        for f in futures:
            f.get(timeout=max(0.1, deadline - time.monotonic()))
        producer.flush(timeout=30)
        if acks == 0:
            # The mock answers acks=0 requests too; a link closed with such answers unread
            # is reset, which can drop requests the mock has not read yet (real brokers do
            # not answer them). The client leaves once the brokers hold every record.
            wait_for(
                f"the brokers to hold all {N} records sent with acks=0",
                lambda: sum(high_watermarks(brokers, topic, PARTITIONS).values()) == N,
                DEADLINE_S,
                seen=lambda: high_watermarks(brokers, topic, PARTITIONS),
                every=0.2,
            )
    finally:
        producer.close(timeout=2)

    consumer = _consumer(bootstrap, pinned, group, member)
    consumed: list[Row] = []

    def consume() -> bool:
        consumed.extend(_poll(consumer))
        return len(consumed) >= N

    try:
        kafka_python_subscribe(consumer, topic)
        wait_for(f"the {N} records", consume, DEADLINE_S, seen=lambda: f"{len(consumed)} records")
        consumed += _poll_for(consumer, 1)  # and nothing more
        consumer.commit()
    finally:
        consumer.close()
    check_round_trip(consumed, records, PARTITIONS)
    ends = end_offsets(consumed)

    # The restart: a new member of the group reads the commits and starts from them.
    again = _consumer(bootstrap, pinned, group, member)
    try:
        assert {tp.partition: again.committed(tp) for tp in tps} == ends, "committed offsets, read back at the pinned version"
        assert {tp.partition: o for tp, o in again.end_offsets(tps).items()} == ends, "end offsets (ListOffsets)"
        kafka_python_subscribe(again, topic)
        reread: list[Row] = []

        def assigned() -> bool:
            reread.extend(_poll(again))
            return again.assignment() == set(tps)

        wait_for("the restarted member to be given the topic", assigned, DEADLINE_S, seen=again.assignment)
        reread += _poll_for(again, 1)
        assert reread == [], f"the restarted member read {len(reread)} committed records again"
        assert {tp.partition: again.position(tp) for tp in tps} == ends
    finally:
        again.close()
    assert committed_offsets(brokers, group, topic, PARTITIONS) == ends, "the commits the brokers hold"
    assert sum(high_watermarks(brokers, topic, PARTITIONS).values()) == N, "records the brokers hold"

    used = {(ApiKey(k), v) for k, v in sent if k in versions}
    assert used == set(versions.items()), f"a {release} client sent {sorted(sent)}"


@pytest.mark.parametrize("release", RELEASES)
def test_a_pinned_old_client_produces_consumes_and_commits_through_kfan(
    cluster: MockCluster, kfan: Kfan, topic: str, sent: set[tuple[int, int]], release: str
) -> None:
    _round_trip(kfan.bootstrap, cluster.bootstrap, topic, release, sent, acks=ACKS.get(release, 1), member=MEMBER)


_kafka_topics = iter(range(1, 1_000_000))


@pytest.mark.parametrize("route", ["kfan", "direct"])
@pytest.mark.parametrize("release", RELEASES)
def test_a_pinned_old_client_round_trip_on_apache_kafka_3(
    request: pytest.FixtureRequest, apache_kafka_3: KafkaCluster, sent: set[tuple[int, int]], release: str, route: str
) -> None:
    """The same round trip on Apache Kafka 3.9 (RF 3, min ISR 2), through kfan and, for comparison, directly."""
    through: Kfan | None = request.getfixturevalue("kfan_kafka_3") if route == "kfan" else None
    topic = f"old3-{next(_kafka_topics)}-{route}-{int(time.time() * 1000) % 100000}"
    apache_kafka_3.create_topic(topic, PARTITIONS)
    logged = len(through.log) if through is not None else 0
    try:
        bootstrap = through.bootstrap if through is not None else apache_kafka_3.bootstrap
        _round_trip(bootstrap, apache_kafka_3.bootstrap, topic, release, sent, acks=KAFKA_ACKS, member=KAFKA_MEMBER)
    except BaseException:
        if through is not None:  # shown by pytest with the failure: what kfan saw of it
            print("kfan's log during the test:\n" + "".join(through.log[logged:][-80:]))
        print("Apache Kafka 3's logs (tail):\n" + apache_kafka_3.logs_tail())
        raise


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
