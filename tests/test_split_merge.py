"""Invariants 1, 2 and 5 on the sans-IO core, with kio as the independent oracle.

For random requests of every version of every partition-keyed API and random
leader maps: each sub-request frame carries exactly one size prefix equal to
its length and decodes with kio; split keeps every partition exactly once, on
its leader; merge answers every requested partition exactly once, in the
client's order, with the answer of the broker that leads it (or a retriable
error when that broker failed), and no broker identity survives.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema

from proxy.core import (
    ANY_BROKER,
    NOT_YET,
    ROUTES,
    Context,
    Failed,
    FetchForward,
    FoldMetadata,
    Forward,
    LocalReply,
    RememberWatermarks,
    Response,
    plan_request,
)
from proxy.core.leader import layouts_of
from proxy.core.topology import Topology
from proxy.kafka import apis, errors, schema
from proxy.kafka.frames import FrameReader, frame
from proxy.kafka.headers import parse_request_header, request_head, response_body_offset, response_header
from tests.support import oracle
from tests.support.core_inputs import ALL_VERSIONS, BROKERS, IDENTITY, effects_of
from tests.support.kio_oracle import kio_decode, kio_encode, request_payload
from tests.support.messages import answer_bytes
from tests.support.records import record_batch

PARTITIONED = [
    apis.PRODUCE,
    apis.FETCH,
    apis.LIST_OFFSETS,
    apis.OFFSET_FOR_LEADER_EPOCH,
    apis.DELETE_RECORDS,
    apis.DESCRIBE_PRODUCERS,
]

# Per API, the response partition field that carries the leader's own answer.
MARKER = {0: "base_offset", 1: "high_watermark", 2: "offset", 23: "end_offset", 21: "low_watermark", 61: "active_producers"}


def layouts(api_key: int, version: int) -> Any:
    """The request's and the response's partition layout of a leader-split API."""
    return layouts_of(ROUTES[api_key], version)


def _marker(broker: int, partition: int) -> int:
    return broker * 1_000_000 + partition


def _set_marker(api_key: int, version: int, entry: dict[str, Any], value: int) -> None:
    if api_key == apis.DESCRIBE_PRODUCERS:
        producer = schema.response_spec(api_key, version).field("topics").struct.field("partitions").struct.field("active_producers").struct  # type: ignore[union-attr]
        entry["active_producers"] = [{**producer.blank(), "producer_id": value}]  # type: ignore[union-attr]
    elif "old_style_offsets" in entry:  # ListOffsets v0
        entry["old_style_offsets"] = [value]
    else:
        entry[MARKER[api_key]] = value


def _get_marker(api_key: int, entry: dict[str, Any]) -> int:
    if api_key == apis.DESCRIBE_PRODUCERS:
        return entry["active_producers"][0]["producer_id"]
    if "old_style_offsets" in entry:
        return entry["old_style_offsets"][0]
    return entry[MARKER[api_key]]


def _topology(request: dict[str, Any], layout: Any, data: st.DataObject) -> Topology:
    leaders: dict[str, dict[int, int]] = {}
    topic_ids: dict[uuid.UUID, str] = {}
    for key, p in layout.entries(request):
        name = str(key) if isinstance(key, uuid.UUID) else key
        if isinstance(key, uuid.UUID):
            topic_ids[key] = name
        idx = layout.partition_index(p)
        leaders.setdefault(name, {})
        if idx not in leaders[name]:
            # Mostly led by one of three brokers; sometimes leaderless.
            leaders[name][idx] = data.draw(st.sampled_from([1, 2, 3, 1, 2, 3, -1]))
    # Sometimes a topic is unknown altogether.
    for name in list(leaders):
        if data.draw(st.integers(0, 9)) == 0:
            del leaders[name]
    return Topology(brokers=BROKERS, leaders=leaders, topic_ids=topic_ids)


def _answer(api_key: int, version: int, sub_request: dict[str, Any], broker: int, cid: int) -> bytes:
    """What a broker leading these partitions answers (built independently of the merge)."""
    _, resp_layout = layouts(api_key, version)
    req_layout, _ = layouts(api_key, version)
    spec = schema.response_spec(api_key, version)
    body = spec.blank()
    topics = []
    for t in sub_request[req_layout.topics]:
        parts = []
        for p in t[req_layout.partitions]:
            entry = resp_layout.partition_spec.blank()  # type: ignore[union-attr]
            entry[resp_layout.index or "partition_index"] = req_layout.partition_index(p)
            entry["error_code"] = 0
            _set_marker(api_key, version, entry, _marker(broker, req_layout.partition_index(p)))
            if resp_layout.partition_spec.has("current_leader"):  # type: ignore[union-attr]
                entry["current_leader"] = {"leader_id": broker, "leader_epoch": 5}
            if "preferred_read_replica" in entry:
                entry["preferred_read_replica"] = broker
            parts.append(entry)
        topics.append({**resp_layout.topic_spec.blank(), resp_layout.topic_key: t[req_layout.topic_key], resp_layout.partitions: parts})
    body[resp_layout.topics] = topics
    if "throttle_time" in body:
        body["throttle_time"] = broker
    return response_header(api_key, version, cid) + b"".join(bytes(x) for x in schema.encode_body(spec, body))


@pytest.mark.parametrize("api_key", PARTITIONED)
@settings(max_examples=25, suppress_health_check=list(HealthCheck), deadline=None)
@given(data=st.data())
def test_split_then_merge_keeps_every_partition_once_in_client_order(api_key: int, data: st.DataObject) -> None:
    lo, hi = ALL_VERSIONS[api_key]
    version = data.draw(st.integers(lo, hi), label="version")
    spec = schema.request_spec(api_key, version)
    request = schema.decode_body(spec, data.draw(oracle.bodies(api_key, version, "request"), label="request"))
    if api_key == apis.PRODUCE:
        request["acks"] = data.draw(st.sampled_from([-1, 1]))
    if api_key == apis.FETCH and "session_id" in request:
        request.update(session_id=0, session_epoch=-1)
    body = b"".join(bytes(p) for p in schema.encode_body(spec, request))
    req_layout, resp_layout = layouts(api_key, version)
    keys = req_layout.keys(request)
    assume(keys)
    topo = _topology(request, req_layout, data)
    # A Fetch v11+ goes to the preferred read replica its leader named for the rack (the client's, else kfan's),
    # when that replica is a live broker; some name broker 9, which is not.
    kfan_rack = data.draw(st.sampled_from(["", "zone-b"]), label="kfan rack")
    rack = (request.get("rack_id") or kfan_rack) if "rack_id" in request else None
    preferred: dict[tuple[str, str, int], int] = {}
    if rack is not None:
        for key, partition in keys:
            if data.draw(st.booleans()):
                name = str(key) if isinstance(key, uuid.UUID) else key
                preferred[(rack, name, partition)] = data.draw(st.sampled_from([1, 2, 3, 9]), label="replica")
    # Records here are random bytes: the split is under test, not the records check (tests/test_records.py).
    ctx = Context(
        IDENTITY,
        topo,
        {k: v for k, v in ALL_VERSIONS.items()},
        validate_records=False,
        rack=kfan_rack,
        read_replica=preferred.get,
    )
    plan = plan_request(ctx, oracle.payload(api_key, version, body, correlation_id=99))
    assert isinstance(plan, Forward | LocalReply)
    subs = plan.subs if isinstance(plan, Forward) else {}

    def leader(key: Any) -> int | None:
        name = str(key) if isinstance(key, uuid.UUID) else key
        return topo.leader(name, key_partition)

    def destination(key: Any) -> int | None:
        """Where the partition's sub-request goes: its leader, or the live replica named for it."""
        lead = leader(key)
        name = str(key) if isinstance(key, uuid.UUID) else key
        replica = None if rack is None else preferred.get((rack, name, key_partition))
        return replica if lead is not None and replica in BROKERS else lead

    # Split: every routable partition exactly once, on its leader (or read replica), in client order.
    expected_by_broker: dict[int, list[Any]] = {}
    for key, partition in keys:
        key_partition = partition
        b = destination(key)
        if b is not None:
            expected_by_broker.setdefault(b, []).append((key, partition))
    assert set(subs) == set(expected_by_broker)
    answers: dict[Any, Any] = {}
    failed = set(data.draw(st.sets(st.sampled_from(sorted(expected_by_broker) or [1])), label="failed brokers"))
    for broker, sub in subs.items():
        assert sub.expect_response
        wire = frame([request_head(sub.api_key, sub.api_version), struct.pack(">i", 1234), *sub.tail])
        (size,) = struct.unpack_from(">i", wire)
        assert size == len(wire) - 4, "exactly one size prefix, equal to the length"
        reader = FrameReader()
        reader.feed(wire)
        payload = reader.next_frame()
        assert payload is not None and reader.next_frame() is None and reader.buffered() == 0
        hdr = parse_request_header(payload)
        assert (hdr.api_key, hdr.api_version, hdr.correlation_id) == (api_key, version, 1234)
        sub_request = schema.decode_body(spec, oracle.read_back(api_key, version, "request", payload, hdr.body_offset))
        assert req_layout.keys(sub_request) == expected_by_broker[broker]
        for name in request:
            if name not in (req_layout.topics, "session_id", "session_epoch", "forgotten_topics_data", "rack_id"):
                assert sub_request.get(name) == request[name], name
        if rack is not None:
            assert sub_request["rack_id"] == rack, "the sub-fetch carries the client's rack, else kfan's"
        answers[broker] = (
            Failed(errors.NETWORK_EXCEPTION) if broker in failed else Response(_answer(api_key, version, sub_request, broker, 1234))
        )

    # Merge: every requested partition exactly once, in client order.
    merged = plan.body if isinstance(plan, LocalReply) else plan.merge(plan, answers).body
    response = schema.decode_body(
        schema.response_spec(api_key, version), oracle.read_back(api_key, version, "response", b"".join(bytes(p) for p in merged))
    )
    assert resp_layout.keys(response) == keys
    for (key, partition), (_, entry) in zip(keys, resp_layout.entries(response), strict=True):
        key_partition = partition
        b = destination(key)
        if b is None:
            assert entry["error_code"] in (errors.NOT_LEADER_OR_FOLLOWER, errors.UNKNOWN_TOPIC_OR_PARTITION, errors.UNKNOWN_TOPIC_ID)
        elif b in failed and b != leader(key):
            # A failed read replica: the client asks again, of the leader (no watermarks known: a retriable error).
            assert entry["error_code"] == errors.NOT_LEADER_OR_FOLLOWER
        elif b in failed:
            assert entry["error_code"] == errors.NETWORK_EXCEPTION
        else:
            assert entry["error_code"] == 0
            assert _get_marker(api_key, entry) == _marker(b, partition)
        # Invariant 5: no broker identity reaches the client.
        if "current_leader" in entry:
            assert entry["current_leader"]["leader_id"] in (-1, IDENTITY.node_id)
        if "preferred_read_replica" in entry:
            assert entry["preferred_read_replica"] == -1
    for ep in response.get("node_endpoints", []):
        assert (ep["node_id"], ep["host"], ep["port"]) == (IDENTITY.node_id, IDENTITY.host, IDENTITY.port)
    if "throttle_time" in response and isinstance(plan, Forward):
        ok = [b for b in subs if b not in failed]
        assert response["throttle_time"] == max(ok, default=0)


@settings(max_examples=100, suppress_health_check=list(HealthCheck), deadline=None)
@given(data=st.data())
def test_metadata_answers_name_only_kfan(data: st.DataObject) -> None:
    lo, hi = ALL_VERSIONS[apis.METADATA]
    version = data.draw(st.integers(lo, hi))
    req = data.draw(st.from_type(load_request_schema(apis.METADATA, version)))
    resp = data.draw(st.from_type(load_response_schema(apis.METADATA, version)))
    ctx = Context(IDENTITY, Topology(brokers=BROKERS), ALL_VERSIONS)
    plan = plan_request(ctx, request_payload(req))
    assert isinstance(plan, Forward)
    assert set(plan.subs) == {ANY_BROKER}
    reply = plan.merge(plan, {ANY_BROKER: Response(response_header(3, version, 1) + kio_encode(resp))})
    out = kio_decode(type(resp), b"".join(bytes(p) for p in reply.body))
    assert [(b.node_id, b.host, b.port) for b in out.brokers] == [(42, "kfan.example", 19092)]
    if hasattr(out, "controller_id"):
        assert out.controller_id == 42
    live = {b.node_id for b in resp.brokers}
    for t, t0 in zip(out.topics, resp.topics, strict=True):
        assert t.name == t0.name and len(t.partitions) == len(t0.partitions)
        for p, p0 in zip(t.partitions, t0.partitions, strict=True):
            if p0.leader_id >= 0 and p0.leader_id not in live:
                # Led by a broker the answer does not list (down): offline, as Kafka reports it.
                assert p.leader_id == -1
                assert p.error_code.value == (p0.error_code.value or errors.LEADER_NOT_AVAILABLE)
            else:
                assert p.leader_id == (42 if p0.leader_id >= 0 else p0.leader_id)
                assert p.error_code == p0.error_code
            assert set(p.replica_nodes) <= {42} and len(p.replica_nodes) == len(p0.replica_nodes)
            assert set(p.isr_nodes) <= {42}
    assert len(effects_of(reply, FoldMetadata)) == 1  # the real answer goes to the topology, not the client


def test_acks_zero_produce_expects_no_response() -> None:
    import datetime

    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

    req = ProduceRequest(
        acks=0,
        timeout=datetime.timedelta(seconds=1),
        topic_data=(
            TopicProduceData(
                name="t", partition_data=tuple(PartitionProduceData(index=i, records=record_batch(b"x" * 10)) for i in range(3))
            ),
        ),
    )  # type: ignore[arg-type]
    topo = Topology(brokers=BROKERS, leaders={"t": {0: 1, 1: 2, 2: 3}})
    plan = plan_request(Context(IDENTITY, topo, ALL_VERSIONS), request_payload(req))
    assert isinstance(plan, Forward)
    assert not plan.expect_response
    assert set(plan.subs) == {1, 2, 3}
    assert all(not s.expect_response for s in plan.subs.values())


def test_whole_request_to_one_broker_is_the_clients_own_bytes() -> None:
    import datetime

    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

    req = ProduceRequest(
        acks=-1,
        timeout=datetime.timedelta(seconds=1),
        topic_data=(TopicProduceData(name="t", partition_data=(PartitionProduceData(index=0, records=record_batch(b"y" * 800)),)),),
    )  # type: ignore[arg-type]
    payload = request_payload(req, correlation_id=5)
    plan = plan_request(Context(IDENTITY, Topology(brokers=BROKERS, leaders={"t": {0: 2}}), ALL_VERSIONS), payload)
    assert isinstance(plan, Forward)
    (sub,) = plan.subs.values()
    assert request_head(sub.api_key, sub.api_version) + struct.pack(">i", 5) + b"".join(bytes(p) for p in sub.tail) == payload


@pytest.mark.parametrize("named", [False, True])
def test_one_brokers_clean_answer_is_passed_on_as_it_came_and_one_naming_a_broker_is_rewritten(named: bool) -> None:
    import datetime

    from kio.schema.produce.v10.request import PartitionProduceData, ProduceRequest, TopicProduceData

    req = ProduceRequest(
        acks=-1,
        timeout=datetime.timedelta(seconds=1),
        topic_data=(TopicProduceData(name="t", partition_data=(PartitionProduceData(index=0, records=record_batch(b"y" * 80)),)),),
    )  # type: ignore[arg-type]
    plan = plan_request(Context(IDENTITY, Topology(brokers=BROKERS, leaders={"t": {0: 2}}), ALL_VERSIONS), request_payload(req))
    assert isinstance(plan, Forward)
    partition = {"index": 0, "error_code": 0, "base_offset": 17, "log_append_time": -1, "log_start_offset": 0, "record_errors": [],
                 "error_message": None, "current_leader": {"leader_id": 2 if named else -1, "leader_epoch": 3 if named else -1}}  # fmt: skip
    answer = answer_bytes(apis.PRODUCE, 10, {"responses": [{"name": "t", "partition_responses": [partition]}], "throttle_time": 0})
    reply = plan.merge(plan, {2: Response(answer)})
    body = b"".join(bytes(p) for p in reply.body)
    offset = response_body_offset(answer, apis.PRODUCE, 10)
    if named:
        merged = schema.decode_body(schema.response_spec(apis.PRODUCE, 10), body)
        assert merged["responses"][0]["partition_responses"][0]["current_leader"]["leader_id"] == IDENTITY.node_id
        assert body != answer[offset:]
    else:
        assert body == answer[offset:], "the broker's own bytes, not re-encoded"
        assert isinstance(reply.body[0], memoryview)


def test_fetch_partitions_not_answered_yet_report_their_last_marks() -> None:
    """A Fetch answered before one broker: that broker's partitions carry no records and the
    high watermark / LSO / log start it last reported (librdkafka decides end-of-partition
    from them); partitions never reported say -1 rather than a made-up offset."""
    import datetime

    from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic

    req = FetchRequest(
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            FetchTopic(
                topic="t",
                partitions=tuple(
                    FetchPartition(
                        partition=i,
                        current_leader_epoch=-1,
                        fetch_offset=3,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=1 << 20,
                    )
                    for i in range(3)
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )  # type: ignore[arg-type]
    topo = Topology(brokers=BROKERS, leaders={"t": {0: 1, 1: 2, 2: 2}})
    # What the connection last learned of the partitions' watermarks.
    remembered = {("t", 1): (40, 38, 2), ("t", 0): (7, 7, 7)}
    plan = plan_request(Context(IDENTITY, topo, ALL_VERSIONS, watermarks=remembered), request_payload(req, correlation_id=9))
    assert isinstance(plan, FetchForward)
    assert plan.partitions == {1: frozenset({("t", 0)}), 2: frozenset({("t", 1), ("t", 2)})}
    sub1 = schema.decode_body(schema.request_spec(1, 12), *_sub_payload(plan.subs[1]))
    answer1 = _answer(apis.FETCH, 12, sub1, 1, 9)
    reply = plan.merge(plan, {1: Response(answer1), 2: NOT_YET})
    resp = schema.decode_body(schema.response_spec(1, 12), b"".join(bytes(p) for p in reply.body), 0)
    parts = {p["partition_index"]: p for p in resp["responses"][0]["partitions"]}
    assert (parts[1]["high_watermark"], parts[1]["last_stable_offset"], parts[1]["log_start_offset"]) == (40, 38, 2)
    assert (parts[2]["high_watermark"], parts[2]["last_stable_offset"], parts[2]["log_start_offset"]) == (-1, -1, -1)
    assert parts[0]["high_watermark"] == _marker(1, 0), "an answered partition's own marks win over remembered ones"
    assert all(parts[i]["error_code"] == 0 and not parts[i]["records"] for i in (1, 2))
    (remember,) = effects_of(reply, RememberWatermarks)
    assert set(remember.watermarks) == {("t", 0)} and remember.watermarks[("t", 0)][0] == _marker(1, 0)


def _sub_payload(sub: Any) -> tuple[bytes, int]:
    """A sub-request's bytes and where its body starts."""
    wire = request_head(sub.api_key, sub.api_version) + b"\0\0\0\0" + b"".join(bytes(p) for p in sub.tail)
    return wire, parse_request_header(wire).body_offset
