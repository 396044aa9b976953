"""``--broker-ids cluster``: clients see the cluster's brokers under their own ids, every one at kfan's address.

The sans-IO rewrites, one API at a time: node ids, racks, replicas, leaders and
the controller stay the brokers' own; every host and port becomes kfan's;
preferred read replicas still never reach a client; a broker's own configs
go to that broker. (The same clients through kfan in this mode, against
Apache Kafka: tests/test_client_matrix.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema

from proxy.core import Context, Forward, Response, plan_request
from proxy.core.plan import ANY_BROKER, FoldMetadata, LearnCoordinators
from proxy.core.topology import Broker, Topology
from proxy.kafka import apis, errors, schema
from tests.support.core_inputs import ALL_VERSIONS, BROKERS, IDENTITY, effects_of
from tests.support.kio_oracle import kio_decode, kio_encode, request_payload
from tests.support.messages import answer_bytes, request_bytes

CLUSTER_IDS = replace(IDENTITY, cluster_ids=True)
KFAN = (CLUSTER_IDS.host, CLUSTER_IDS.port)


def _merged(api_key: int, version: int, request: dict[str, Any], answer: dict[str, Any], leaders: Any = None) -> tuple[Any, Any]:
    ctx = Context(CLUSTER_IDS, Topology(brokers=BROKERS, leaders=leaders or {}), ALL_VERSIONS)
    plan = plan_request(ctx, request_bytes(api_key, version, request))
    assert isinstance(plan, Forward)
    (destination,) = plan.subs
    reply = plan.merge(plan, {destination: Response(answer_bytes(api_key, version, answer))})
    body = schema.decode_body(schema.response_spec(api_key, version), b"".join(bytes(p) for p in reply.body))
    return body, reply


@settings(max_examples=100, suppress_health_check=list(HealthCheck), deadline=None)
@given(data=st.data())
def test_metadata_names_the_brokers_by_their_ids_at_kfans_address(data: st.DataObject) -> None:
    lo, hi = ALL_VERSIONS[apis.METADATA]
    version = data.draw(st.integers(lo, hi))
    req = data.draw(st.from_type(load_request_schema(apis.METADATA, version)))
    resp = data.draw(st.from_type(load_response_schema(apis.METADATA, version)))
    # Brokers that left the Metadata lately (some of them back in this answer, perhaps): shown after the live ones.
    departed = {
        i: Broker(i, f"gone{i}.internal", 9100 + i, data.draw(st.sampled_from([None, "az-2"])))
        for i in data.draw(st.sets(st.integers(-2, 40), max_size=4))
    }
    topology = Topology(brokers=BROKERS, departed=departed)
    plan = plan_request(Context(CLUSTER_IDS, topology, ALL_VERSIONS), request_payload(req))
    assert isinstance(plan, Forward) and set(plan.subs) == {ANY_BROKER}
    reply = plan.merge(plan, {ANY_BROKER: Response(answer_bytes(apis.METADATA, version, {}, 1)[:0] + _framed(resp, version))})
    out = kio_decode(type(resp), b"".join(bytes(p) for p in reply.body))
    shown = [(b.node_id, b.host, b.port, getattr(b, "rack", None)) for b in out.brokers]
    live = {b.node_id for b in resp.brokers}
    racks = version >= 1  # Metadata v0 has no rack
    served = {**departed, **BROKERS}  # the ones kfan knew when the request came, too
    gone = [(i, *KFAN, b.rack if racks else None) for i, b in sorted(served.items()) if i not in live]
    assert shown == [(b.node_id, *KFAN, getattr(b, "rack", None)) for b in resp.brokers] + gone
    if hasattr(out, "controller_id"):
        assert out.controller_id == (resp.controller_id if resp.controller_id in live else min(live, default=-1))
    for t, t0 in zip(out.topics, resp.topics, strict=True):
        for p, p0 in zip(t.partitions, t0.partitions, strict=True):
            if p0.leader_id >= 0 and p0.leader_id not in live:
                assert p.leader_id == -1 and p.error_code.value == (p0.error_code.value or errors.LEADER_NOT_AVAILABLE)
            else:
                assert p.leader_id == p0.leader_id and p.error_code == p0.error_code
            assert (p.replica_nodes, p.isr_nodes) == (p0.replica_nodes, p0.isr_nodes)
    assert len(effects_of(reply, FoldMetadata)) == 1


def test_a_departed_broker_is_shown_with_the_clusters_ids_only() -> None:
    """A broker gone from the Metadata stays listed (at kfan, leading nothing) with the cluster's ids, so that a
    client keeps its connection to that id and the requests out on it (librdkafka drops a broker missing from
    Metadata and counts its requests as not written); as one broker, kfan alone is listed."""
    partition = {
        "error_code": 0,
        "partition_index": 0,
        "leader_id": 1,
        "leader_epoch": 0,
        "replica_nodes": [1, 2],
        "isr_nodes": [1],
        "offline_replicas": [2],
    }
    topic = {
        "error_code": 0,
        "name": "t",
        "topic_id": uuid.uuid4(),
        "is_internal": False,
        "partitions": [partition],
        "topic_authorized_operations": 0,
    }
    answer = {"brokers": [{"node_id": 1, "host": "broker1.internal", "port": 9001, "rack": "az-1"}], "topics": [topic]}
    # Broker 2 left before; broker 3 was there when the request came, and this answer is the first to leave it out.
    known = {1: Broker(1, "broker1.internal", 9001, "az-1"), 3: Broker(3, "broker3.internal", 9003, "az-3")}
    departed = {2: Broker(2, "broker2.internal", 9002, "az-2")}
    for identity, listed in ((CLUSTER_IDS, [(1, "az-1"), (2, "az-2"), (3, "az-3")]), (IDENTITY, [(IDENTITY.node_id, None)])):
        ctx = Context(identity, Topology(brokers=known, departed=departed), ALL_VERSIONS)
        plan = plan_request(ctx, request_bytes(apis.METADATA, 12, {"topics": None}))
        assert isinstance(plan, Forward)
        reply = plan.merge(plan, {ANY_BROKER: Response(answer_bytes(apis.METADATA, 12, answer))})
        body = schema.decode_body(schema.response_spec(apis.METADATA, 12), b"".join(bytes(p) for p in reply.body))
        assert [(b["node_id"], b["rack"]) for b in body["brokers"]] == listed
        assert {(b["host"], b["port"]) for b in body["brokers"]} == {(identity.host, identity.port)}
        assert [p["leader_id"] for p in body["topics"][0]["partitions"]] == [1 if identity.cluster_ids else IDENTITY.node_id]


def _framed(resp: Any, version: int) -> bytes:
    from proxy.kafka.headers import response_header

    return response_header(apis.METADATA, version, 1) + kio_encode(resp)


def test_find_coordinator_keeps_the_coordinators_id_and_gives_kfans_address() -> None:
    single, reply = _merged(
        apis.FIND_COORDINATOR, 3, {"key": "g", "key_type": 0}, {"node_id": 2, "host": "b2", "port": 9002, "error_code": 0}
    )
    assert (single["node_id"], single["host"], single["port"]) == (2, *KFAN)
    batched, _ = _merged(
        apis.FIND_COORDINATOR,
        4,
        {"key_type": 0, "coordinator_keys": ["g", "h"]},
        {"coordinators": [
            {"key": "g", "node_id": 3, "host": "b3", "port": 9003, "error_code": 0, "error_message": None},
            {"key": "h", "node_id": 7, "host": "x", "port": 1, "error_code": errors.COORDINATOR_NOT_AVAILABLE, "error_message": None},
        ]},
    )  # fmt: skip
    assert [(c["node_id"], c["host"], c["port"]) for c in batched["coordinators"]] == [(3, *KFAN), (-1, "", -1)]
    (learned,) = effects_of(reply, LearnCoordinators)
    assert list(learned.coordinators.values()) == [2]


def test_describe_cluster_lists_every_broker_at_kfans_address() -> None:
    brokers = [{"broker_id": i, "host": f"b{i}", "port": 9000 + i, "rack": f"r{i}"} for i in (1, 2, 3)]
    body, _ = _merged(apis.DESCRIBE_CLUSTER, 1, {}, {"brokers": brokers, "controller_id": 3})
    assert [(b["broker_id"], b["host"], b["port"], b["rack"]) for b in body["brokers"]] == [(i, *KFAN, f"r{i}") for i in (1, 2, 3)]
    assert body["controller_id"] == 3
    gone, _ = _merged(apis.DESCRIBE_CLUSTER, 1, {}, {"brokers": brokers[:2], "controller_id": 3})
    assert gone["controller_id"] == 1, "a controller the client cannot be shown is replaced by a broker it is shown"


def test_a_produce_answers_leader_hint_keeps_the_leaders_id_at_kfans_address() -> None:
    """KIP-951: the leader a partition moved to, by its own id; its endpoint is kfan's (the rack the broker's)."""
    partition = {"index": 0, "error_code": errors.NOT_LEADER_OR_FOLLOWER, "base_offset": -1, "log_append_time": -1,
                 "log_start_offset": -1, "record_errors": [], "error_message": None,
                 "current_leader": {"leader_id": 3, "leader_epoch": 9}}  # fmt: skip
    answer = {
        "responses": [{"name": "t", "partition_responses": [partition]}],
        "node_endpoints": [{"node_id": 3, "host": "b3", "port": 9003, "rack": "r3"}],
    }
    request = {"acks": -1, "timeout": 1000, "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": None}]}]}
    body, _ = _merged(apis.PRODUCE, 10, request, answer, leaders={"t": {0: 2}})
    (p,) = body["responses"][0]["partition_responses"]
    assert p["current_leader"] == {"leader_id": 3, "leader_epoch": 9}
    assert [(e["node_id"], e["host"], e["port"], e["rack"]) for e in body["node_endpoints"]] == [(3, *KFAN, "r3")]


def test_a_fetch_answers_preferred_read_replica_is_still_hidden() -> None:
    partition = {"partition_index": 0, "error_code": 0, "high_watermark": 5, "last_stable_offset": 5, "log_start_offset": 0,
                 "aborted_transactions": None, "preferred_read_replica": 3, "records": None}  # fmt: skip
    request = {"max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "session_epoch": -1, "rack_id": "r3", "replica_id": -1,
               "topics": [{"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]}  # fmt: skip
    body, _ = _merged(apis.FETCH, 12, request, {"responses": [{"topic": "t", "partitions": [partition]}]}, leaders={"t": {0: 1}})
    assert body["responses"][0]["partitions"][0]["preferred_read_replica"] == -1


def test_a_brokers_configs_go_to_that_broker_and_name_it() -> None:
    for broker in (1, 3):
        request = {"resources": [{"resource_type": 4, "resource_name": str(broker), "configuration_keys": None}]}
        ctx = Context(CLUSTER_IDS, Topology(brokers=BROKERS), ALL_VERSIONS)
        plan = plan_request(ctx, request_bytes(apis.DESCRIBE_CONFIGS, 4, request))
        assert isinstance(plan, Forward) and set(plan.subs) == {broker}
        results = [{"resource_type": 4, "resource_name": str(broker), "configs": [], "error_code": 0, "error_message": None}]
        reply = plan.merge(plan, {broker: Response(answer_bytes(apis.DESCRIBE_CONFIGS, 4, {"results": results}))})
        body = schema.decode_body(schema.response_spec(apis.DESCRIBE_CONFIGS, 4), b"".join(bytes(p) for p in reply.body))
        assert body["results"][0]["resource_name"] == str(broker)
    for name in ("42", "9", "", "１"):  # kfan's own --node-id is no broker here; nor an absent one, nor a non-ASCII digit
        request = {"resources": [{"resource_type": 4, "resource_name": name, "configuration_keys": None}]}
        plan = plan_request(Context(CLUSTER_IDS, Topology(brokers=BROKERS), ALL_VERSIONS), request_bytes(apis.DESCRIBE_CONFIGS, 4, request))
        assert isinstance(plan, Forward) and set(plan.subs) == {ANY_BROKER}, name


def test_describe_topic_partitions_keeps_the_replicas() -> None:
    partition = {"partition_index": 0, "leader_id": 2, "leader_epoch": 1, "replica_nodes": [2, 3, 1], "isr_nodes": [2, 3],
                 "error_code": 0, "offline_replicas": [], "eligible_leader_replicas": None, "last_known_elr": None}  # fmt: skip
    topic = {"name": "t", "topic_id": uuid.uuid4(), "is_internal": False, "topic_authorized_operations": -2147483648}
    answer = {"topics": [{**topic, "partitions": [partition], "error_code": 0}], "next_cursor": None}
    body, _ = _merged(apis.DESCRIBE_TOPIC_PARTITIONS, 0, {"topics": [{"name": "t"}], "response_partition_limit": 10}, answer)
    (p,) = body["topics"][0]["partitions"]
    assert (p["leader_id"], p["replica_nodes"], p["isr_nodes"]) == (2, [2, 3, 1], [2, 3])


def test_with_a_port_base_each_broker_is_shown_at_its_own_port_of_kfans_host() -> None:
    """``--broker-port-base 30000``: broker N at kfan's host, port 30000 + N, wherever an answer names it."""
    ports = replace(CLUSTER_IDS, port_base=30000)
    ctx = Context(ports, Topology(brokers=BROKERS), ALL_VERSIONS)
    brokers = [{"node_id": i, "host": f"b{i}", "port": 9000 + i, "rack": None} for i in (1, 2, 3)]
    plan = plan_request(ctx, request_bytes(apis.METADATA, 12, {"topics": [], "allow_auto_topic_creation": False}))
    assert isinstance(plan, Forward)
    answer = answer_bytes(apis.METADATA, 12, {"brokers": brokers, "controller_id": 1, "topics": [], "cluster_id": "c"})
    reply = plan.merge(plan, {ANY_BROKER: Response(answer)})
    body = schema.decode_body(schema.response_spec(apis.METADATA, 12), b"".join(bytes(p) for p in reply.body))
    assert [(b["node_id"], b["host"], b["port"]) for b in body["brokers"]] == [(i, CLUSTER_IDS.host, 30000 + i) for i in (1, 2, 3)]
    plan = plan_request(ctx, request_bytes(apis.FIND_COORDINATOR, 3, {"key": "g", "key_type": 0}))
    assert isinstance(plan, Forward)
    answer = answer_bytes(apis.FIND_COORDINATOR, 3, {"node_id": 2, "host": "b2", "port": 9002, "error_code": 0})
    reply = plan.merge(plan, {ANY_BROKER: Response(answer)})
    found = schema.decode_body(schema.response_spec(apis.FIND_COORDINATOR, 3), b"".join(bytes(p) for p in reply.body))
    assert (found["node_id"], found["host"], found["port"]) == (2, CLUSTER_IDS.host, 30002)
    # A broker id the base cannot give a port (beyond 65535) is shown at kfan's own port.
    assert replace(CLUSTER_IDS, port_base=65000).port_of(1000) == CLUSTER_IDS.port
    assert replace(CLUSTER_IDS, port_base=65000).port_of(535) == 65535


# kfan's defaults, also in a run with KFAN_BROKER_IDS=cluster.
DEFAULT_ENV = {k: v for k, v in os.environ.items() if k != "KFAN_BROKER_IDS"}


def test_a_port_base_without_the_clusters_ids_is_refused_at_start() -> None:
    for args, complaint in (
        (["--broker-port-base", "30000"], "--broker-port-base is used only with --broker-ids cluster"),
        (["--broker-ids", "cluster", "--broker-port-base", "70000"], "--broker-port-base 70000 is not a port"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "proxy", "serve", "--bootstrap", "127.0.0.1:1", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=DEFAULT_ENV,
        )
        assert done.returncode != 0 and complaint in done.stderr, done.stderr
