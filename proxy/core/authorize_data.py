"""What Kafka checks for the APIs of producers, consumers and groups, and how it answers a denial.

One function per API (or family), filling in a :class:`~.authorize.Verdict`;
:data:`CHECKS` maps API keys to them. Each follows what a Kafka 4 broker does
(``KafkaApis``): the same checks in the same order, the same error codes in
the same places; where a broker decides by a topic's existence, kfan's
topology decides (and is refreshed first when it does not know the topic).
The admin APIs are :mod:`.authorize_admin`'s.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from ..kafka import apis, errors
from ..kafka.headers import RequestHeader
from ..kafka.records import first_batch_transactional
from ..kafka.schema import Struct, response_spec
from . import leader
from .acls import Operation, ResourceType
from .authorize import NOT_REQUESTED, Judge, Strip, Verdict, array_spec, blank_response, mirrored, mirrored_reply, response_body
from .plan import Context, Route
from .topology import Topology

Check = Callable[[Verdict, Route[Any], Context, RequestHeader, Struct], None]
TOPIC, GROUP, TXN = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
READ, WRITE, DESCRIBE, CREATE, DELETE = Operation.READ, Operation.WRITE, Operation.DESCRIBE, Operation.CREATE, Operation.DELETE
TAF, GAF, CAF, TXAF = (
    errors.TOPIC_AUTHORIZATION_FAILED,
    errors.GROUP_AUTHORIZATION_FAILED,
    errors.CLUSTER_AUTHORIZATION_FAILED,
    errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
)
ZERO_ID = uuid.UUID(int=0)
# Kafka's internal topics: AddPartitionsToTxn never lets a transaction write them, for anyone.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


def topic_of(entry: Struct, topology: Topology) -> str | None:
    """The topic a request entry names, by name or by a topic id kfan knows; None: neither."""
    for key in ("name", "topic", "topic_name"):
        if isinstance(name := entry.get(key), str):
            return name
    tid = entry.get("topic_id")
    return topology.topic_name(tid) if isinstance(tid, uuid.UUID) and tid.int else None


def top_level(v: Verdict, hdr: RequestHeader, code: int, **fields: Any) -> None:
    """The whole request answered with ``code`` in the response's top-level error code."""
    v.reply = response_body(hdr, blank_response(hdr, error_code=code, **fields))


# --- split by leader -----------------------------------------------------------------------------------


def _refuse_partitions(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct, op: Operation) -> None:
    """Each partition of a topic the client may not ``op`` is answered TOPIC_AUTHORIZATION_FAILED in place; a topic
    id kfan does not know is left to the split (UNKNOWN_TOPIC_ID, before any check, as a broker does)."""
    layout = leader.layouts_of(route, hdr.api_version)[0]
    for key, p in layout.entries(request):
        name = leader.topic_name(ctx.topology, key)
        if name is not None and not v.judge.allows(op, TOPIC, name):
            v.refused[(key, layout.partition_index(p))] = TAF


def _refuse_all(v: Verdict, route: Route[Any], hdr: RequestHeader, request: Struct, code: int) -> None:
    layout = leader.layouts_of(route, hdr.api_version)[0]
    for key, p in layout.entries(request):
        v.refused[(key, layout.partition_index(p))] = code


def produce(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    layout = leader.layouts_of(route, hdr.api_version)[0]
    if any(first_batch_transactional(p.get("records")) for _, p in layout.entries(request)):
        txn = request.get("transactional_id")
        if txn is None or not v.judge.allows(WRITE, TXN, txn):
            _refuse_all(v, route, hdr, request, TXAF)
    if not v.refused:
        _refuse_partitions(v, route, ctx, hdr, request, WRITE)
    if v.refused and request["acks"] == 0:
        v.close = "unauthorized"  # no answer to carry the error: a broker closes the connection


def fetch(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    replica = request.get("replica_id", -1) if "replica_state" not in request else request["replica_state"]["replica_id"]
    if replica >= 0:  # a follower's fetch
        if not v.judge.cluster(Operation.CLUSTER_ACTION):
            _refuse_all(v, route, hdr, request, TAF)
        return
    _refuse_partitions(v, route, ctx, hdr, request, READ)


def _topics_by(op: Operation) -> Check:
    def check(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
        _refuse_partitions(v, route, ctx, hdr, request, op)

    return check


def offset_for_leader_epoch(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    if not v.judge.cluster_shortcut(Operation.CLUSTER_ACTION):
        _refuse_partitions(v, route, ctx, hdr, request, DESCRIBE)
    else:
        layout = leader.layouts_of(route, hdr.api_version)[0]
        v.judge.covered(DESCRIBE, TOPIC, (leader.topic_name(ctx.topology, key) for key, _ in layout.entries(request)))


# --- metadata ------------------------------------------------------------------------------------------


def metadata(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    topics = request.get("topics")
    listing = topics is None or (hdr.api_version == 0 and not topics)
    judge = v.judge
    if not listing:
        assert topics is not None
        spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "topics")
        create = request.get("allow_auto_topic_creation", True) and ctx.auto_create_topics
        answers: dict[int, Any] = {}
        for i, t in enumerate(topics):
            tid, name = t.get("topic_id"), t.get("name")
            if isinstance(tid, uuid.UUID) and tid.int:
                if hdr.api_version < 12:
                    continue  # ids are looked up from v12: the broker refuses the request (INVALID_REQUEST)
                known = ctx.topology.topic_name(tid)
                if known is not None and not judge.allows(DESCRIBE, TOPIC, known):
                    # Topic ids are not secret (Kafka returns the id asked for); the name is.
                    answers[i] = mirrored(spec, {}, TAF, name=None, topic_id=tid, partitions=[])
                continue  # an unknown id: UNKNOWN_TOPIC_ID from the broker
            if name is None:
                continue  # the broker refuses it (INVALID_REQUEST)
            if not judge.allows(DESCRIBE, TOPIC, name):
                answers[i] = mirrored(spec, {}, TAF, name=name, topic_id=ZERO_ID, partitions=[])
            elif (
                create and not ctx.topology.knows_topic(name) and not (judge.cluster_shortcut(CREATE) or judge.allows(CREATE, TOPIC, name))
            ):
                # Auto-created only with CREATE (kfan's own principal may create anything).
                v.unknown_topics.add(name)
                answers[i] = mirrored(spec, {}, TAF, name=name, topic_id=ZERO_ID, partitions=[], is_internal=name in INTERNAL_TOPICS)
        if answers:
            v.strips.append(Strip("topics", "topics", answers, forward_empty=True))
    if listing or request.get("include_topic_authorized_operations") or request.get("include_cluster_authorized_operations"):
        v.amend.append(partial(_metadata_answer, judge, hdr, request, listing))  # else the answer stays undecoded


def _metadata_answer(judge: Judge, hdr: RequestHeader, request: Struct, listing: bool, body: Struct) -> Struct:
    topics = body["topics"]
    if listing:  # the client is shown the topics it may describe, silently
        topics = [t for t in topics if t.get("name") is None or judge.quietly(DESCRIBE, TOPIC, t["name"])]
    if request.get("include_topic_authorized_operations"):
        for t in topics:
            if t["error_code"] not in (TAF, errors.UNKNOWN_TOPIC_ID) and t.get("name") is not None:
                t["topic_authorized_operations"] = judge.operations(TOPIC, t["name"])
    body["topics"] = topics
    if request.get("include_cluster_authorized_operations") and "cluster_authorized_operations" in body:
        body["cluster_authorized_operations"] = judge.operations(ResourceType.CLUSTER) if judge.cluster(DESCRIBE) else 0
    return body


def describe_topic_partitions(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    judge = v.judge
    topics = request["topics"]
    if topics:
        spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "topics")
        answers = {
            i: mirrored(spec, t, TAF, topic_id=ZERO_ID, partitions=[])
            for i, t in enumerate(topics)
            if not judge.allows(DESCRIBE, TOPIC, t["name"])
        }
        if answers:
            v.strips.append(Strip("topics", "topics", answers))

    def answer(body: Struct) -> Struct:
        kept = []
        for t in body["topics"]:
            if not topics and not judge.quietly(DESCRIBE, TOPIC, t["name"]):
                continue
            if t["error_code"] != TAF:
                t["topic_authorized_operations"] = judge.operations(TOPIC, t["name"])
            kept.append(t)
        body["topics"] = kept
        return body

    v.amend.append(answer)


# --- coordinators, groups and offsets --------------------------------------------------------------------


def find_coordinator(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    key_type = request.get("key_type", 0)
    if key_type == 2:  # a share coordinator: the brokers' own business
        if hdr.api_version < 6:
            return  # Kafka answers INVALID_REQUEST before it authorizes anything (and v0-3 have no coordinators array)
        if not v.judge.cluster(Operation.CLUSTER_ACTION):
            keys = request.get("coordinator_keys") or []
            spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "coordinators")
            v.strips.append(Strip("coordinator_keys", "coordinators", {i: _no_coordinator(spec, k, CAF) for i, k in enumerate(keys)}))
        return
    resource, code = (GROUP, GAF) if key_type == 0 else (TXN, TXAF)
    if hdr.api_version < 4:
        if not v.judge.allows(DESCRIBE, resource, request["key"]):
            top_level(v, hdr, code, node_id=-1, host="", port=-1)
        return
    spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "coordinators")
    denied = {
        i: _no_coordinator(spec, k, code) for i, k in enumerate(request["coordinator_keys"]) if not v.judge.allows(DESCRIBE, resource, k)
    }
    if denied:
        v.strips.append(Strip("coordinator_keys", "coordinators", denied))


def _no_coordinator(spec: Any, key: str, code: int) -> Struct:
    return mirrored(spec, key, code, key="key", node_id=-1, host="", port=-1)


def group_member(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    """JoinGroup, SyncGroup, Heartbeat, LeaveGroup: READ on the group."""
    if hdr.api_key == apis.SYNC_GROUP and hdr.api_version >= 5 and (request["protocol_type"] is None or request["protocol_name"] is None):
        return  # INCONSISTENT_GROUP_PROTOCOL comes first, from the broker
    if not v.judge.allows(READ, GROUP, request["group_id"]):
        extra = {"generation_id": -1} if hdr.api_key == apis.JOIN_GROUP else {}
        top_level(v, hdr, GAF, **extra)


def offset_commit(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    """OffsetCommit, TxnOffsetCommit: WRITE on the transactional id, READ on the group, READ on each topic."""
    txn = request.get("transactional_id")
    if txn is not None and not v.judge.allows(WRITE, TXN, txn):
        v.reply = mirrored_reply(hdr, request, TXAF)
    elif not v.judge.allows(READ, GROUP, request["group_id"]):
        v.reply = mirrored_reply(hdr, request, GAF)
    else:
        _strip_topics(v, ctx, hdr, request, READ, "topics")  # nothing left: answered without the coordinator


def _strip_topics(
    v: Verdict, ctx: Context, hdr: RequestHeader, request: Struct, op: Operation, response_array: str, forward_empty: bool = False
) -> None:
    """Topic entries the client may not ``op`` answered by kfan: the entry mirrored, every error code TAF."""
    spec = array_spec(response_spec(hdr.api_key, hdr.api_version), response_array)
    answers = {}
    for i, t in enumerate(request["topics"] or []):
        name = topic_of(t, ctx.topology)
        if name is not None and not v.judge.allows(op, TOPIC, name):
            answers[i] = mirrored(spec, t, TAF)
    if answers:
        v.strips.append(Strip("topics", response_array, answers, forward_empty=forward_empty))


def offset_fetch(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    judge = v.judge
    spec = response_spec(hdr.api_key, hdr.api_version)
    if hdr.api_version < 8:
        topics = request.get("topics")
        if not judge.allows(DESCRIBE, GROUP, request["group_id"]):
            if hdr.api_version >= 2:
                top_level(v, hdr, GAF)
            else:  # no top-level error code: each partition asked for carries it
                entries = [_unread_topic(array_spec(spec, "topics"), t, GAF) for t in topics or []]
                v.reply = response_body(hdr, blank_response(hdr, topics=entries))
            return
        if topics is None:
            v.amend.append(partial(_described_offsets, judge, ctx.topology, None))
        else:
            answers = {i: _unread_topic(array_spec(spec, "topics"), t, TAF) for i, t in enumerate(topics) if _denied_topic(judge, ctx, t)}
            if answers:
                v.strips.append(Strip("topics", "topics", answers))
        return
    group_spec = array_spec(spec, "groups")
    topic_spec = array_spec(spec, "groups", "topics")
    denied_groups: dict[int, Any] = {}
    every_topic: set[str] = set()  # groups asked for all their topics: filtered in one pass over the answer
    for gi, g in enumerate(request["groups"]):
        if not judge.allows(DESCRIBE, GROUP, g["group_id"]):
            denied_groups[gi] = mirrored(group_spec, {}, GAF, group_id=g["group_id"], topics=[])
        elif g["topics"] is None:
            every_topic.add(g["group_id"])
        else:
            answers = {i: _unread_topic(topic_spec, t, TAF) for i, t in enumerate(g["topics"]) if _denied_topic(judge, ctx, t)}
            if answers:
                v.strips.append(
                    Strip(
                        "topics",
                        "topics",
                        answers,
                        within=(("groups", gi),),
                        response_within=(("groups", "group_id", g["group_id"]),),
                        forward_empty=True,
                    )
                )
    if denied_groups:
        v.strips.append(Strip("groups", "groups", denied_groups))
    if every_topic:
        v.amend.append(partial(_described_offsets, judge, ctx.topology, every_topic))


def _denied_topic(judge: Judge, ctx: Context, t: Struct) -> bool:
    name = topic_of(t, ctx.topology)
    return name is not None and not judge.allows(DESCRIBE, TOPIC, name)


def _unread_topic(spec: Any, t: Struct, code: int) -> Struct:
    """An OffsetFetch topic entry answering every partition asked for with ``code`` and no offset."""
    part_spec = spec.field("partitions").struct
    partitions = []
    for index in t.get("partition_indexes") or []:
        p = part_spec.blank()
        p.update(partition_index=index, committed_offset=-1, metadata="", error_code=code)
        if "committed_leader_epoch" in p:
            p["committed_leader_epoch"] = -1
        partitions.append(p)
    return mirrored(spec, t, code, partitions=partitions)


def _described_offsets(judge: Judge, topology: Topology, groups: set[str] | None, body: Struct) -> Struct:
    """All of a group's committed offsets asked for (``groups``; None: the request's one group, before v8): only
    those of topics the client may describe."""
    holders = [body] if groups is None else [g for g in body["groups"] if g["group_id"] in groups]
    for holder in holders:
        holder["topics"] = [t for t in holder["topics"] if (name := topic_of(t, topology)) is None or judge.quietly(DESCRIBE, TOPIC, name)]
    return body


def describe_groups(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    judge = v.judge
    spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "groups")
    answers = {
        i: mirrored(
            spec,
            g,
            GAF,
            key="group_id",
            group_state="",
            protocol_type="",
            protocol_data="",
            members=[],
            authorized_operations=NOT_REQUESTED,
        )
        for i, g in enumerate(request["groups"])
        if not judge.allows(DESCRIBE, GROUP, g)
    }
    if answers:
        v.strips.append(Strip("groups", "groups", answers))
    if request.get("include_authorized_operations"):
        v.amend.append(partial(_group_operations, judge))


def _group_operations(judge: Judge, body: Struct) -> Struct:
    for g in body["groups"]:
        if g["error_code"] == 0:
            g["authorized_operations"] = judge.operations(GROUP, g["group_id"])
    return body


def list_groups(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    judge = v.judge
    if not judge.cluster_shortcut(DESCRIBE):

        def listed(body: Struct) -> Struct:
            body["groups"] = [g for g in body["groups"] if judge.quietly(DESCRIBE, GROUP, g["group_id"])]
            return body

        v.amend.append(listed)


def delete_groups(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "results")
    answers = {
        i: mirrored(spec, g, GAF, key="group_id") for i, g in enumerate(request["groups_names"]) if not v.judge.allows(DELETE, GROUP, g)
    }
    if answers:
        v.strips.append(Strip("groups_names", "results", answers))


def offset_delete(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    if not v.judge.allows(DELETE, GROUP, request["group_id"]):
        top_level(v, hdr, GAF)
    else:  # the coordinator is asked even with no topic left (it reports the group's own errors)
        _strip_topics(v, ctx, hdr, request, READ, "topics", forward_empty=True)
        v.amend.append(group_error_alone)


def group_error_alone(body: Struct) -> Struct:
    """An error for the whole group is all a broker answers: the partitions' own are lost with it."""
    if body.get("error_code"):
        body["topics" if "topics" in body else "responses"] = []
    return body


def _subscribed(v: Verdict, hdr: RequestHeader, topics: Iterable[str]) -> None:
    """A heartbeat naming topics the client may not describe: TOPIC_AUTHORIZATION_FAILED for the whole request."""
    denied = [t for t in dict.fromkeys(topics) if not v.judge.allows(DESCRIBE, TOPIC, t)]
    if denied:
        top_level(v, hdr, TAF)


def group_heartbeat(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    """ConsumerGroupHeartbeat, ShareGroupHeartbeat, StreamsGroupHeartbeat: READ on the group, then DESCRIBE on the
    topics subscribed to (a streams topology's every topic)."""
    if not v.judge.allows(READ, GROUP, request["group_id"]):
        top_level(v, hdr, GAF)
        return
    if hdr.api_key == apis.STREAMS_GROUP_HEARTBEAT:
        _subscribed(v, hdr, _topology_topics(request.get("topology")))
    else:
        _subscribed(v, hdr, request.get("subscribed_topic_names") or [])


def _topology_topics(topology: Struct | None) -> list[str]:
    names: list[str] = []
    for s in (topology or {}).get("subtopologies") or []:
        names.extend(s.get("source_topics") or [])
        names.extend(s.get("repartition_sink_topics") or [])
        names.extend(t["name"] for t in s.get("repartition_source_topics") or [])
        names.extend(t["name"] for t in s.get("state_changelog_topics") or [])
    return names


def group_describe(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    """Consumer, share and streams groups described: DESCRIBE on each group, then on every topic it uses (a group
    using one the client may not describe is answered TOPIC_AUTHORIZATION_FAILED whole)."""
    judge = v.judge
    spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "groups")
    answers = {
        i: mirrored(spec, g, GAF, key="group_id", authorized_operations=NOT_REQUESTED)
        for i, g in enumerate(request["group_ids"])
        if not judge.allows(DESCRIBE, GROUP, g)
    }
    if answers:
        v.strips.append(Strip("group_ids", "groups", answers))
    v.amend.append(partial(_described_groups, judge, hdr, spec, bool(request.get("include_authorized_operations"))))


def _group_topics(hdr: RequestHeader, group: Struct) -> list[str]:
    if hdr.api_key == apis.STREAMS_GROUP_DESCRIBE:
        return _topology_topics(group.get("topology"))
    names = []
    for m in group.get("members") or []:
        for which in ("assignment", "target_assignment"):
            for tp in ((m.get(which) or {}).get("topic_partitions")) or []:
                names.append(tp["topic_name"])
    return names


def _described_groups(judge: Judge, hdr: RequestHeader, spec: Any, operations: bool, body: Struct) -> Struct:
    out = []
    for g in body["groups"]:
        if g["error_code"] == 0 and any(not judge.allows(DESCRIBE, TOPIC, t) for t in dict.fromkeys(_group_topics(hdr, g))):
            g = mirrored(spec, {}, TAF, group_id=g["group_id"], authorized_operations=NOT_REQUESTED)
            g["error_message"] = "The group has described topic(s) that the client is not authorized to describe."
            if "topology" in g:
                g["topology"] = None
        elif operations and g["error_code"] == 0:
            g["authorized_operations"] = judge.operations(GROUP, g["group_id"])
        out.append(g)
    body["groups"] = out
    return body


CHECKS: dict[int, Check] = {
    apis.PRODUCE: produce,
    apis.FETCH: fetch,
    apis.LIST_OFFSETS: _topics_by(DESCRIBE),
    apis.OFFSET_FOR_LEADER_EPOCH: offset_for_leader_epoch,
    apis.DELETE_RECORDS: _topics_by(DELETE),
    apis.DESCRIBE_PRODUCERS: _topics_by(READ),
    apis.METADATA: metadata,
    apis.DESCRIBE_TOPIC_PARTITIONS: describe_topic_partitions,
    apis.FIND_COORDINATOR: find_coordinator,
    apis.JOIN_GROUP: group_member,
    apis.SYNC_GROUP: group_member,
    apis.HEARTBEAT: group_member,
    apis.LEAVE_GROUP: group_member,
    apis.OFFSET_COMMIT: offset_commit,
    apis.TXN_OFFSET_COMMIT: offset_commit,
    apis.OFFSET_FETCH: offset_fetch,
    apis.OFFSET_DELETE: offset_delete,
    apis.DESCRIBE_GROUPS: describe_groups,
    apis.LIST_GROUPS: list_groups,
    apis.DELETE_GROUPS: delete_groups,
    apis.CONSUMER_GROUP_HEARTBEAT: group_heartbeat,
    apis.SHARE_GROUP_HEARTBEAT: group_heartbeat,
    apis.STREAMS_GROUP_HEARTBEAT: group_heartbeat,
    apis.CONSUMER_GROUP_DESCRIBE: group_describe,
    apis.SHARE_GROUP_DESCRIBE: group_describe,
    apis.STREAMS_GROUP_DESCRIBE: group_describe,
}
