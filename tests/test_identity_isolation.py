"""Shared state that clients choose the keys of stays bounded, and never crosses identities (issue 31, findings 4 and 6).

The coordinator cache is bounded by bytes as well as entries, and keeps no key
longer than a sane limit; with ``--broker-identity client`` each connection
looks its coordinators up over its own links and keeps them to itself; the
core forwards what kfan's own view lacks to a broker as the client instead of
answering it from that view; a Metadata answer a client got removes nothing
from the topology. Unit tests here; through the real process at the end.
"""

from __future__ import annotations

import struct
import sys
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

import backends.coordinators as coordinators_module
from backends.cluster import Cluster
from backends.coordinators import CoordinatorCache, Coordinators, entry_bytes
from proxy.core import (
    ANY_BROKER,
    Context,
    Coordinator,
    FoldMetadata,
    Forward,
    KeyType,
    LocalReply,
    NeedCoordinators,
    Response,
    plan_request,
)
from proxy.core.plan import MAX_CACHED_KEY_CHARS
from proxy.core.read_replicas import MAX_RACK_CHARS, ReadReplicas
from proxy.core.topology import Topology
from proxy.kafka import apis, errors, schema
from proxy.kafka.headers import decode_response
from proxy.tools.mock_cluster import MockCluster
from tests.support.core_inputs import ALL_VERSIONS, BROKERS, IDENTITY, effects_of
from tests.support.kfan import Kfan, kfan_on, shown_ids, start_kfan
from tests.support.messages import answer_bytes, request_bytes
from tests.support.metrics import http_get, metrics_port_in, parse_samples
from tests.support.rawclient import RawClient
from tests.support.secure_cluster import SecureCluster
from tests.support.secure_kfan import broker_args, kfan_secrets
from tests.support.waiting import wait_for

GROUP = KeyType.GROUP
LONG = "g" * (MAX_CACHED_KEY_CHARS + 1)
TOPIC_AUTHORIZATION_FAILED = 29  # what Kafka with ACLs answers for a topic the principal may not describe, existing or not


# --- the coordinator cache ----------------------------------------------------------------------


class FakeAsker:
    """Answers FindCoordinator (v3: one key at a time) with broker 2 for every key, and counts what it was asked."""

    def __init__(self, node: int = 2) -> None:
        self.node = node
        self.asked: list[str] = []

    def any_broker(self) -> int | None:
        return 1

    def version_for(self, broker: int, api_key: int) -> int:
        return 3

    async def call(self, broker: int, api_key: int, version: int, body: Mapping[str, Any]) -> bytes:
        assert api_key == apis.FIND_COORDINATOR
        self.asked.append(body["key"])
        return answer_bytes(apis.FIND_COORDINATOR, 3, {"error_code": 0, "node_id": self.node, "host": "h", "port": 1})


def _view(asker: FakeAsker | None = None, cache: CoordinatorCache | None = None) -> Coordinators:
    return Coordinators(cache or CoordinatorCache(), asker or FakeAsker(), lambda: BROKERS, request_timeout=5)


async def test_the_coordinator_cache_is_bounded_by_bytes_least_recently_used_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinators_module, "MAX_COORDINATOR_BYTES", 1024 * 1024)
    view = _view()
    keys = [Coordinator(GROUP, f"{i:04d}" + "x" * 4000) for i in range(1000)]  # ~4 KiB each: 4 MiB in all
    view.learn({keys[0]: 1})
    for c in keys[1:]:
        view.learn({c: 1})
        assert view.known(keys[0]) == 1, "used at every step: never the least recently used"
    cache = view.cache
    assert cache.bytes <= 1024 * 1024, cache.bytes
    assert cache.bytes == sum(entry_bytes(c) for c in keys if c in view), "the count is what the entries hold"
    assert cache.evictions > 0 and len(cache) < 300
    assert keys[-1] in view and keys[1] not in view
    # Entries cost what Python holds for them, not a nominal count: a 2 MB key is 2 MB.
    assert entry_bytes(Coordinator(GROUP, "x" * 2_000_000)) >= 2_000_000


async def test_a_key_too_long_to_cache_is_looked_up_and_answered_every_time_but_never_kept() -> None:
    asker = FakeAsker()
    view = _view(asker)
    c = Coordinator(GROUP, LONG)
    assert await view.coordinator(c) == 2
    assert await view.coordinator(c) == 2
    assert asker.asked == [LONG, LONG], "looked up at each use"
    assert len(view.cache) == 0 and view.cache.bytes == 0
    view.learn({c: 2})  # a client's own FindCoordinator answer names it: not kept either
    assert len(view.cache) == 0
    # A key at the limit is kept.
    short = Coordinator(GROUP, "g" * MAX_CACHED_KEY_CHARS)
    assert await view.coordinator(short) == 2 and await view.coordinator(short) == 2
    assert asker.asked.count(short.key) == 1


async def test_each_scope_looks_up_with_its_own_asker_and_sees_only_its_own_entries() -> None:
    kfan, alice_links, bob_links = FakeAsker(node=1), FakeAsker(node=2), FakeAsker(node=3)
    shared = _view(kfan)
    alice = shared.scoped(alice_links, scope=object())
    bob = shared.scoped(bob_links, scope=object())
    c = Coordinator(GROUP, "orders")
    assert await alice.coordinator(c) == 2
    assert alice_links.asked == ["orders"] and kfan.asked == [], "looked up over alice's links, not kfan's"
    assert shared.known(c) is None and bob.known(c) is None, "alice's answer is hers alone"
    assert await bob.coordinator(c) == 3 and bob_links.asked == ["orders"]
    bob.forget(c)
    assert alice.known(c) == 2, "bob's coordinator moving changes nothing of alice's"
    assert len(shared.cache) == 1, "one bounded cache for every scope"


class NoFetches:
    """A connection's Fetch memory that no coordinator effect may reach."""

    def remember_watermarks(self, watermarks: object) -> None:
        raise AssertionError("a coordinator effect reached the Fetch memory")

    def fetch_ahead(self, ahead: object) -> None:
        raise AssertionError("a coordinator effect reached the Fetch memory")


async def test_the_cluster_applies_coordinator_effects_to_the_connections_view() -> None:
    from proxy.core import ForgetCoordinators, LearnCoordinators
    from proxy.server.effects import apply_effects

    cluster = Cluster([("127.0.0.1", 1)])
    cluster.topology = Topology(brokers=BROKERS)
    mine = cluster.coordinators.scoped(FakeAsker(), scope=object())
    c = Coordinator(GROUP, "g1")
    apply_effects([LearnCoordinators({c: 3})], cluster, mine, NoFetches())
    assert mine.known(c) == 3 and cluster.coordinators.known(c) is None
    apply_effects([LearnCoordinators({c: 1})], cluster, cluster.coordinators, NoFetches())
    apply_effects([ForgetCoordinators(frozenset({c}))], cluster, mine, NoFetches())
    assert mine.known(c) is None and cluster.coordinators.known(c) == 1


# --- the core, with the client's identity at the brokers ------------------------------------------------

TOPOLOGY = Topology(
    brokers=BROKERS,
    leaders={"known": {0: 2, 1: 3}, "leaderless": {0: -1}},
    topic_ids={uuid.UUID(int=7): "known"},
)


def _ctx(carry: bool, **fields: Any) -> Context:
    return Context(IDENTITY, TOPOLOGY, ALL_VERSIONS, client_identity=carry, **fields)


def _list_offsets(*topics: tuple[str, list[int]]) -> bytes:
    body = {
        "replica_id": -1,
        "topics": [{"name": t, "partitions": [{"partition_index": p, "timestamp": -1} for p in ps]} for t, ps in topics],
    }
    return request_bytes(apis.LIST_OFFSETS, 5, body)


def _offsets_answer(*topics: tuple[str, list[tuple[int, int]]]) -> Response:
    body = {
        "topics": [
            {"name": t, "partitions": [{"partition_index": p, "error_code": code, "offset": 0, "leader_epoch": 0} for p, code in ps]}
            for t, ps in topics
        ]
    }
    return Response(answer_bytes(apis.LIST_OFFSETS, 5, body))


def _decoded(api_key: int, version: int, parts: Any) -> dict[str, Any]:
    return schema.decode_body(schema.response_spec(api_key, version), b"".join(bytes(p) for p in parts))


@pytest.mark.parametrize("topic, partition", [("secret", 0), ("known", 7), ("leaderless", 0)])
def test_kfan_answers_from_its_own_view_only_with_its_own_identity(topic: str, partition: int) -> None:
    """A topic kfan does not know, a partition it does not know, one with no leader: kfan's own view answers
    them when the brokers see kfan, a broker as the client when they see the client."""
    payload = _list_offsets((topic, [partition]))
    own = plan_request(_ctx(False), payload)
    assert isinstance(own, LocalReply)
    code = _decoded(apis.LIST_OFFSETS, 5, own.body)["topics"][0]["partitions"][0]["error_code"]
    assert code in (errors.UNKNOWN_TOPIC_OR_PARTITION, errors.NOT_LEADER_OR_FOLLOWER)

    carried = plan_request(_ctx(True), payload)
    assert isinstance(carried, Forward) and list(carried.subs) == [1], "to a broker (the lowest id), as the client"
    assert not carried.unknown_topics, "nothing for kfan to refresh and wait for on the client's behalf"
    answer = _offsets_answer((topic, [(partition, TOPIC_AUTHORIZATION_FAILED)]))
    reply = carried.merge(carried, {1: answer})
    code = _decoded(apis.LIST_OFFSETS, 5, reply.body)["topics"][0]["partitions"][0]["error_code"]
    assert code == TOPIC_AUTHORIZATION_FAILED, "the broker's answer, as the client's authorization says"


def test_a_request_naming_known_and_unknown_topics_is_split_and_merged_in_the_clients_order() -> None:
    plan = plan_request(_ctx(True), _list_offsets(("secret", [0]), ("known", [0, 1]), ("other", [3])))
    assert isinstance(plan, Forward) and set(plan.subs) == {1, 2, 3}
    answers = {
        1: _offsets_answer(("secret", [(0, TOPIC_AUTHORIZATION_FAILED)]), ("other", [(3, errors.UNKNOWN_TOPIC_OR_PARTITION)])),
        2: _offsets_answer(("known", [(0, 0)])),
        3: _offsets_answer(("known", [(1, 0)])),
    }
    merged = _decoded(apis.LIST_OFFSETS, 5, plan.merge(plan, answers).body)
    got = [(t["name"], p["partition_index"], p["error_code"]) for t in merged["topics"] for p in t["partitions"]]
    assert got == [("secret", 0, 29), ("known", 0, 0), ("known", 1, 0), ("other", 3, 3)]


def test_a_fetch_by_unknown_topic_id_goes_to_a_broker_as_the_client() -> None:
    body = {
        "replica_id": -1,
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "session_epoch": -1,
        "topics": [{"topic_id": uuid.UUID(int=99), "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1024}]}],
    }
    payload = request_bytes(apis.FETCH, 13, body)
    assert isinstance(plan_request(_ctx(False), payload), LocalReply)
    carried = plan_request(_ctx(True), payload)
    assert isinstance(carried, Forward) and list(carried.subs) == [1]


def test_records_kfan_refuses_unread_are_refused_whoever_the_client_is() -> None:
    """A CRC-broken batch is refused before any broker sees it: that says nothing of the cluster."""
    body = {"acks": -1, "timeout": 1000, "topic_data": [{"name": "secret", "partition_data": [{"index": 0, "records": b"\x00" * 70}]}]}
    plan = plan_request(_ctx(True), request_bytes(apis.PRODUCE, 8, body))
    assert isinstance(plan, LocalReply) and plan.refused


def _metadata_answer(topics: list[dict[str, Any]]) -> Response:
    body = {
        "brokers": [{"node_id": b.node_id, "host": b.host, "port": b.port, "rack": None} for b in BROKERS.values()],
        "cluster_id": "c",
        "controller_id": 1,
        "topics": topics,
    }
    return Response(answer_bytes(apis.METADATA, 12, body))


def test_a_clients_metadata_answer_folds_what_it_describes_and_removes_nothing() -> None:
    partitions = [
        {
            "error_code": 0,
            "partition_index": 0,
            "leader_id": 3,
            "leader_epoch": 0,
            "replica_nodes": [3],
            "isr_nodes": [3],
            "offline_replicas": [],
        }
    ]
    answer = _metadata_answer(
        [
            # Not this client's to see.
            {"name": "known", "error_code": TOPIC_AUTHORIZATION_FAILED, "topic_id": uuid.UUID(int=0), "partitions": []},
            {"name": "fresh", "error_code": 0, "topic_id": uuid.UUID(int=8), "partitions": partitions},
        ]
    )
    request = request_bytes(
        apis.METADATA, 12, {"topics": [{"name": "known", "topic_id": uuid.UUID(int=0)}, {"name": "fresh", "topic_id": uuid.UUID(int=0)}]}
    )
    for carry in (False, True):
        plan = plan_request(_ctx(carry), request)
        assert isinstance(plan, Forward) and list(plan.subs) == [ANY_BROKER]
        (fold,) = effects_of(plan.merge(plan, {ANY_BROKER: answer}), FoldMetadata)
        assert fold.described_only is carry
        folded = TOPOLOGY.with_metadata(fold.metadata, described_only=fold.described_only)
        assert folded.leader("fresh", 0) == 3, "a topic described without error is taken in"
        assert folded.knows_topic("known") is carry, "kfan's own answer is the truth; a client's error is the client's"
        if carry:
            assert folded.leaders["known"] == TOPOLOGY.leaders["known"]


def test_deleted_topics_ids_go_at_a_full_refresh() -> None:
    topology = Topology(brokers=BROKERS, leaders={"a": {0: 1}}, topic_ids={uuid.UUID(int=1): "a", uuid.UUID(int=2): "gone"})
    assert topology.known_ids_only().topic_ids == {uuid.UUID(int=1): "a"}


def test_a_batch_naming_keys_too_long_to_cache_sends_each_to_its_own_coordinator() -> None:
    body = {"groups": [LONG, "g" * (MAX_CACHED_KEY_CHARS + 2), "short"], "include_authorized_operations": False}
    payload = request_bytes(apis.DESCRIBE_GROUPS, 5, body)
    first = plan_request(_ctx(True), payload)
    assert isinstance(first, NeedCoordinators) and len(first.coordinators) == 3
    again = plan_request(_ctx(True, coordinators_looked_up=True), payload)
    assert isinstance(again, Forward)
    assert set(again.subs) == {Coordinator(GROUP, LONG), Coordinator(GROUP, "g" * (MAX_CACHED_KEY_CHARS + 2))}, (
        "the long keys go to be looked up as they are sent; 'short' was looked up and not found: NOT_COORDINATOR"
    )


# --- read replicas ---------------------------------------------------------------------------------


def test_read_replicas_are_bounded_by_bytes_and_keep_no_long_rack() -> None:
    replicas = ReadReplicas(max_age=60, max_bytes=64 * 1024)
    replicas.learn({("r" * (MAX_RACK_CHARS + 1), "t", 0): 2}, now=0)
    assert len(replicas) == 0 and replicas.bytes == 0
    for i in range(1000):
        replicas.learn({(f"rack-{i}" + "x" * 200, "t", 0): 2}, now=0)
    assert replicas.bytes <= 64 * 1024 and replicas.evictions > 0
    newest = (f"rack-{999}" + "x" * 200, "t", 0)
    assert replicas.get(newest, now=1) == 2
    replicas.forget([newest])
    assert replicas.bytes == sum(sys.getsizeof(k[0]) + sys.getsizeof(k[1]) + 250 for k in replicas._learned)


# --- through the real process -----------------------------------------------------------------------


def _framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _rss_mib(k: Kfan) -> float:
    for line in open(f"/proc/{k.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _cache_metric(k: Kfan, family: str) -> float:
    _, text = http_get(f"http://127.0.0.1:{metrics_port_in(k.log)}/metrics")
    return sum(v for labels, v in parse_samples(text).get(family, []) if 'cache="coordinators"' in labels)


def test_long_group_ids_leave_nothing_behind_and_many_ids_are_evicted_by_bytes(cluster: MockCluster) -> None:
    """Finding 4: 100 group ids of 2 MB (the client's own FindCoordinator, and kfan's lookup for an OffsetFetch)
    used to stay in the coordinator cache after the client left (+215 MiB here); now kfan looks them up and
    answers, keeps none, and returns near its resting size. Then 4,500 ids of 4,000 characters, each cacheable:
    the cache stays within its 16 MiB and evicts the least recently used."""
    with kfan_on(cluster, "--metrics-listen", "127.0.0.1:0") as k:
        with RawClient(k.address) as client:
            client.send_bytes(_framed(request_bytes(apis.METADATA, 9, {"topics": []}, correlation_id=1)))
            assert client.receive() is not None
            base = _rss_mib(k)
            for i in range(50):
                gid = f"{i:03d}" + "x" * 2_000_000
                # FindCoordinator v3 and OffsetFetch v6 are flexible: their strings may be this long.
                client.send_bytes(_framed(request_bytes(apis.FIND_COORDINATOR, 3, {"key": gid, "key_type": 0}, correlation_id=2 * i)))
                found = decode_response(client.receive(), apis.FIND_COORDINATOR, 3)
                assert found["error_code"] == errors.NONE and found["node_id"] in shown_ids(cluster.brokers), "answered, naming kfan"
                client.send_bytes(
                    _framed(request_bytes(apis.OFFSET_FETCH, 6, {"group_id": "o" + gid, "topics": None}, correlation_id=2 * i + 1))
                )
                assert client.receive() is not None, "answered after kfan's own lookup"
            assert _cache_metric(k, "kfan_cache_bytes") < 1024 * 1024, "no 2 MB key is kept"
        wait_for(f"kfan's RSS back near its {base:.0f} MiB at rest", lambda: _rss_mib(k) < base + 64, 30, seen=lambda: _rss_mib(k))

        with RawClient(k.address) as client:
            for start in range(0, 4500, 100):  # pipelined, a hundred at a time
                for i in range(start, start + 100):
                    key = f"{i:05d}" + "y" * 4000
                    client.send_bytes(_framed(request_bytes(apis.FIND_COORDINATOR, 3, {"key": key, "key_type": 0}, correlation_id=i)))
                for _ in range(100):
                    assert client.receive() is not None
        held = _cache_metric(k, "kfan_cache_bytes")
        assert 15 * 1024 * 1024 < held <= 16 * 1024 * 1024, held
        assert _cache_metric(k, "kfan_cache_evictions_total") > 0


# What kfan asks as itself with the client's identity at the brokers: its brokers' versions and its own topology.
_OWN = (apis.API_VERSIONS, apis.METADATA)


def _log_in(client: RawClient, user: str, password: str) -> None:
    """SASL PLAIN with kfan, as a raw client."""
    client.send_bytes(_framed(request_bytes(apis.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}, correlation_id=1)))
    assert decode_response(client.receive(), apis.SASL_HANDSHAKE, 1)["error_code"] == errors.NONE
    token = f"\0{user}\0{password}".encode()
    client.send_bytes(_framed(request_bytes(apis.SASL_AUTHENTICATE, 2, {"auth_bytes": token}, correlation_id=2)))
    assert decode_response(client.receive(), apis.SASL_AUTHENTICATE, 2)["error_code"] == errors.NONE


def test_with_the_clients_identity_kfan_looks_up_and_asks_nothing_as_itself(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Findings 6 and 4, ``--broker-identity client``: a Heartbeat for a new group is routed by a FindCoordinator
    that reaches the broker as the client, never as kfan; a ListOffsets naming a topic kfan does not know reaches a
    broker as the client instead of being answered from kfan's view.

    The fronts check no ACLs (nor does the mock behind them), so the broker answers UNKNOWN_TOPIC_OR_PARTITION
    where Kafka would answer TOPIC_AUTHORIZATION_FAILED, and no backend here answers a Metadata request with
    error 29: what is asserted is that the request reached a broker as the client (the fronts log each relayed
    request with its principal); the folding of a client's error answers is tested on the core above.
    """
    secrets = kfan_secrets(tmp_path_factory.mktemp("kfan-secrets"))
    with SecureCluster.for_tests(tmp_path_factory, log_requests=True) as secure:
        k = start_kfan(secure.bootstrap, *broker_args(secure), *secrets.sasl_args(), "--broker-identity", "client")
        try:
            with RawClient(k.address) as alice:
                _log_in(alice, "alice", secrets.passwords["alice"])
                group = f"g-{uuid.uuid4().hex[:8]}"
                body = {"group_id": group, "generation_id": 1, "member_id": "m", "group_instance_id": None}
                alice.send_bytes(_framed(request_bytes(apis.HEARTBEAT, 3, body, correlation_id=3)))
                assert decode_response(alice.receive(), apis.HEARTBEAT, 3)["error_code"] != errors.NOT_COORDINATOR

                def requests(api_key: int) -> list[dict[str, Any]]:
                    return [e for e in secure.front_events("request") if e["api_key"] == api_key]

                wait_for("alice's Heartbeat at a broker", lambda: any(e["principal"] == "alice" for e in requests(apis.HEARTBEAT)), 30)
                lookups = requests(apis.FIND_COORDINATOR)
                assert lookups and {e["principal"] for e in lookups} == {"alice"}, "looked up as alice, never as kfan"

                topic = f"no-such-{uuid.uuid4().hex[:8]}"
                offsets = {"replica_id": -1, "topics": [{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}]}
                alice.send_bytes(_framed(request_bytes(apis.LIST_OFFSETS, 5, offsets, correlation_id=4, client_id=topic)))
                answer = decode_response(alice.receive(), apis.LIST_OFFSETS, 5)
                assert answer["topics"][0]["partitions"][0]["error_code"] == errors.UNKNOWN_TOPIC_OR_PARTITION
                asked = [e for e in requests(apis.LIST_OFFSETS) if e["client_id"] == topic]
                assert [(e["principal"], e["broker"]) for e in asked] == [("alice", 1)], "answered by a broker, as alice"
            assert not [e for e in secure.front_events("request") if e["principal"] == "kfan" and e["api_key"] not in _OWN], (
                "kfan's own identity asked only for its own topology"
            )
        finally:
            k.stop()
