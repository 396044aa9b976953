"""Traffic capture: real client traffic through kfan lands in Parquet, one row per exchange.

Checks the columns, that each row's frames decode with kio (client request,
client response, every sub-request and sub-response), that the recorded
sub-requests are what the current core would send for that request and
topology, that acks=0 rows have no response, that `--capture-records none`
stores no payload, and that a killed kfan leaves readable files.
"""

from __future__ import annotations

import datetime
import json
import signal
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.index import load_request_schema, load_response_schema
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.types import TopicName
from kio.static.primitive import i32, i32Timedelta, i64

from proxy.capture.rows import COLUMNS, CaptureRow, read_capture, read_rows, topology_document
from proxy.core.topology import Broker, Topology
from proxy.kafka.headers import parse_request_header, response_body_offset
from proxy.tools.mock_cluster import MockCluster
from spark.checks import DEFAULT_CORE, check_exchange
from tests.support.kfan import shown_ids, start_kfan
from tests.support.kio_oracle import kio_decode
from tests.support.rawclient import RawClient
from tests.support.sockets import ESTABLISHED, tcp_sockets
from tests.support.waiting import Timeout, wait_for

PAYLOAD = b"secret-payload-"


def _traffic(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(300):
        producer.produce(topic, key=str(i).encode(), value=PAYLOAD + str(i).encode())
    assert producer.flush(20) == 0
    fire = Producer({"bootstrap.servers": bootstrap, "acks": 0})
    for i in range(50):
        fire.produce(topic, key=str(i).encode(), value=PAYLOAD + b"acks0")
    fire.flush(10)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"cap-{uuid.uuid4()}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(6)])
    got = [0]

    def consumed() -> bool:
        got[0] += sum(1 for m in consumer.consume(500, timeout=0.5) if m.error() is None)
        return got[0] >= 350

    try:
        # acks=0 records may be lost: 300 are owed, all 350 are waited for only up to the deadline.
        wait_for("the 350 records consumed", consumed, 30)
    except Timeout:
        pass
    finally:
        consumer.close()
    assert got[0] >= 300


def _asks(frame_without_cid: bytes) -> set[tuple[object, int, int]]:
    payload = frame_without_cid[:4] + b"\0\0\0\0" + frame_without_cid[4:]
    hdr = parse_request_header(payload)
    fetch = kio_decode(load_request_schema(1, hdr.api_version), payload, hdr.body_offset)
    return {
        (getattr(t, "topic", None) or getattr(t, "topic_id", None), p.partition, p.fetch_offset) for t in fetch.topics for p in t.partitions
    }


def links_to(pid: int, port: int) -> set[int]:
    """The established TCP connections of process ``pid`` to port ``port`` of 127.0.0.1, by their local ports: a
    new one is told by its port, not by a count that another closing at the same time would hide."""
    return {s.local_port for s in tcp_sockets(pid) if s.state == ESTABLISHED and s.remote_port == port}


def _run(cluster: MockCluster, topic: str, directory: Path, *extra: str) -> list[CaptureRow]:
    k = start_kfan(cluster.bootstrap, "--capture", str(directory), *extra)
    _traffic(k.bootstrap, topic)
    assert k.stop() == 0
    assert read_capture(directory).column_names == list(COLUMNS)
    rows = read_rows(directory)
    assert rows, "nothing captured"
    return rows


def _without_cid(request: bytes) -> bytes:
    return request[:4] + request[8:]


def test_capture_rows_decode_and_match_the_core(cluster: MockCluster, topic: str, tmp_path: Path) -> None:
    rows = _run(cluster, topic, tmp_path)
    assert not list(tmp_path.glob("*.inprogress")), "a clean stop completes the file"
    keys = {r.api_key for r in rows}
    assert {0, 1, 3, 18} <= keys, f"produce, fetch, metadata, api versions captured: {sorted(keys)}"
    acks0 = 0
    for r in rows:
        assert r.ts_start <= r.ts_end
        hdr = parse_request_header(r.request)
        assert (hdr.api_key, hdr.api_version, hdr.correlation_id) == (r.api_key, r.api_version, r.correlation_id)
        kio_decode(load_request_schema(hdr.api_key, hdr.api_version), r.request, hdr.body_offset)
        if r.response is None:
            acks0 += 1
            assert r.api_key == 0
        else:
            resp_cls = load_response_schema(hdr.api_key, hdr.api_version)
            assert int.from_bytes(r.response[:4], "big", signed=True) == r.correlation_id
            kio_decode(resp_cls, r.response, response_body_offset(r.response, hdr.api_key, hdr.api_version))
        r.cluster()  # the topology column reads back
        if r.api_key in (0, 1) and r.subrequests:
            # The recorded sub-requests are what the core plans for this request and topology.
            want = {b: _without_cid(wire[4:]) for b, wire in DEFAULT_CORE.replan(r, {}).subrequests.items()}
            got = {b: _without_cid(q) for b, q, _ in r.subrequests}
            if r.api_key == 1:
                # A sub-fetch may be one sent for an earlier Fetch of the same
                # partitions and offsets (in another order), reused: compare what they ask.
                assert {b: _asks(q) for b, q in got.items()} == {b: _asks(q) for b, q in want.items()}
            else:
                assert got == want
        for _, q, _ in r.subrequests:
            assert parse_request_header(q).api_key == r.api_key
    assert acks0 > 0, "acks=0 produce rows are captured without a response"
    assert rows[0].topology["brokers"] and rows[0].topology["kfan"]["port"]


def test_capture_records_none_keeps_no_payload(cluster: MockCluster, topic: str, tmp_path: Path) -> None:
    rows = _run(cluster, topic, tmp_path, "--capture-records", "none")
    produce = [r for r in rows if r.api_key == 0]
    fetch = [r for r in rows if r.api_key == 1 and r.response]
    assert produce and fetch
    for r in rows:
        assert r.records_scrubbed
        blobs = [r.request, r.response or b""] + [q for _, q, _ in r.subrequests] + [a or b"" for _, _, a in r.subrequests]
        assert not any(PAYLOAD in b for b in blobs), "a record payload was stored"
        hdr = parse_request_header(r.request)
        kio_decode(load_request_schema(hdr.api_key, hdr.api_version), r.request, hdr.body_offset)


def test_killed_kfan_leaves_readable_files(cluster: MockCluster, topic: str, tmp_path: Path) -> None:
    k = start_kfan(cluster.bootstrap, "--capture", str(tmp_path))
    _traffic(k.bootstrap, topic)
    # The writer batches rows off the data path: the file appears once it has written some.
    wait_for("a capture file being written", lambda: list(tmp_path.glob("*.inprogress")), 30)
    k.process.send_signal(signal.SIGKILL)
    k.process.wait(10)
    assert list(tmp_path.glob("*.inprogress")), "the file being written stays partial"
    table = read_capture(tmp_path)  # partial files are skipped, not an error
    assert table.num_rows == 0 or set(table.column_names) == set(COLUMNS)


def test_a_row_keeps_the_topology_its_split_used(cluster: MockCluster, tmp_path: Path) -> None:
    """The leader moves (and kfan learns it) while a Fetch waits at the old leader:
    the row still names the old leader, the one the sub-fetch went to, so the
    replay's split matches the recorded one."""
    topic = f"moved-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 1, leaders=[1])
    metadata = MetadataRequest(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    broker_1 = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=20).brokers[1].port
    max_wait = 4.0  # ample for the leader to move (and kfan to learn it) while the Fetch waits
    fetch = FetchRequest(
        max_wait=i32Timedelta.parse(datetime.timedelta(seconds=max_wait)),
        min_bytes=i32(1),
        topics=(
            FetchTopic(
                topic=TopicName(topic),
                partitions=(FetchPartition(partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20)),),
            ),
        ),
        forgotten_topics_data=(),
    )
    k = start_kfan(cluster.bootstrap, "--capture", str(tmp_path))
    try:
        with RawClient((k.host, k.port)) as fetcher, RawClient((k.host, k.port)) as other:
            other.call(metadata)
            links = links_to(k.pid, broker_1)
            sent_at = time.monotonic()
            cid = fetcher.send(fetch)
            # The fetcher's own link to broker 1 (its Fetch lane) opens once kfan has planned the
            # Fetch by the topology it knows: only then may the leader move.
            wait_for("kfan to send the Fetch on to broker 1", lambda: links_to(k.pid, broker_1) - links, 30)
            cluster.set_leader(topic, 0, 2)
            moved = other.call(metadata)
            assert [t.partitions[0].leader_id for t in moved.topics if t.name == topic] == shown_ids([2])
            try:
                answer = fetcher.receive(timeout=0.05)
            except TimeoutError:
                answer = None  # still waiting at broker 1 after kfan learned the move
            else:
                # Answered already: only right if the machine was so slow that its max_wait has passed.
                assert time.monotonic() - sent_at >= max_wait, "the Fetch was answered before its max_wait, as the leader moved"
            if answer is None:
                answer = fetcher.receive(timeout=60)
            assert answer is not None
    finally:
        assert k.stop() == 0
    (row,) = [r for r in read_rows(tmp_path) if r.api_key == 1 and r.correlation_id == cid]
    assert [b for b, _, _ in row.subrequests] == [1]
    assert row.cluster().leader(topic, 0) == 1
    assert check_exchange(row).findings == []


def test_rows_of_one_topology_snapshot_share_its_document_and_its_json() -> None:
    """Made once per snapshot (about 1.8 ms of the event loop each for 1,000 partitions, per exchange, when made for
    every row): the rows planned with one snapshot share the document, and a newer snapshot gets its own. A row
    written after a newer snapshot replaced the last document still writes its own topology."""
    brokers = {i: Broker(i, "127.0.0.1", 9000 + i, None) for i in (1, 2, 3)}
    first = Topology(brokers=brokers, leaders={"a": {p: p % 3 + 1 for p in range(1000)}})
    doc = topology_document(first, 0, "kfan", 9092)
    assert topology_document(first, 0, "kfan", 9092) is doc
    assert topology_document(first, 7, "kfan", 9092) is not doc, "another identity, another document"
    row = CaptureRow(
        ts_start=1, ts_end=2, conn_id="c", api_key=3, api_version=12, correlation_id=1, request=b"", response=b"", topology=doc
    )
    assert json.loads(row.to_dict()["topology"]) == doc
    second = Topology(brokers=brokers, leaders={"a": {0: 2}})
    newer = topology_document(second, 0, "kfan", 9092)
    assert newer is not doc and newer["leaders"] == {"a": {"0": 2}}
    assert json.loads(row.to_dict()["topology"])["leaders"]["a"]["5"] == 3, "the row's own snapshot, not the newer one"
    assert Topology.from_json(json.dumps({k: v for k, v in doc.items() if k != "kfan"})) == first
