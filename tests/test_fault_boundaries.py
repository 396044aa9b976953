"""Fault boundaries of the core and the control plane: no broker answer stops kfan.

Each reproducer from the robustness campaign is pinned here at the level it
broke: a coordinator answer with an unknown tagged field, an undecodable
answer in a Fetch that spans brokers, a quadratic batch split, a request whose
decoded form would cost many times its frame, and the control plane's own
Metadata and FindCoordinator answers (undecodable, naming no broker, or naming
a broker kfan cannot reach). The control plane is driven against a scripted
broker over real sockets, so the whole path (link, decode, retry) runs.
"""

from __future__ import annotations

import cProfile
import pstats
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from backends.cluster import Cluster
from backends.coordinators import CoordinatorError, read_coordinator
from backends.reads import read_api_versions, read_metadata
from proxy.core import (
    ANY_BROKER,
    ROUTES,
    Context,
    Coordinator,
    Failed,
    FetchForward,
    ForgetCoordinators,
    Forward,
    Identity,
    KeyType,
    LearnCoordinators,
    NeedCoordinators,
    RefreshTopology,
    Response,
    plan_request,
)
from proxy.core.fetch import answer_watermarks
from proxy.core.topology import Broker, Topology
from proxy.kafka import apis, errors, schema
from proxy.kafka.frames import FrameReader, frame
from proxy.kafka.headers import parse_request_header, response_header
from proxy.kafka.wire import Malformed
from tests.support.core_inputs import satisfied
from tests.support.messages import answer_bytes, request_bytes
from tests.support.records import record_batch
from tests.support.waiting import wait_for_async

IDENTITY = Identity(node_id=42, host="kfan.example", port=19092)
ALL_VERSIONS = {k: (r.start, r.stop - 1) for k in ROUTES if (r := schema.known_versions(k))}
TOPIC_ID = uuid.UUID(int=7)


def _context(brokers: tuple[int, ...] = (1, 2, 3)) -> Context:
    topology = Topology(
        brokers={b: Broker(b, f"broker{b}", 9000 + b) for b in brokers},
        leaders={"t": {0: 1, 1: 2, 2: 3}},
        topic_ids={TOPIC_ID: "t"},
    )
    return Context(IDENTITY, topology, ALL_VERSIONS)


# --- the reproducers, at the core -------------------------------------------------


def test_unknown_tagged_field_in_a_coordinators_answer_reaches_the_client() -> None:
    # The campaign's reproducer: Heartbeat v4; the answer carries tag 99, which
    # Kafka allows any newer broker to add. It used to raise AttributeError.
    request = bytes.fromhex("000c00040000000700017800026700000001026d0000")
    answer = bytes.fromhex("000000000000000000000001630101")
    plan = plan_request(_context(), request)
    assert isinstance(plan, Forward)
    (target,) = plan.subs
    assert target == Coordinator(KeyType.GROUP, "g")
    reply = plan.merge(plan, {target: Response(answer)})
    # Passed through as the coordinator sent it, tag included.
    assert b"".join(bytes(p) for p in reply.body) == answer[5:]
    assert not any(isinstance(e, ForgetCoordinators) for e in reply.effects)


def test_a_find_coordinator_for_a_key_type_kfan_does_not_route_is_answered_not_learned() -> None:
    # Share groups (KIP-932) look up key_type 2; the new core's KeyType raised
    # ValueError on it and the connection closed (found by the fuzz suite).
    request = request_bytes(apis.FIND_COORDINATOR, 4, {"key_type": 2, "coordinator_keys": ["sg"]})
    answer = answer_bytes(
        apis.FIND_COORDINATOR,
        4,
        {"coordinators": [{"key": "sg", "node_id": 2, "host": "broker2", "port": 9002, "error_code": 0, "error_message": None}]},
    )
    plan = plan_request(_context(), request)
    assert isinstance(plan, Forward)
    reply = plan.merge(plan, {ANY_BROKER: Response(answer)})
    decoded = schema.decode_body(schema.response_spec(apis.FIND_COORDINATOR, 4), b"".join(bytes(p) for p in reply.body), 0)
    (entry,) = decoded["coordinators"]
    assert (entry["node_id"], entry["host"], entry["port"]) == (IDENTITY.node_id, IDENTITY.host, IDENTITY.port)
    assert not any(isinstance(e, LearnCoordinators) for e in reply.effects)


def _fetch_plan() -> tuple[FetchForward, bytes]:
    request = request_bytes(
        apis.FETCH,
        12,
        {
            "max_wait": 500,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "topics": [
                {"topic": "t", "partitions": [{"partition": p, "fetch_offset": 0, "partition_max_bytes": 1 << 20} for p in range(3)]}
            ],
        },
    )
    plan = plan_request(_context(), request)
    assert isinstance(plan, FetchForward)
    return plan, request


def _fetchanswer_bytes(partition: int, records: bytes) -> bytes:
    part = schema.response_spec(apis.FETCH, 12).field("responses").struct.field("partitions").struct  # type: ignore[union-attr]
    entry = {**part.blank(), "partition_index": partition, "error_code": 0, "high_watermark": 10, "records": records}  # type: ignore[union-attr]
    return answer_bytes(apis.FETCH, 12, {"responses": [{"topic": "t", "partitions": [entry]}]})


@pytest.mark.parametrize("garbage", [b"\x00\x00\x00\x00\xff\xff\xff", b"\x00\x00", b"", bytes(range(256)) * 3])
def test_an_undecodable_fetch_answer_fails_only_its_brokers_partitions(garbage: bytes) -> None:
    plan, _ = _fetch_plan()
    assert set(plan.subs) == {1, 2, 3}
    answers = {1: Response(_fetchanswer_bytes(0, b"x" * 70)), 2: Response(garbage), 3: Response(_fetchanswer_bytes(2, b""))}
    # What the I/O layer asks while it waits must not raise either.
    assert satisfied(plan.header, {2: Response(garbage)}, 1), "an undecodable answer is a failure to report at once"
    assert answer_watermarks(plan, Response(garbage)) == {}
    reply = plan.merge(plan, answers)
    body = schema.decode_body(schema.response_spec(apis.FETCH, 12), b"".join(bytes(p) for p in reply.body))
    parts = {p["partition_index"]: p for t in body["responses"] for p in t["partitions"]}
    assert [p for p in parts] == [0, 1, 2]
    assert bytes(parts[0]["records"]) == b"x" * 70 and parts[0]["error_code"] == 0
    assert parts[1]["error_code"] == errors.NOT_LEADER_OR_FOLLOWER, "retriable, for the babbling broker's partition only"
    assert parts[2]["error_code"] == 0
    assert (errors.NOT_LEADER_OR_FOLLOWER, 2) in reply.errors
    assert RefreshTopology() in reply.effects, "the topology is refreshed"


def test_an_undecodable_produce_answer_is_maybe_written() -> None:
    batch = record_batch(b"x")
    request = request_bytes(
        apis.PRODUCE,
        9,
        {"acks": -1, "timeout": 1000, "topic_data": [{"name": "t", "partition_data": [{"index": p, "records": batch} for p in range(3)]}]},
    )
    plan = plan_request(_context(), request)
    assert isinstance(plan, Forward)
    reply = plan.merge(plan, {b: Response(b"\x00\x00\x00\x00") for b in (1, 2, 3)})
    body = schema.decode_body(schema.response_spec(apis.PRODUCE, 9), b"".join(bytes(p) for p in reply.body))
    codes = [p["error_code"] for t in body["responses"] for p in t["partition_responses"]]
    # It may have been written: REQUEST_TIMED_OUT, which clients retry (never "success").
    assert codes == [errors.REQUEST_TIMED_OUT] * 3


def test_undecodable_answers_in_batched_and_every_broker_merges() -> None:
    describe = request_bytes(apis.DESCRIBE_GROUPS, 5, {"groups": ["a", "b"]})
    a, b = Coordinator(KeyType.GROUP, "a"), Coordinator(KeyType.GROUP, "b")
    known = {a: 1, b: 2}
    plan = plan_request(Context(IDENTITY, _context().topology, ALL_VERSIONS, known.get, coordinators_looked_up=True), describe)
    assert isinstance(plan, Forward)
    assert set(plan.subs) == {1, 2}
    reply = plan.merge(plan, {1: Response(b"\x00\x00\x00\x00\x00\xff"), 2: Response(b"junk")})
    body = schema.decode_body(schema.response_spec(apis.DESCRIBE_GROUPS, 5), b"".join(bytes(p) for p in reply.body))
    assert [(g["group_id"], g["error_code"]) for g in body["groups"]] == [("a", errors.NOT_COORDINATOR), ("b", errors.NOT_COORDINATOR)]
    assert [e for e in reply.effects if isinstance(e, ForgetCoordinators)] == [ForgetCoordinators(frozenset({a, b}))]

    list_groups = request_bytes(apis.LIST_GROUPS, 4, {"states_filter": []})
    plan = plan_request(_context(), list_groups)
    assert isinstance(plan, Forward)
    group = schema.response_spec(apis.LIST_GROUPS, 4).field("groups").struct.blank()  # type: ignore[union-attr]
    good = answer_bytes(apis.LIST_GROUPS, 4, {"error_code": 0, "groups": [{**group, "group_id": "g1", "protocol_type": "consumer"}]})
    reply = plan.merge(plan, {1: Response(good), 2: Response(b"\x00\x00\x00\x00\x00\x01"), 3: Response(good)})
    body = schema.decode_body(schema.response_spec(apis.LIST_GROUPS, 4), b"".join(bytes(p) for p in reply.body))
    assert body["error_code"] == errors.COORDINATOR_NOT_AVAILABLE
    assert [g["group_id"] for g in body["groups"]] == ["g1", "g1"]


@pytest.mark.parametrize(("api_key", "version"), [(apis.OFFSET_COMMIT, 9), (apis.OFFSET_COMMIT, 2), (28, 4), (28, 0)])
def test_a_failed_coordinator_is_reported_per_partition_where_there_is_no_top_level_error(api_key: int, version: int) -> None:
    """OffsetCommit and TxnOffsetCommit carry errors per partition only: the coordinator's failure is
    NOT_COORDINATOR on every partition the client named (found by the fault suite: with Kafka's own
    consumer committing while a broker was killed, kfan closed the connection instead)."""
    topic = schema.request_spec(api_key, version).field("topics").struct
    assert topic is not None and (partition := topic.field("partitions").struct) is not None
    partitions = [{**partition.blank(), "partition_index": i, "committed_offset": 5} for i in (0, 2)]
    body = {"group_id": "g", "transactional_id": "tx", "topics": [{**topic.blank(), "name": "t", "partitions": partitions}]}
    plan = plan_request(_context(), request_bytes(api_key, version, body))
    assert isinstance(plan, Forward)
    (target,) = plan.subs
    reply = plan.merge(plan, {target: Failed(errors.NETWORK_EXCEPTION)})
    answer = schema.decode_body(schema.response_spec(api_key, version), b"".join(bytes(p) for p in reply.body))
    assert [(t["name"], [(p["partition_index"], p["error_code"]) for p in t["partitions"]]) for t in answer["topics"]] == [
        ("t", [(0, errors.NOT_COORDINATOR), (2, errors.NOT_COORDINATOR)])
    ]
    assert [e for e in reply.effects if isinstance(e, ForgetCoordinators)] == [ForgetCoordinators(frozenset({target}))]


def test_describe_groups_of_16000_groups_is_planned_by_broker_in_linear_time() -> None:
    def plan_both_passes(n: int) -> None:
        groups = [f"group-{i}" for i in range(n)]
        request = request_bytes(apis.DESCRIBE_GROUPS, 5, {"groups": groups})
        coordinators = {Coordinator(KeyType.GROUP, g): 1 + i % 3 for i, g in enumerate(groups)}
        known = Context(IDENTITY, _context().topology, ALL_VERSIONS, coordinators.get, coordinators_looked_up=True)
        first = plan_request(_context(), request)  # nothing known yet: one bulk lookup asked for
        plan = plan_request(known, request)  # then one sub-request per coordinating broker
        assert isinstance(first, NeedCoordinators) and len(first.coordinators) == n
        assert isinstance(plan, Forward) and sorted(plan.subs) == [1, 2, 3]

    def calls(n: int) -> int:
        """Python function calls made planning ``n`` groups: a measure of work that load cannot skew."""
        profile = cProfile.Profile()
        profile.runcall(plan_both_passes, n)
        return pstats.Stats(profile).total_calls  # type: ignore[attr-defined, no-any-return]

    def cpu_seconds(n: int) -> float:
        start = time.process_time()
        plan_both_passes(n)
        return time.process_time() - start

    plan_both_passes(1600)  # warm the codec caches
    small, large = calls(1600), calls(16000)
    seconds = min(cpu_seconds(16000) for _ in range(3))
    # The CPU time is reported, not judged: a loaded machine stretches it; the count of calls is what load cannot skew.
    print(f"DescribeGroups planning (both passes): {small} calls for 1,600 groups, {large} for 16,000; {seconds * 1000:.0f} ms CPU")
    # Ten times the groups: ten times the work (the per-key split was quadratic: a hundred).
    assert large / small < 11


def test_a_frame_of_a_million_empty_topics_is_refused_before_it_balloons() -> None:
    # ~3 MB on the wire; decoded in full it took 480 MiB. Now refused at the
    # decode allowance (32 times the frame), before most of it is built.
    request = request_bytes(apis.PRODUCE, 9, {"acks": 1, "timeout": 1000, "topic_data": [{"name": "", "partition_data": []}] * 1_000_000})
    tracemalloc.start()
    try:
        with pytest.raises(Malformed, match="decoded form"):
            plan_request(_context(), request)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40 * len(request), f"peak {peak} for a {len(request)}-byte frame"


def test_honest_requests_fit_their_decode_allowance_and_report_their_cost() -> None:
    fetch = request_bytes(
        apis.FETCH,
        12,
        {
            "max_bytes": 1 << 20,
            "topics": [
                {
                    "topic": "t",
                    "partitions": [{"partition": p % 3, "fetch_offset": p, "partition_max_bytes": 1 << 20} for p in range(20_000)],
                }
            ],
        },
    )
    plan = plan_request(_context(), fetch)
    assert len(fetch) < plan.cost < 32 * len(fetch)


# --- the control plane's readers ---------------------------------------------------------


def test_control_plane_readers_raise_only_malformed() -> None:
    for reader in (
        lambda p: read_api_versions(p, 2),
        lambda p: read_metadata(p, 12),
        lambda p: read_coordinator(p, 4, 0, "g"),
        lambda p: read_coordinator(p, 3, 0, "g"),
    ):
        for payload in (b"", b"\x00\x00\x00\x01", bytes(range(40)), b"\x00\x00\x00\x01\x00" + b"\xff" * 30):
            with pytest.raises(Malformed):
                reader(payload)
    # A v4 answer that does not name the key asked for (it named none).
    with pytest.raises(Malformed, match="does not name"):
        read_coordinator(answer_bytes(apis.FIND_COORDINATOR, 4, {"coordinators": []}), 4, 0, "g")
    # Broker entries kfan could not connect to are left out.
    broker = schema.response_spec(apis.METADATA, 12).field("brokers").struct.blank()  # type: ignore[union-attr]
    answer = answer_bytes(
        apis.METADATA,
        12,
        {"brokers": [{**broker, "node_id": 1, "host": "", "port": 9}, {**broker, "node_id": 2, "host": "h", "port": 9}], "topics": []},
    )
    assert [b["node_id"] for b in read_metadata(answer, 12)["brokers"]] == [2]


# --- the control plane against a scripted broker ---------------------------------------------


class ScriptedBroker:
    """A broker on a real socket whose answers the test chooses per API key.

    It speaks just enough Kafka (kfan's codec) to be a control plane's peer:
    each handler maps (request version, decoded request) to the answer's
    payload after the correlation id, or to None for no answer at all.
    """

    def __init__(self) -> None:
        self.port = 0
        self.node_id = 1
        self.advertise_port: int | None = None
        self.handlers: dict[int, Callable[[int, dict[str, Any]], bytes | None]] = {
            apis.API_VERSIONS: self.api_versions,
            apis.METADATA: self.metadata,
            apis.FIND_COORDINATOR: self.find_coordinator,
        }
        self.metadata_mode = "good"
        self.requests: list[int] = []

    def api_versions(self, version: int, request: dict[str, Any]) -> bytes:
        spec = schema.response_spec(apis.API_VERSIONS, version)
        keys = [{"api_key": k, "min_version": 0, "max_version": v} for k, v in ((3, 12), (10, 4), (18, 3))]
        return b"".join(schema.encode_body(spec, {**spec.blank(), "error_code": 0, "api_keys": keys}))

    def metadata(self, version: int, request: dict[str, Any]) -> bytes | None:
        spec = schema.response_spec(apis.METADATA, version)
        if self.metadata_mode == "garbage":
            return b"\x00\x00\x00\x07\xff\xff\xff\xff"
        if self.metadata_mode == "silent":
            return None
        brokers = (
            []
            if self.metadata_mode == "no_brokers"
            else [{"node_id": self.node_id, "host": "127.0.0.1", "port": self.advertise_port or self.port}]
        )
        topic = spec.field("topics").struct.blank()  # type: ignore[union-attr]
        partition = spec.field("topics").struct.field("partitions").struct.blank()  # type: ignore[union-attr]
        partitions = [{**partition, "error_code": 0, "partition_index": 0, "leader_id": self.node_id}]
        topics = [{**topic, "error_code": 0, "name": "t", "topic_id": TOPIC_ID, "partitions": partitions}]
        return b"".join(schema.encode_body(spec, {**spec.blank(), "brokers": brokers, "topics": topics, "cluster_id": "c"}))

    def find_coordinator(self, version: int, request: dict[str, Any]) -> bytes:
        # librdkafka's mock answers an empty group id with a null host, which
        # the schema does not allow (flexible versions: a compact string of length 0).
        null_host_node = b"\x00\x00\x00\x01" + b"\x00" + b"\x00\x00\x23\x82"
        if version >= 4:
            keys = request["coordinator_keys"]
            entry = b"\x01" + null_host_node + b"\x00\x00" + b"\x00" + b"\x00"  # key "", node, host, port, error, message, tags
            return b"\x00\x00\x00\x00" + bytes([len(keys) + 1]) + entry * len(keys) + b"\x00"
        assert version == 3, version
        return b"\x00\x00\x00\x00" + b"\x00\x00" + b"\x00" + null_host_node + b"\x00"

    async def serve(self, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        reader = FrameReader()
        try:
            while True:
                payload = reader.next_frame()
                if payload is None:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    reader.feed(data)
                    continue
                hdr = parse_request_header(payload)
                self.requests.append(hdr.api_key)
                request = schema.decode_body(schema.request_spec(hdr.api_key, hdr.api_version), payload, hdr.body_offset)
                body = self.handlers[hdr.api_key](hdr.api_version, request)
                if body is not None:
                    head = response_header(hdr.api_key, hdr.api_version, hdr.correlation_id)
                    await stream.send_all(frame([head, body]))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


@asynccontextmanager
async def _nursery(seconds: float = 60) -> AsyncIterator[trio.Nursery]:
    """A nursery whose test fails, rather than hangs, past ``seconds``."""
    with trio.fail_after(seconds):
        async with trio.open_nursery() as nursery:
            yield nursery


async def _started(nursery: trio.Nursery, broker: ScriptedBroker, **kwargs: Any) -> Cluster:
    await nursery.start(broker.serve)
    cluster = Cluster([("127.0.0.1", broker.port)], request_timeout=1.0, **kwargs)
    await nursery.start(cluster.run)
    return cluster


async def test_control_plane_keeps_its_topology_through_bad_metadata_answers() -> None:
    broker = ScriptedBroker()
    async with _nursery() as nursery:
        cluster = await _started(nursery, broker, refresh_interval=60)
        assert set(cluster.topology.brokers) == {1} and cluster.topology.leader("t", 0) == 1
        good = cluster.topology
        for mode in ("garbage", "no_brokers", "silent"):
            broker.metadata_mode = mode
            refreshes = cluster.refreshes
            await cluster.refresh(timeout=30)  # returns once a refresh attempt has ended (or, silently, at the timeout)
            assert cluster.refreshes == refreshes, f"{mode}: not a refresh"
            assert cluster.topology == good, f"{mode}: the last good topology is kept"
        broker.metadata_mode = "good"
        # After failures the control plane retries by itself, with backoff, not after the full interval (60 s).
        await wait_for_async("the control plane to refresh again by itself", lambda: cluster.refreshes > refreshes, timeout=30)
        nursery.cancel_scope.cancel()


async def test_bootstrap_waits_out_a_metadata_answer_that_names_no_broker() -> None:
    broker = ScriptedBroker()
    broker.metadata_mode = "no_brokers"
    async with _nursery() as nursery:
        await nursery.start(broker.serve)
        cluster = Cluster([("127.0.0.1", broker.port)], request_timeout=1.0)
        nursery.start_soon(cluster.run)
        # A second Metadata request: the answer to the first was read, and refused, before it.
        await wait_for_async("the bootstrap to ask for Metadata again", lambda: broker.requests.count(apis.METADATA) >= 2)
        assert not cluster.ready.is_set(), "no broker to route to: not ready"
        assert cluster.any_broker() is None
        broker.metadata_mode = "good"
        with trio.fail_after(15):
            await cluster.ready.wait()
        assert set(cluster.topology.brokers) == {1}
        nursery.cancel_scope.cancel()


async def test_control_plane_falls_back_to_the_bootstrap_list_when_no_known_broker_answers() -> None:
    broker = ScriptedBroker()
    async with _nursery() as nursery:
        cluster = await _started(nursery, broker, refresh_interval=60)
        # The cluster now advertises its broker where nothing listens: every known broker fails. The port
        # stays bound (never listening) for the whole test, so connections to it are refused and nothing
        # else can take it meanwhile.
        with trio.socket.socket() as dead:
            await dead.bind(("127.0.0.1", 0))
            broker.advertise_port = dead.getsockname()[1]
            await cluster.refresh(timeout=30)
            await wait_for_async(
                "the topology to name the dead port", lambda: cluster.topology.brokers[1].port == broker.advertise_port, timeout=30
            )
            refreshes = cluster.refreshes
            await cluster.refresh(timeout=30)
            await wait_for_async("a refresh through the bootstrap address", lambda: cluster.refreshes > refreshes, timeout=30)
        nursery.cancel_scope.cancel()


async def test_an_undecodable_coordinator_answer_is_a_coordinator_error() -> None:
    # The campaign's Heartbeat with an empty group id: the lookup's answer did not
    # decode, and the exception ended the process.
    broker = ScriptedBroker()
    async with _nursery() as nursery:
        cluster = await _started(nursery, broker, refresh_interval=60)
        with pytest.raises(CoordinatorError) as e:
            await cluster.coordinators.coordinator(Coordinator(KeyType.GROUP, ""))
        assert e.value.code == errors.COORDINATOR_NOT_AVAILABLE
        assert broker.requests.count(apis.FIND_COORDINATOR) == 5, "retried, then given up"
        nursery.cancel_scope.cancel()


async def test_coordinator_cache_is_bounded_and_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    import backends.coordinators as coordinators_module

    monkeypatch.setattr(coordinators_module, "MAX_COORDINATORS", 100)
    cluster = Cluster([("127.0.0.1", 1)])
    cluster.topology = Topology(brokers={1: Broker(1, "h", 1)})
    cluster.coordinators.learn({Coordinator(KeyType.GROUP, f"g{i}"): 1 for i in range(1000)})
    assert len(cluster.coordinators) == 100
    assert Coordinator(KeyType.GROUP, "g999") in cluster.coordinators and Coordinator(KeyType.GROUP, "g0") not in cluster.coordinators
    assert cluster.coordinators.known(Coordinator(KeyType.GROUP, "g999")) == 1
    monkeypatch.setattr(coordinators_module, "COORDINATOR_TTL", 0.0)
    await trio.sleep(0.01)
    assert cluster.coordinators.known(Coordinator(KeyType.GROUP, "g999")) is None
    assert Coordinator(KeyType.GROUP, "g999") not in cluster.coordinators
