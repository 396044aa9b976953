"""Hiding the brokers behind kfan: every rewrite of broker identity in an
answer, one function per API (Kroxylicious' NodeIdResponseTranslator).

As one broker (``--broker-ids kfan``), clients see kfan alone: leaders,
replicas, controllers, coordinators and broker lists in answers are rewritten
to name it. With the cluster's ids (``--broker-ids cluster``), clients see the
brokers under their own node ids and racks, each at kfan's address: only
addresses are rewritten. Either way the truth each answer carried goes to the
I/O layer as effects (a Metadata answer to fold into the topology,
coordinators learned), and preferred read replicas never reach a client
(kfan follows them itself, by its own or the client's rack).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..kafka import errors
from ..kafka.schema import Struct, StructSpec
from .layout import Layout
from .plan import Context, Coordinator, Effect, FoldMetadata, Identity, KeyType, LearnCoordinators, RefreshTopology
from .topology import Broker

# The rewrites an any-broker route names: (what the core knows, the client's
# request, the decoded answer, the answer's schema) -> (the client's answer, effects).


def metadata(ctx: Context, request: Struct, response: Struct, spec: StructSpec) -> tuple[Struct, list[Effect]]:
    # Brokers kfan serves that the answer may not list: those that left lately, and those it knew when the
    # request came (this answer may be the first to leave one out; a broker's answer listing none, too).
    served = {**ctx.topology.departed, **ctx.topology.brokers}
    return rewrite_metadata(ctx.identity, response, _broker_blank(spec), served), [FoldMetadata(response)]


def find_coordinator(ctx: Context, request: Struct, response: Struct, spec: StructSpec) -> tuple[Struct, list[Effect]]:
    body, learned = rewrite_find_coordinator(ctx.identity, request, response)
    return body, [LearnCoordinators(learned)] if learned else []


def describe_cluster(ctx: Context, request: Struct, response: Struct, spec: StructSpec) -> tuple[Struct, list[Effect]]:
    return rewrite_describe_cluster(ctx.identity, response, _broker_blank(spec)), []


def describe_topic_partitions(ctx: Context, request: Struct, response: Struct, spec: StructSpec) -> tuple[Struct, list[Effect]]:
    if ctx.identity.cluster_ids:
        return response, []
    return {**response, "topics": _topics_as_kfan(ctx.identity.node_id, response["topics"])}, []


def list_partition_reassignments(ctx: Context, request: Struct, response: Struct, spec: StructSpec) -> tuple[Struct, list[Effect]]:
    if ctx.identity.cluster_ids:
        return response, []
    return {**response, "topics": _topics_as_kfan(ctx.identity.node_id, response["topics"])}, []


def list_config_resources(ctx: Context, request: Struct, response: Struct, spec: StructSpec) -> tuple[Struct, list[Effect]]:
    """The brokers' BROKER and BROKER_LOGGER resources (named by broker id) become kfan's one node's."""
    if ctx.identity.cluster_ids:
        return response, []
    kfan_name = str(ctx.identity.node_id)
    entries: list[Struct] = []
    seen: set[int] = set()
    for r in response["config_resources"]:
        kind = r.get("resource_type")
        if kind not in BROKER_RESOURCES:
            entries.append(r)
        elif kind not in seen:
            seen.add(kind)
            entries.append({**r, "resource_name": kfan_name})
    return {**response, "config_resources": entries}, []


# The fields of leader-split answers that may name a broker (what :func:`partitions` rewrites).
PARTITION_BROKER_FIELDS = frozenset({"preferred_read_replica", "current_leader", "node_endpoints"})


def names_brokers(body: Struct, layout: Layout) -> bool:
    """Whether a leader-split answer names a broker anywhere :func:`partitions` would hide it (or carries
    what it rewrites anyway: node endpoints naming none, a preferred read replica other than -1)."""
    if "node_endpoints" in body:
        return True
    for t in body[layout.topics]:
        for p in t[layout.partitions]:
            if isinstance(p, dict) and (
                p.get("preferred_read_replica", -1) != -1 or (p.get("current_leader") or {}).get("leader_id", -1) >= 0
            ):
                return True
    return False


def partitions(identity: Identity, body: Struct, layout: Layout) -> list[Effect]:
    """Leader-split answers (Produce, Fetch, ...): hide broker identity in partition entries.

    A partition answering a leadership error means the topology is stale: refresh it.
    """
    named: set[int] = set()  # leaders the partitions name (KIP-951)
    stale = False
    for t in body[layout.topics]:
        for p in t[layout.partitions]:
            if not isinstance(p, dict):
                continue
            if p.get("error_code", 0) in errors.LEADERSHIP:
                stale = True
            if "preferred_read_replica" in p:
                p["preferred_read_replica"] = -1
            cl = p.get("current_leader")
            if cl is not None and cl.get("leader_id", -1) >= 0:
                named.add(cl["leader_id"])
                if not identity.cluster_ids:
                    p["current_leader"] = {**cl, "leader_id": identity.node_id}
    if "node_endpoints" in body or named:
        if not named:
            body.pop("node_endpoints", None)
        elif identity.cluster_ids:
            racks = {e["node_id"]: e.get("rack") for e in body.get("node_endpoints") or ()}
            body["node_endpoints"] = [
                {"node_id": n, "host": identity.host, "port": identity.port_of(n), "rack": racks.get(n)} for n in sorted(named)
            ]
        else:
            body["node_endpoints"] = [{"node_id": identity.node_id, "host": identity.host, "port": identity.port, "rack": None}]
    return [RefreshTopology()] if stale else []


def _broker_blank(spec: StructSpec) -> Struct:
    broker = spec.field("brokers").struct
    assert broker is not None
    return broker.blank()


def _broker_entry(identity: Identity, base: Struct | None, id_field: str = "node_id") -> Struct:
    """kfan as a broker entry; ``base`` supplies the version's other fields (DescribeCluster v2 is_fenced)."""
    entry = {**(base or {}), id_field: identity.node_id, "host": identity.host, "port": identity.port, "rack": None}
    if "is_fenced" in entry:
        entry["is_fenced"] = False
    return entry


def _brokers_at_kfan(identity: Identity, brokers: list[Struct], id_field: str = "node_id") -> list[Struct]:
    """The brokers under their own ids and racks, each at kfan's address."""
    return [{**b, "host": identity.host, "port": identity.port_of(b[id_field])} for b in brokers]


def _controller(controller_id: int, brokers: list[Struct], id_field: str) -> int:
    """The controller a client is shown: one of the brokers it is shown (KRaft brokers name any live one)."""
    ids = [b[id_field] for b in brokers]
    return controller_id if controller_id in ids else min(ids, default=-1)


# Partition fields listing broker ids (Metadata, DescribeTopicPartitions, reassignments).
_NODE_LISTS = (
    "replica_nodes",
    "isr_nodes",
    "offline_replicas",
    "eligible_leader_replicas",
    "last_known_elr",
    "replicas",
    "adding_replicas",
    "removing_replicas",
)


def _partition_as_kfan(node: int, p: Struct) -> Struct:
    q = dict(p)
    if q.get("leader_id", -1) >= 0:
        q["leader_id"] = node
    for name in _NODE_LISTS:
        if q.get(name):
            # Keep the count (it is the replication factor tools show).
            q[name] = [node] * len(q[name])
    return q


def _topics_as_kfan(node: int, topics: list[Struct]) -> list[Struct]:
    return [{**t, "partitions": [_partition_as_kfan(node, p) for p in t["partitions"]]} for t in topics]


def rewrite_metadata(
    identity: Identity, response: Struct, broker_base: Struct | None = None, served: Mapping[int, Broker] | None = None
) -> Struct:
    """kfan as the only broker: every leader, replica and controller is kfan.

    Except a leader that is not among the answer's brokers: Metadata lists live
    brokers only, so that partition's leader is down and kfan cannot reach it
    either. It is reported as Kafka reports an offline partition (no leader,
    LEADER_NOT_AVAILABLE), so that clients wait for a leader instead of
    sending kfan requests it can only refuse.

    With the cluster's ids, the brokers kfan still ``served`` that the answer
    does not list (:attr:`Topology.departed`) are listed too, after the live
    ones, leading nothing.
    """
    out = dict(response)
    live = {b["node_id"] for b in response["brokers"]}
    topics = [{**t, "partitions": [_without_absent_leader(p, live) for p in t["partitions"]]} for t in response["topics"]]
    if identity.cluster_ids:
        unlisted = [_served_entry(b, broker_base) for i, b in sorted((served or {}).items()) if i not in live]
        out["brokers"] = _brokers_at_kfan(identity, [*response["brokers"], *unlisted])
        if "controller_id" in out:
            out["controller_id"] = _controller(out["controller_id"], response["brokers"], "node_id")
        out["topics"] = topics
        return out
    out["brokers"] = [_broker_entry(identity, broker_base)]
    if "controller_id" in out:
        out["controller_id"] = identity.node_id
    out["topics"] = _topics_as_kfan(identity.node_id, topics)
    return out


def _served_entry(broker: Broker, base: Struct | None) -> Struct:
    entry = {**(base or {}), "node_id": broker.node_id}
    if "rack" in entry:  # Metadata v1 on
        entry["rack"] = broker.rack
    return entry


def _without_absent_leader(p: Struct, live: set[int]) -> Struct:
    if p.get("leader_id", -1) < 0 or p["leader_id"] in live:
        return p
    return {**p, "leader_id": -1, "error_code": p.get("error_code") or errors.LEADER_NOT_AVAILABLE}


# Config resources that name a broker: BROKER and BROKER_LOGGER (Kafka's ConfigResource.Type).
BROKER_RESOURCES = frozenset({4, 8})


def rewrite_config_resources(response: Struct, array: str, stand_in: str, kfan_name: str) -> Struct:
    """The stand-in broker's answers about itself become answers about kfan."""
    entries = [
        {**r, "resource_name": kfan_name} if r["resource_type"] in BROKER_RESOURCES and r["resource_name"] == stand_in else r
        for r in response[array]
    ]
    return {**response, array: entries}


def rewrite_find_coordinator(identity: Identity, request: Struct, response: Struct) -> tuple[Struct, dict[Coordinator, int]]:
    """Name kfan as the coordinator (at its address, under the real id with ``cluster_ids``); return the real ones,
    learned on the way."""
    raw_type = request.get("key_type", 0)
    # Key types kfan routes by; others (share groups, KIP-932: 2) are answered
    # all the same, but kfan sends nothing to their coordinators to remember.
    key_type = KeyType(raw_type) if raw_type in KeyType._value2member_map_ else None
    learned: dict[Coordinator, int] = {}

    def fix(entry: Struct, key: str) -> Struct:
        e = dict(entry)
        if e["error_code"] == 0:
            if key_type is not None:
                learned[Coordinator(key_type, key)] = e["node_id"]
            if identity.cluster_ids:
                e.update(host=identity.host, port=identity.port_of(e["node_id"]))
            else:
                e.update(node_id=identity.node_id, host=identity.host, port=identity.port)
        else:
            e.update(node_id=-1, host="", port=-1)
        return e

    if "coordinators" in response:
        return {**response, "coordinators": [fix(c, c["key"]) for c in response["coordinators"]]}, learned
    return fix(response, request["key"]), learned


def rewrite_describe_cluster(identity: Identity, response: Struct, broker_base: Struct | None = None) -> Struct:
    out = dict(response)
    if identity.cluster_ids:
        out["brokers"] = _brokers_at_kfan(identity, response["brokers"], "broker_id")
        out["controller_id"] = _controller(response["controller_id"], response["brokers"], "broker_id")
        return out
    out["brokers"] = [_broker_entry(identity, broker_base, "broker_id")]
    out["controller_id"] = identity.node_id
    return out
