"""The sans-IO heart of kfan: from a client request frame to a routing plan,
and from broker answers to the client's response.

:func:`plan_request` decodes one client request (bounds-checked), decides
where it goes (routing table), and returns a :class:`Plan`: a local answer, or
sub-requests keyed by :data:`Target` plus a ``merge`` function that turns the
brokers' answers (or the error codes of failed ones) into the client's
response body and into hints for the I/O layer (stale topics, coordinators
learned or moved, a Metadata answer to fold into the topology).

Nothing here touches sockets, clocks or trio: the same code runs in the
proxy, in unit and property tests, and in the Spark replay job.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from backends.topology import Topology

from . import errors, partitioned, routing, schema
from .headers import RequestHeader, parse_request_header, response_body_offset
from .partitioned import Layout, TopicKey, TopicPartition
from .routing import Policy
from .schema import Struct, decode_body, encode_body, request_spec, response_spec
from .wire import Malformed, Parts


class Unsupported(Exception):
    """A request kfan does not serve: the connection is closed, as a broker does."""


@dataclass(frozen=True, slots=True)
class Identity:
    """kfan as its clients see it: one broker."""

    node_id: int
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class Coordinator:
    key_type: int  # 0 group, 1 transaction (FindCoordinator's key_type)
    key: str


class _AnyBroker:
    def __repr__(self) -> str:
        return "ANY"


ANY = _AnyBroker()
Target = int | Coordinator | _AnyBroker  # a broker id, a coordinator, or any live broker
Answer = memoryview | bytes | int  # a broker's response payload, or the error code of a failure


@dataclass(frozen=True, slots=True)
class SubRequest:
    """A request for one broker; the link adds api key/version and its own correlation id."""

    api_key: int
    api_version: int
    tail: Parts  # everything after the correlation id: client_id, header tags, body
    expect_response: bool


@dataclass(slots=True)
class Outcome:
    body: Parts
    metadata: Struct | None = None  # a Metadata answer, to fold into the topology
    stale_topics: set[TopicKey] = field(default_factory=set)
    coordinators: dict[Coordinator, int] = field(default_factory=dict)
    moved: set[Coordinator] = field(default_factory=set)


Merge = Callable[[Mapping[Target, Answer]], Outcome]


@dataclass(slots=True)
class Plan:
    header: RequestHeader
    expect_response: bool
    reply: Parts | None = None
    subs: dict[Target, SubRequest] = field(default_factory=dict)
    merge: Merge | None = None
    unknown_topics: set[TopicKey] = field(default_factory=set)  # named but not in the topology
    hold_ms: int = 0  # how long the request itself lets a broker hold it before answering


@dataclass(frozen=True, slots=True)
class Context:
    identity: Identity
    topology: Topology
    api_versions: Mapping[int, tuple[int, int]]  # what kfan advertises


# --- ApiVersions ------------------------------------------------------------


def advertised_versions(broker_versions: list[Mapping[int, tuple[int, int]]]) -> dict[int, tuple[int, int]]:
    """What kfan implements, intersected with what every backend broker supports."""
    out: dict[int, tuple[int, int]] = {}
    for api_key, policy in routing.ROUTES.items():
        known = schema.known_versions(api_key)
        if known is None:
            continue
        lo, hi = known.start, known.stop - 1
        if api_key in routing.VERSION_CAPS:
            clo, chi = routing.VERSION_CAPS[api_key]
            lo, hi = max(lo, clo), min(hi, chi)
        if policy is not Policy.LOCAL:
            for versions in broker_versions:
                if api_key not in versions:
                    lo, hi = 1, 0
                    break
                blo, bhi = versions[api_key]
                lo, hi = max(lo, blo), min(hi, bhi)
        if lo <= hi:
            out[api_key] = (lo, hi)
    return out


def api_versions_body(api_versions: Mapping[int, tuple[int, int]], version: int, error_code: int = 0) -> Parts:
    spec = response_spec(routing.API_VERSIONS, version)
    body = {
        "error_code": error_code,
        "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(api_versions.items())],
        "throttle_time": 0,
    }
    return encode_body(spec, body)


# --- planning ---------------------------------------------------------------


def plan_request(ctx: Context, payload: bytes | memoryview) -> Plan:
    """Decide what to do with one client request (a frame without its size prefix).

    Raises :class:`Malformed` for bytes that do not parse and
    :class:`Unsupported` for APIs or versions kfan does not advertise.
    """
    payload = memoryview(payload)
    hdr = parse_request_header(payload)
    if hdr.api_key == routing.API_VERSIONS:
        if not hdr.known or hdr.api_key not in ctx.api_versions or not _advertises(ctx, hdr):
            # A newer ApiVersions than ours: answer in v0 with the list, as a broker does.
            return Plan(hdr, True, reply=api_versions_body(ctx.api_versions, 0, errors.UNSUPPORTED_VERSION))
        return Plan(hdr, True, reply=api_versions_body(ctx.api_versions, hdr.api_version))
    if not hdr.known or not _advertises(ctx, hdr):
        raise Unsupported(f"api_key {hdr.api_key} version {hdr.api_version} is not served")
    spec = request_spec(hdr.api_key, hdr.api_version)
    # Brokers ignore bytes after a request body (librdkafka sends some with
    # Metadata v13); so do we. Whole-forwarded requests keep them.
    request = decode_body(spec, payload, hdr.body_offset, allow_trailing=True)
    policy = routing.ROUTES[hdr.api_key]
    if policy is Policy.LEADER:
        plan = _plan_partitioned(ctx, hdr, payload, request)
    elif policy is Policy.COORDINATOR:
        plan = _plan_coordinator(ctx, hdr, payload, request)
    else:
        plan = _plan_any(ctx, hdr, payload, request)
    plan.hold_ms = hold_ms(request)
    return plan


# Request fields by which a client lets the broker hold its request: Produce
# and admin "timeout", Fetch "max_wait", JoinGroup "rebalance_timeout" (a
# broker keeps a JoinGroup until every member rejoined, up to that long).
_HOLD_FIELDS = ("timeout", "max_wait", "rebalance_timeout")


def hold_ms(request: Struct) -> int:
    """The longest time ``request`` allows a broker to take, by its own fields."""
    return max((v for k in _HOLD_FIELDS if isinstance(v := request.get(k), int) and not isinstance(v, bool)), default=0)


def _advertises(ctx: Context, hdr: RequestHeader) -> bool:
    rng = ctx.api_versions.get(hdr.api_key)
    return rng is not None and rng[0] <= hdr.api_version <= rng[1]


def _whole(hdr: RequestHeader, payload: memoryview, expect_response: bool = True) -> SubRequest:
    """The client's own bytes; only the correlation id will change."""
    return SubRequest(hdr.api_key, hdr.api_version, [payload[8:]], expect_response)


def _reencoded(hdr: RequestHeader, payload: memoryview, request: Struct, expect_response: bool = True) -> SubRequest:
    tail: Parts = [payload[8 : hdr.body_offset]]
    tail.extend(encode_body(request_spec(hdr.api_key, hdr.api_version), request))
    return SubRequest(hdr.api_key, hdr.api_version, tail, expect_response)


def decode_answer(hdr: RequestHeader, answer: memoryview | bytes) -> Struct:
    spec = response_spec(hdr.api_key, hdr.api_version)
    return decode_body(spec, answer, response_body_offset(answer, hdr.api_key, hdr.api_version), allow_trailing=True)


def _passthrough_body(hdr: RequestHeader, answer: memoryview | bytes) -> Parts:
    return [memoryview(answer)[response_body_offset(answer, hdr.api_key, hdr.api_version) :]]


# --- split by leader ----------------------------------------------------------

# api_key -> ((request topics, partitions, index), (response topics, partitions, index))
_PARTITIONED: dict[int, tuple[tuple[str, str, str | None], tuple[str, str, str | None]]] = {
    routing.PRODUCE: (("topic_data", "partition_data", "index"), ("responses", "partition_responses", "index")),
    routing.FETCH: (("topics", "partitions", "partition"), ("responses", "partitions", "partition_index")),
    routing.LIST_OFFSETS: (("topics", "partitions", "partition_index"), ("topics", "partitions", "partition_index")),
    routing.OFFSET_FOR_LEADER_EPOCH: (("topics", "partitions", "partition"), ("topics", "partitions", "partition")),
    routing.DELETE_RECORDS: (("topics", "partitions", "partition_index"), ("topics", "partitions", "partition_index")),
}


@cache
def layouts(api_key: int, api_version: int) -> tuple[Layout, Layout]:
    req, resp = _PARTITIONED[api_key]
    return (
        Layout.of(request_spec(api_key, api_version), *req),
        Layout.of(response_spec(api_key, api_version), *resp),
    )


def topic_name(topology: Topology, key: TopicKey) -> str | None:
    return topology.topic_name(key) if isinstance(key, uuid.UUID) else key


def _plan_partitioned(ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    api_key = hdr.api_key
    topo = ctx.topology
    req_layout, resp_layout = layouts(api_key, hdr.api_version)
    expect = not (api_key == routing.PRODUCE and request["acks"] == 0)
    rewritten = False
    if api_key == routing.FETCH:
        if request.get("session_id", 0) != 0 and request.get("session_epoch", -1) > 0:
            # We never hand out fetch sessions (they are per broker and cannot
            # fan out), so an incremental fetch names a session we do not know.
            return Plan(hdr, True, reply=_fetch_session_error(hdr))
        rewritten = request.get("session_id", 0) != 0 or request.get("session_epoch", -1) != -1
        request = {**request, "session_id": 0, "session_epoch": -1, "forgotten_topics_data": []}

    def route(key: TopicKey, partition: int) -> int | None:
        name = topic_name(topo, key)
        return None if name is None else topo.leader(name, partition)

    subs, unroutable = partitioned.split(request, req_layout, route)
    unroutable_codes = {
        tp: errors.NOT_LEADER_OR_FOLLOWER
        if (name := topic_name(topo, tp[0])) is not None and topo.knows_topic(name)
        else (errors.UNKNOWN_TOPIC_ID if isinstance(tp[0], uuid.UUID) else errors.UNKNOWN_TOPIC_OR_PARTITION)
        for tp in unroutable
    }
    owner: dict[TopicPartition, Target] = {}
    for target, sub in subs.items():
        for tp in req_layout.keys(sub):
            owner[tp] = target
    plan_subs: dict[Target, SubRequest] = {}
    for target, sub in subs.items():
        if len(subs) == 1 and not unroutable and not rewritten:
            plan_subs[target] = _whole(hdr, payload, expect)
        else:
            plan_subs[target] = _reencoded(hdr, payload, sub, expect)

    def merge(answers: Mapping[Target, Answer]) -> Outcome:
        decoded: dict[Hashable, Struct] = {}
        failed: dict[Target, int] = {}
        for target, answer in answers.items():
            if isinstance(answer, int):
                failed[target] = answer
            else:
                decoded[target] = decode_answer(hdr, answer)

        def error_of(tp: TopicPartition) -> int:
            if tp in unroutable_codes:
                return unroutable_codes[tp]
            return failed.get(owner.get(tp, ANY), errors.NETWORK_EXCEPTION)

        topics = partitioned.merge(request, req_layout, decoded, resp_layout, error_of)
        body: Struct = dict(next(iter(decoded.values()))) if decoded else response_spec(api_key, hdr.api_version).blank()
        body[resp_layout.topics] = topics
        if "throttle_time" in body:
            body["throttle_time"] = max((d.get("throttle_time", 0) for d in decoded.values()), default=0)
        outcome = Outcome([])
        outcome.stale_topics.update(tp[0] for tp in unroutable)
        for target in failed:
            outcome.stale_topics.update(tp[0] for tp, owner_target in owner.items() if owner_target == target)
        _rewrite_partitions(ctx.identity, body, resp_layout, outcome)
        if api_key == routing.FETCH:
            _finish_fetch(body, request, resp_layout, decoded)
        outcome.body = encode_body(response_spec(api_key, hdr.api_version), body)
        return outcome

    unknown = {tp[0] for tp, code in unroutable_codes.items() if code != errors.NOT_LEADER_OR_FOLLOWER}
    if not plan_subs:
        # Nothing routable: answer at once with per-partition errors.
        return Plan(hdr, expect, reply=merge({}).body if expect else [], unknown_topics=unknown)
    return Plan(hdr, expect, subs=plan_subs, merge=merge, unknown_topics=unknown)


def _rewrite_partitions(identity: Identity, body: Struct, layout: Layout, outcome: Outcome) -> None:
    """Hide broker identity in partition entries; note leadership errors."""
    leaders_named = False
    for t in body[layout.topics]:
        for p in t[layout.partitions]:
            if not isinstance(p, dict):
                continue
            code = p.get("error_code", 0)
            if code in errors.LEADERSHIP:
                outcome.stale_topics.add(t[layout.topic_key])
            if "preferred_read_replica" in p:
                p["preferred_read_replica"] = -1
            cl = p.get("current_leader")
            if cl is not None and cl.get("leader_id", -1) >= 0:
                p["current_leader"] = {**cl, "leader_id": identity.node_id}
                leaders_named = True
    if "node_endpoints" in body or leaders_named:
        if leaders_named:
            body["node_endpoints"] = [{"node_id": identity.node_id, "host": identity.host, "port": identity.port, "rack": None}]
        else:
            body.pop("node_endpoints", None)


def _finish_fetch(body: Struct, request: Struct, layout: Layout, decoded: Mapping[Hashable, Struct]) -> None:
    body["session_id"] = 0
    body["error_code"] = next((d["error_code"] for d in decoded.values() if d.get("error_code")), 0)
    # The merged response honours the client's budget, not N brokers' budgets.
    # Records beyond it are dropped whole; the consumer fetches them next time
    # from the same offset. The first non-empty partition always goes (KIP-74).
    budget = request["max_bytes"]
    used = 0
    for t in body[layout.topics]:
        for p in t[layout.partitions]:
            records = p.get("records")
            if not records:
                continue
            n = len(records)
            if used and used + n > budget:
                p["records"] = b""
            else:
                used += n


def _fetch_session_error(hdr: RequestHeader) -> Parts:
    spec = response_spec(hdr.api_key, hdr.api_version)
    body = spec.blank()
    body.update(error_code=errors.FETCH_SESSION_ID_NOT_FOUND, session_id=0, responses=[])
    return encode_body(spec, body)


# --- coordinator-routed -------------------------------------------------------

_GROUP_KEYED = {
    routing.JOIN_GROUP,
    routing.SYNC_GROUP,
    routing.HEARTBEAT,
    routing.LEAVE_GROUP,
    routing.OFFSET_COMMIT,
    routing.OFFSET_DELETE,
    routing.TXN_OFFSET_COMMIT,
    routing.CONSUMER_GROUP_HEARTBEAT,
}


def coordinators_of(api_key: int, request: Struct) -> list[Coordinator] | None:
    """The coordinator(s) a request belongs to; None means any broker will do."""
    if api_key in _GROUP_KEYED:
        return [Coordinator(0, request["group_id"])]
    if api_key == routing.OFFSET_FETCH:
        if "groups" in request:
            return [Coordinator(0, g["group_id"]) for g in request["groups"]]
        return [Coordinator(0, request["group_id"])]
    if api_key == routing.INIT_PRODUCER_ID:
        txn = request.get("transactional_id")
        return None if txn is None else [Coordinator(1, txn)]
    if api_key == routing.ADD_PARTITIONS_TO_TXN:
        return [Coordinator(1, request["v3_and_below_transactional_id"])]
    return [Coordinator(1, request["transactional_id"])]


def _plan_coordinator(ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    keys = coordinators_of(hdr.api_key, request)
    if keys is None:
        return _plan_any(ctx, hdr, payload, request)
    if len(set(keys)) > 1:
        return _plan_offset_fetch_groups(ctx, hdr, payload, request, keys)
    target = keys[0]

    def merge(answers: Mapping[Target, Answer]) -> Outcome:
        answer = answers[target]
        if isinstance(answer, int):
            return Outcome(_error_body(hdr, errors.NOT_COORDINATOR), moved={target})
        decoded = decode_answer(hdr, answer)
        moved = {target} if any(c in errors.COORDINATOR_MOVED for c in _error_codes(decoded)) else set()
        return Outcome(_passthrough_body(hdr, answer), moved=moved)

    return Plan(hdr, True, subs={target: _whole(hdr, payload)}, merge=merge)


def _plan_offset_fetch_groups(ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct, keys: list[Coordinator]) -> Plan:
    """OffsetFetch v8+ naming several groups: one sub-request per group, merged in order."""
    subs: dict[Target, SubRequest] = {}
    for key in keys:
        if key not in subs:
            subs[key] = _reencoded(hdr, payload, {**request, "groups": [x for x in request["groups"] if x["group_id"] == key.key]})
    group_spec = response_spec(hdr.api_key, hdr.api_version).field("groups").struct
    assert group_spec is not None

    def merge(answers: Mapping[Target, Answer]) -> Outcome:
        by_group: dict[str, Struct] = {}
        throttle = 0
        moved: set[Coordinator] = set()
        for key, answer in answers.items():
            assert isinstance(key, Coordinator)
            if isinstance(answer, int):
                moved.add(key)
                continue
            d = decode_answer(hdr, answer)
            throttle = max(throttle, d["throttle_time"])
            for g in d["groups"]:
                by_group.setdefault(g["group_id"], g)
                if g["error_code"] in errors.COORDINATOR_MOVED:
                    moved.add(key)
        groups = []
        for g in request["groups"]:
            entry = by_group.get(g["group_id"])
            if entry is None:
                entry = {**group_spec.blank(), "group_id": g["group_id"], "error_code": errors.NOT_COORDINATOR}
            groups.append(entry)
        body = encode_body(response_spec(hdr.api_key, hdr.api_version), {"throttle_time": throttle, "groups": groups})
        return Outcome(body, moved=moved)

    return Plan(hdr, True, subs=subs, merge=merge)


def _error_codes(value: Any) -> list[int]:
    out: list[int] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if k.endswith("error_code") and isinstance(v, int):
                out.append(v)
            elif isinstance(v, (dict, list)):
                out.extend(_error_codes(v))
    elif isinstance(value, list):
        for v in value:
            if isinstance(v, (dict, list)):
                out.extend(_error_codes(v))
    return out


def _error_body(hdr: RequestHeader, code: int) -> Parts:
    """A response carrying ``code`` at top level, for APIs that have one."""
    spec = response_spec(hdr.api_key, hdr.api_version)
    if not spec.has("error_code"):
        raise BrokerUnavailable(f"api_key {hdr.api_key} has no top-level error code to report {code}")
    body = spec.blank()
    body["error_code"] = code
    return encode_body(spec, body)


class BrokerUnavailable(Exception):
    """A broker failure that no error code in the response can express: close the client connection."""


# --- any broker ------------------------------------------------------------------


def _plan_any(ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    identity = ctx.identity

    def merge(answers: Mapping[Target, Answer]) -> Outcome:
        answer = answers[ANY]
        if isinstance(answer, int):
            return Outcome(_error_body(hdr, answer))
        if hdr.api_key == routing.METADATA:
            decoded = decode_answer(hdr, answer)
            body = rewrite_metadata(identity, decoded)
            return Outcome(encode_body(response_spec(hdr.api_key, hdr.api_version), body), metadata=decoded)
        if hdr.api_key == routing.FIND_COORDINATOR:
            decoded = decode_answer(hdr, answer)
            body, learned = rewrite_find_coordinator(identity, request, decoded)
            return Outcome(encode_body(response_spec(hdr.api_key, hdr.api_version), body), coordinators=learned)
        if hdr.api_key == routing.DESCRIBE_CLUSTER:
            body = rewrite_describe_cluster(identity, decode_answer(hdr, answer))
            return Outcome(encode_body(response_spec(hdr.api_key, hdr.api_version), body))
        return Outcome(_passthrough_body(hdr, answer))

    return Plan(hdr, True, subs={ANY: _whole(hdr, payload)}, merge=merge)


# --- identity rewriting -------------------------------------------------------------


def _broker_entry(identity: Identity, id_field: str = "node_id") -> Struct:
    return {id_field: identity.node_id, "host": identity.host, "port": identity.port, "rack": None}


def rewrite_metadata(identity: Identity, response: Struct) -> Struct:
    """kfan as the only broker: every leader, replica and controller is kfan."""
    node = identity.node_id
    out = dict(response)
    out["brokers"] = [_broker_entry(identity)]
    if "controller_id" in out:
        out["controller_id"] = node
    topics = []
    for t in response["topics"]:
        partitions = []
        for p in t["partitions"]:
            q = dict(p)
            if q["leader_id"] >= 0:
                q["leader_id"] = node
            for name in ("replica_nodes", "isr_nodes", "offline_replicas"):
                if name in q:
                    # Keep the count (it is the replication factor tools show).
                    q[name] = [node] * len(q[name])
            partitions.append(q)
        topics.append({**t, "partitions": partitions})
    out["topics"] = topics
    return out


def rewrite_find_coordinator(identity: Identity, request: Struct, response: Struct) -> tuple[Struct, dict[Coordinator, int]]:
    """Name kfan as the coordinator; return the real ones, learned on the way."""
    key_type = request.get("key_type", 0)
    learned: dict[Coordinator, int] = {}

    def fix(entry: Struct, key: str) -> Struct:
        e = dict(entry)
        if e["error_code"] == 0:
            learned[Coordinator(key_type, key)] = e["node_id"]
            e.update(node_id=identity.node_id, host=identity.host, port=identity.port)
        else:
            e.update(node_id=-1, host="", port=-1)
        return e

    if "coordinators" in response:
        return {**response, "coordinators": [fix(c, c["key"]) for c in response["coordinators"]]}, learned
    return fix(response, request["key"]), learned


def rewrite_describe_cluster(identity: Identity, response: Struct) -> Struct:
    out = dict(response)
    out["brokers"] = [_broker_entry(identity, "broker_id")]
    out["controller_id"] = identity.node_id
    return out


_KEY_VERSION = struct.Struct(">hh")


def request_head(sub: SubRequest) -> bytes:
    return _KEY_VERSION.pack(sub.api_key, sub.api_version)


__all__ = [
    "ANY",
    "Answer",
    "BrokerUnavailable",
    "Context",
    "Coordinator",
    "Identity",
    "Malformed",
    "Outcome",
    "Plan",
    "SubRequest",
    "Target",
    "Unsupported",
    "plan_request",
]
