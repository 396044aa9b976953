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
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol

from backends.topology import Topology

from . import partitioned, routing
from .kafka import apis, errors, schema
from .kafka.headers import RequestHeader, parse_request_header, response_body_offset
from .kafka.schema import Struct, decode_body, decode_body_costed, encode_body, request_spec, response_spec
from .kafka.wire import Malformed, Parts
from .partitioned import Layout, TopicKey, TopicPartition
from .routing import Policy


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
    refresh: bool = False  # the request changed topics or leaders: refresh the topology
    errors: dict[tuple[int, int], int] = field(default_factory=dict)  # (error code, broker) -> partitions answering it
    fetch_marks: dict[TopicPartition, Marks] = field(default_factory=dict)  # a Fetch: each answered partition's marks
    broker_failed: bool = False  # the one broker asked failed or answered undecodably: another may answer


# A partition's offsets as its leader last reported them in a Fetch answer:
# high watermark, last stable offset, log start offset.
Marks = tuple[int, int, int]
_MARKS = ("high_watermark", "last_stable_offset", "log_start_offset")


class Merge(Protocol):
    def __call__(self, answers: Mapping[Target, Answer], marks: Mapping[TopicPartition, Marks] = ..., /) -> Outcome: ...


@dataclass(slots=True)
class Plan:
    header: RequestHeader
    expect_response: bool
    reply: Parts | None = None
    subs: dict[Target, SubRequest] = field(default_factory=dict)
    merge: Merge | None = None
    unknown_topics: set[TopicKey] = field(default_factory=set)  # named but not in the topology
    unknown_coordinators: set[Coordinator] = field(default_factory=set)  # look these up, then plan again
    reply_errors: dict[tuple[int, int], int] = field(default_factory=dict)  # a local reply's errors, as Outcome.errors
    hold_ms: int = 0  # how long the request itself lets a broker hold it before answering
    cost: int = 0  # memory the request holds while in flight: its frame plus its decoded form (estimated)
    fetch_min_bytes: int | None = None  # a Fetch: answer once this much data (or an error) is in
    fetch_keys: dict[Target, Hashable] = field(default_factory=dict)  # per sub-fetch, what it asks, order aside
    fetch_partitions: dict[Target, frozenset[TopicPartition]] = field(default_factory=dict)  # per sub-fetch, its partitions


def _no_coordinator(c: Coordinator) -> int | None:
    return None


@dataclass(frozen=True, slots=True)
class Context:
    identity: Identity
    topology: Topology
    api_versions: Mapping[int, tuple[int, int]]  # what kfan advertises
    # The broker coordinating a group or transaction, when known (the I/O layer's cache).
    coordinator_of: Callable[[Coordinator], int | None] = _no_coordinator
    # The I/O layer has already looked up this request's unknown coordinators.
    coordinators_looked_up: bool = False


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
    spec = response_spec(apis.API_VERSIONS, version)
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
    if hdr.api_key == apis.API_VERSIONS:
        if not hdr.known or hdr.api_key not in ctx.api_versions or not _advertises(ctx, hdr):
            # A newer ApiVersions than ours: answer in v0 with the list, as a broker does.
            return Plan(hdr, True, reply=api_versions_body(ctx.api_versions, 0, errors.UNSUPPORTED_VERSION))
        return Plan(hdr, True, reply=api_versions_body(ctx.api_versions, hdr.api_version))
    if not hdr.known or not _advertises(ctx, hdr):
        raise Unsupported(f"api_key {hdr.api_key} version {hdr.api_version} is not served")
    spec = request_spec(hdr.api_key, hdr.api_version)
    # Brokers ignore bytes after a request body (librdkafka sends some with
    # Metadata v13); so do we. Whole-forwarded requests keep them.
    request, decoded_cost = decode_body_costed(spec, payload, hdr.body_offset, allow_trailing=True, max_cost=decode_allowance(len(payload)))
    policy = routing.ROUTES[hdr.api_key]
    if policy is Policy.LEADER:
        plan = _plan_partitioned(ctx, hdr, payload, request)
    elif policy is Policy.COORDINATOR:
        plan = _plan_coordinator(ctx, hdr, payload, request)
    elif policy is Policy.EVERY_BROKER:
        plan = _plan_every_broker(ctx, hdr, payload)
    else:
        plan = _plan_any(ctx, hdr, payload, request)
    plan.hold_ms = hold_ms(request)
    plan.cost = len(payload) + decoded_cost
    return plan


# A decoded request may take this many times its frame's bytes (or the floor):
# honest requests stay well under it (a Fetch partition is 33 bytes on the
# wire and ~400 decoded), while a frame of a million empty entries, which no
# client sends, is refused as malformed instead of costing 160 times its size.
DECODE_ALLOWANCE = 32
DECODE_FLOOR = 1 << 20


def decode_allowance(frame_bytes: int) -> int:
    return max(DECODE_FLOOR, DECODE_ALLOWANCE * frame_bytes)


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


def decode_answers(
    hdr: RequestHeader, answers: Mapping[Target, Answer], failure_code: int
) -> tuple[dict[Target, Struct], dict[Target, int]]:
    """Each broker's answer decoded, or its failure code.

    An answer that does not decode is that broker's failure (``failure_code``),
    not the request's: the other brokers' parts are answered as usual.
    """
    decoded: dict[Target, Struct] = {}
    failed: dict[Target, int] = {}
    for target, answer in answers.items():
        if isinstance(answer, int):
            failed[target] = answer
            continue
        try:
            decoded[target] = decode_answer(hdr, answer)
        except Malformed:
            failed[target] = failure_code
    return decoded, failed


def _passthrough_body(hdr: RequestHeader, answer: memoryview | bytes) -> Parts:
    return [memoryview(answer)[response_body_offset(answer, hdr.api_key, hdr.api_version) :]]


# --- split by leader ----------------------------------------------------------

# api_key -> ((request topics, partitions, index), (response topics, partitions, index))
_PARTITIONED: dict[int, tuple[tuple[str, str, str | None], tuple[str, str, str | None]]] = {
    apis.PRODUCE: (("topic_data", "partition_data", "index"), ("responses", "partition_responses", "index")),
    apis.FETCH: (("topics", "partitions", "partition"), ("responses", "partitions", "partition_index")),
    apis.LIST_OFFSETS: (("topics", "partitions", "partition_index"), ("topics", "partitions", "partition_index")),
    apis.OFFSET_FOR_LEADER_EPOCH: (("topics", "partitions", "partition"), ("topics", "partitions", "partition")),
    apis.DELETE_RECORDS: (("topics", "partitions", "partition_index"), ("topics", "partitions", "partition_index")),
    apis.DESCRIBE_PRODUCERS: (("topics", "partition_indexes", None), ("topics", "partitions", "partition_index")),
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
    expect = not (api_key == apis.PRODUCE and request["acks"] == 0)
    rewritten = False
    if api_key == apis.FETCH:
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

    def merge(answers: Mapping[Target, Answer], marks: Mapping[TopicPartition, Marks] = {}, /) -> Outcome:  # noqa: B006
        # An undecodable answer may still have been acted on (a Produce written).
        decoded, failed = decode_answers(hdr, answers, broker_failure_code(api_key, written=True))

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
        for target, d in decoded.items():
            for _, p in resp_layout.entries(d):
                if isinstance(p, dict) and (code := p.get("error_code", 0)):
                    outcome.errors[(code, target)] = outcome.errors.get((code, target), 0) + 1  # type: ignore[index]
        for target, code in failed.items():
            if code != NO_ANSWER_YET:
                outcome.errors[(code, target)] = outcome.errors.get((code, target), 0) + 1  # type: ignore[index]
        for code in unroutable_codes.values():
            outcome.errors[(code, -1)] = outcome.errors.get((code, -1), 0) + 1
        outcome.stale_topics.update(tp[0] for tp in unroutable)
        for target, code in failed.items():
            if code != NO_ANSWER_YET:
                outcome.stale_topics.update(tp[0] for tp, owner_target in owner.items() if owner_target == target)
        _rewrite_partitions(ctx.identity, body, resp_layout, outcome)
        if api_key == apis.FETCH:
            waiting = {tp for tp, t in owner.items() if t in failed and failed[t] == NO_ANSWER_YET}
            outcome.fetch_marks = _finish_fetch(body, request, resp_layout, decoded, waiting, marks)
        outcome.body = encode_body(response_spec(api_key, hdr.api_version), body)
        return outcome

    unknown = {tp[0] for tp, code in unroutable_codes.items() if code != errors.NOT_LEADER_OR_FOLLOWER}
    if not plan_subs:
        # Nothing routable: answer at once with per-partition errors.
        local = merge({})
        return Plan(hdr, expect, reply=local.body if expect else [], unknown_topics=unknown, reply_errors=local.errors)
    if api_key != apis.FETCH:
        return Plan(hdr, expect, subs=plan_subs, merge=merge, unknown_topics=unknown)
    fetch_keys: dict[Target, Hashable] = {t: fetch_key(sub, req_layout) for t, sub in subs.items()}
    fetch_partitions = {t: frozenset(req_layout.keys(sub)) for t, sub in subs.items()}
    return Plan(
        hdr,
        expect,
        subs=plan_subs,
        merge=merge,
        unknown_topics=unknown,
        fetch_min_bytes=request["min_bytes"],
        fetch_keys=fetch_keys,
        fetch_partitions=fetch_partitions,
    )


def fetch_key(sub: Struct, layout: Layout) -> Hashable:
    """What a sub-fetch asks for, whatever the order of its partitions.

    Clients rotate partition order between Fetches for fairness; two
    sub-fetches with equal keys get equal answers from the broker.
    """

    def frozen(value: Any) -> Hashable:
        if isinstance(value, dict):
            return tuple(sorted((k, frozen(v)) for k, v in value.items()))
        if isinstance(value, list):
            return tuple(frozen(v) for v in value)
        return value

    partitions = frozenset((key, frozen(p)) for key, p in layout.entries(sub))
    rest = frozen({k: v for k, v in sub.items() if k != layout.topics})
    return rest, partitions


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


def _marks_of(answer: Struct, layout: Layout) -> dict[TopicPartition, Marks]:
    """The marks of every error-free partition of a decoded Fetch answer."""
    return {
        (t[layout.topic_key], p["partition_index"]): tuple(p.get(m, -1) for m in _MARKS)  # type: ignore[misc]
        for t in answer[layout.topics]
        for p in t[layout.partitions]
        if p["error_code"] == 0
    }


def answer_marks(hdr: RequestHeader, answer: Answer) -> dict[TopicPartition, Marks]:
    """The marks a broker's Fetch answer carries (none when it failed)."""
    if isinstance(answer, int):
        return {}
    _, layout = layouts(apis.FETCH, hdr.api_version)
    try:
        return _marks_of(decode_answer(hdr, answer), layout)
    except Malformed:
        return {}


def _finish_fetch(
    body: Struct,
    request: Struct,
    layout: Layout,
    decoded: Mapping[Hashable, Struct],
    waiting: set[TopicPartition],
    marks: Mapping[TopicPartition, Marks],
) -> dict[TopicPartition, Marks]:
    """Session, error and budget of the merged Fetch; the marks its answers carried.

    A partition whose broker has not answered yet reports the marks that
    broker last gave for it: clients decide end-of-partition and lag from
    them, so "unknown" (-1) would be a lie a broker never tells.
    """
    seen: dict[TopicPartition, Marks] = {}
    for d in decoded.values():
        seen.update(_marks_of(d, layout))
    for t in body[layout.topics]:
        for p in t[layout.partitions]:
            tp = (t[layout.topic_key], p["partition_index"])
            if tp in waiting and tp in marks:
                for name, value in zip(_MARKS, marks[tp], strict=True):
                    if name in p:  # older versions lack the later marks
                        p[name] = value
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
    return seen


def broker_failure_code(api_key: int, written: bool) -> int:
    """The error to report for a sub-request whose broker connection failed before it answered.

    ``written``: the request's bytes had started out to the broker, so it may have acted on it.
    NETWORK_EXCEPTION is the general answer, but two clients' paths need better:
    librdkafka fails a produced batch for good on NETWORK_EXCEPTION, and hands it
    from a Fetch to the application as a consumer error (the Java consumer
    throws on any Fetch code it does not expect). So a Produce that reached
    the broker gets REQUEST_TIMED_OUT ("maybe written", retried by every
    client), one that never left kfan NOT_LEADER_OR_FOLLOWER ("not written",
    refresh and retry), and a Fetch NOT_LEADER_OR_FOLLOWER, which every
    consumer handles quietly by refreshing its metadata and fetching again.
    """
    if api_key == apis.PRODUCE:
        return errors.REQUEST_TIMED_OUT if written else errors.NOT_LEADER_OR_FOLLOWER
    if api_key == apis.FETCH:
        return errors.NOT_LEADER_OR_FOLLOWER
    return errors.NETWORK_EXCEPTION


# The answer of a sub-fetch still in flight when the Fetch is answered: its
# partitions say "no data yet" (error 0, no records), as an idle broker would.
NO_ANSWER_YET = errors.NONE


def fetch_satisfied(hdr: RequestHeader, answers: Mapping[Target, Answer], min_bytes: int) -> bool:
    """Would a broker answer this Fetch now: ``min_bytes`` of records in, or an error to report?"""
    total = 0
    for answer in answers.values():
        if isinstance(answer, int):
            if answer != NO_ANSWER_YET:
                return True
            continue
        try:
            decoded = decode_answer(hdr, answer)
        except Malformed:
            return True  # a failure to report for that broker's partitions
        if decoded.get("error_code"):
            return True
        for t in decoded["responses"]:
            for p in t["partitions"]:
                if p["error_code"]:
                    return True
                total += len(p["records"] or b"")
    return total >= max(min_bytes, 1)


def _fetch_session_error(hdr: RequestHeader) -> Parts:
    spec = response_spec(hdr.api_key, hdr.api_version)
    body = spec.blank()
    body.update(error_code=errors.FETCH_SESSION_ID_NOT_FOUND, session_id=0, responses=[])
    return encode_body(spec, body)


# --- coordinator-routed -------------------------------------------------------

_GROUP_KEYED = {
    apis.JOIN_GROUP,
    apis.SYNC_GROUP,
    apis.HEARTBEAT,
    apis.LEAVE_GROUP,
    apis.OFFSET_COMMIT,
    apis.OFFSET_DELETE,
    apis.TXN_OFFSET_COMMIT,
    apis.CONSUMER_GROUP_HEARTBEAT,
}


@dataclass(frozen=True, slots=True)
class Batch:
    """A request naming several groups or transactions, and where its answer lists them."""

    key_type: int  # 0 group, 1 transaction
    request_array: str
    request_key: str | None  # None: the array holds the keys themselves
    response_array: str
    response_key: str


# Batched forms: each entry goes to its own coordinator, answers merged in order.
BATCHES: dict[int, Batch] = {
    apis.OFFSET_FETCH: Batch(0, "groups", "group_id", "groups", "group_id"),  # v8+
    apis.DESCRIBE_GROUPS: Batch(0, "groups", None, "groups", "group_id"),
    apis.DELETE_GROUPS: Batch(0, "groups_names", None, "results", "group_id"),
    apis.CONSUMER_GROUP_DESCRIBE: Batch(0, "group_ids", None, "groups", "group_id"),
    apis.DESCRIBE_TRANSACTIONS: Batch(1, "transactional_ids", None, "transaction_states", "transactional_id"),
    apis.ADD_PARTITIONS_TO_TXN: Batch(1, "transactions", "transactional_id", "results_by_transaction", "transactional_id"),  # v4+
}


def batch_of(api_key: int, request: Struct) -> Batch | None:
    batch = BATCHES.get(api_key)
    return batch if batch is not None and batch.request_array in request else None


def _batch_key(batch: Batch, entry: Any) -> str:
    return entry if batch.request_key is None else entry[batch.request_key]


def coordinators_of(api_key: int, request: Struct) -> list[Coordinator] | None:
    """The coordinator(s) a request belongs to, one per entry of a batched form; None: any broker will do."""
    if (batch := batch_of(api_key, request)) is not None:
        return [Coordinator(batch.key_type, _batch_key(batch, e)) for e in request[batch.request_array]]
    if api_key in _GROUP_KEYED or api_key == apis.OFFSET_FETCH:
        return [Coordinator(0, request["group_id"])]
    if api_key == apis.INIT_PRODUCER_ID:
        txn = request.get("transactional_id")
        return None if txn is None else [Coordinator(1, txn)]
    if api_key == apis.ADD_PARTITIONS_TO_TXN:
        return [Coordinator(1, request["v3_and_below_transactional_id"])]
    return [Coordinator(1, request["transactional_id"])]


def _plan_coordinator(ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    keys = coordinators_of(hdr.api_key, request)
    if not keys:  # not transactional, or a batch naming nothing
        return _plan_any(ctx, hdr, payload, request)
    if len(set(keys)) > 1:
        batch = batch_of(hdr.api_key, request)
        assert batch is not None
        return _plan_batch(ctx, hdr, payload, request, batch)
    target = keys[0]

    def merge(answers: Mapping[Target, Answer]) -> Outcome:
        answer = answers[target]
        if isinstance(answer, int):
            return Outcome(_coordinator_error_body(hdr, request), moved={target})
        # The answer goes to the client as the coordinator sent it; kfan only
        # reads its error codes, so an answer that breaks the schema (the mock's
        # null OffsetFetch topics) still reaches the client, as it would directly.
        try:
            body = _passthrough_body(hdr, answer)
        except Malformed:
            # Not even its header parses: nothing of it can reach the client.
            return Outcome(_coordinator_error_body(hdr, request), moved={target})
        try:
            codes = _error_codes(decode_answer(hdr, answer))
        except Malformed:
            codes = []
        moved = {target} if any(c in errors.COORDINATOR_MOVED for c in codes) else set()
        return Outcome(body, moved=moved)

    return Plan(hdr, True, subs={target: _whole(hdr, payload)}, merge=merge)


def _coordinator_error_body(hdr: RequestHeader, request: Struct) -> Parts:
    """NOT_COORDINATOR for a coordinator we could not reach: the client looks it up again."""
    batch = batch_of(hdr.api_key, request)
    if batch is None:
        return _error_body(hdr, errors.NOT_COORDINATOR)
    spec = response_spec(hdr.api_key, hdr.api_version)
    body = spec.blank()
    body[batch.response_array] = [_batch_error_entry(hdr, batch, e, errors.NOT_COORDINATOR) for e in request[batch.request_array]]
    return encode_body(spec, body)


def _batch_error_entry(hdr: RequestHeader, batch: Batch, request_entry: Any, code: int) -> Struct:
    entry_spec = response_spec(hdr.api_key, hdr.api_version).field(batch.response_array).struct
    assert entry_spec is not None
    entry = {**entry_spec.blank(), batch.response_key: _batch_key(batch, request_entry)}
    if "error_code" in entry:
        entry["error_code"] = code
    # AddPartitionsToTxn v4+ reports per partition: each requested one gets the error.
    if batch.request_key is not None and "topic_results" in entry:
        entry["topic_results"] = [
            {"name": t["name"], "results_by_partition": [{"partition_index": p, "partition_error_code": code} for p in t["partitions"]]}
            for t in request_entry["topics"]
        ]
    return entry


def _plan_batch(ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct, batch: Batch) -> Plan:
    """One sub-request per coordinating broker, each keeping the client's order; merged back in that order.

    Keys whose coordinator is unknown are first resolved by the I/O layer, all
    at once (the plan asks for them in ``unknown_coordinators``): a request
    naming thousands of groups costs a few lookups and a few sub-requests, not
    thousands. Keys still unknown after that are answered NOT_COORDINATOR
    without being sent; the client looks them up again.
    """
    entries = request[batch.request_array]
    by_target: dict[Target, list[Any]] = {}
    keys_of: dict[Target, set[Coordinator]] = {}
    unknown: set[Coordinator] = set()
    for e in entries:
        c = Coordinator(batch.key_type, _batch_key(batch, e))
        node = ctx.coordinator_of(c)
        target: Target = node if node is not None and node in ctx.topology.brokers else c
        if target is c:
            unknown.add(c)
            if ctx.coordinators_looked_up:
                continue
        by_target.setdefault(target, []).append(e)
        keys_of.setdefault(target, set()).add(c)
    if len(unknown) > 1 and not ctx.coordinators_looked_up:
        return Plan(hdr, True, unknown_coordinators=unknown)
    subs: dict[Target, SubRequest] = {t: _reencoded(hdr, payload, {**request, batch.request_array: mine}) for t, mine in by_target.items()}

    def merge(answers: Mapping[Target, Answer]) -> Outcome:
        # Per key, the answer's entries in order (a key the client named twice is answered twice).
        by_key: dict[str, deque[Struct]] = {}
        throttle = 0
        top_error = 0
        moved: set[Coordinator] = set()
        decoded, failures = decode_answers(hdr, answers, errors.NOT_COORDINATOR)
        for target in failures:
            moved.update(keys_of.get(target, ()))
        for d in decoded.values():
            throttle = max(throttle, d.get("throttle_time", 0))
            top_error = top_error or d.get("error_code", 0)
            for entry in d[batch.response_array]:
                by_key.setdefault(entry[batch.response_key], deque()).append(entry)
                if any(c in errors.COORDINATOR_MOVED for c in _error_codes(entry)):
                    moved.add(Coordinator(batch.key_type, entry[batch.response_key]))
        merged = []
        for e in entries:
            pending = by_key.get(_batch_key(batch, e))
            merged.append(pending.popleft() if pending else _batch_error_entry(hdr, batch, e, errors.NOT_COORDINATOR))
        spec = response_spec(hdr.api_key, hdr.api_version)
        body = spec.blank()
        body[batch.response_array] = merged
        if "throttle_time" in body:
            body["throttle_time"] = throttle
        if "error_code" in body:
            body["error_code"] = top_error
        return Outcome(encode_body(spec, body), moved=moved)

    if not subs:
        return Plan(hdr, True, reply=merge({}).body)
    return Plan(hdr, True, subs=subs, merge=merge)


# --- every broker -------------------------------------------------------------

# api_key -> the answer's array that is concatenated over brokers.
EVERY_BROKER_ARRAYS: dict[int, str] = {
    apis.LIST_GROUPS: "groups",
    apis.LIST_TRANSACTIONS: "transaction_states",
    apis.DESCRIBE_LOG_DIRS: "results",
}


def _plan_every_broker(ctx: Context, hdr: RequestHeader, payload: memoryview) -> Plan:
    """Ask each broker (each coordinates or stores its own share) and concatenate the answers."""
    brokers = sorted(ctx.topology.brokers)
    if not brokers:
        return _plan_any(ctx, hdr, payload, {})
    array = EVERY_BROKER_ARRAYS[hdr.api_key]

    def merge(answers: Mapping[Target, Answer]) -> Outcome:
        spec = response_spec(hdr.api_key, hdr.api_version)
        body = spec.blank()
        merged: list[Any] = []
        throttle = 0
        error = 0
        unknown_filters: list[str] = []
        decoded, failed = decode_answers(hdr, answers, errors.COORDINATOR_NOT_AVAILABLE)
        for broker in brokers:
            d = decoded.get(broker)
            if d is None:
                # Part of the list is missing: say so with a retriable code.
                error = error or errors.COORDINATOR_NOT_AVAILABLE
                continue
            throttle = max(throttle, d.get("throttle_time", 0))
            error = error or d.get("error_code", 0)
            merged.extend(d[array])
            unknown_filters.extend(f for f in d.get("unknown_state_filters", []) if f not in unknown_filters)
        if error and "error_code" not in body:
            raise BrokerUnavailable(f"api_key {hdr.api_key} v{hdr.api_version} cannot report that a broker failed")
        body[array] = merged
        for name, value in (("throttle_time", throttle), ("error_code", error), ("unknown_state_filters", unknown_filters)):
            if name in body:
                body[name] = value
        return Outcome(encode_body(spec, body))

    return Plan(hdr, True, subs={b: _whole(hdr, payload) for b in brokers}, merge=merge)


def _error_codes(value: Any) -> list[int]:
    out: list[int] = []
    if isinstance(value, dict):
        for k, v in value.items():
            # Unknown tagged fields sit under int keys (schema.TAGS): not error codes.
            if isinstance(k, str) and k.endswith("error_code") and isinstance(v, int):
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


# Config resources that name a broker: BROKER and BROKER_LOGGER (Kafka's ConfigResource.Type).
_BROKER_RESOURCES = frozenset({4, 8})
# api_key -> the answer's array of resources.
_CONFIG_ANSWERS = {apis.DESCRIBE_CONFIGS: "results", apis.ALTER_CONFIGS: "responses", apis.INCREMENTAL_ALTER_CONFIGS: "responses"}


def _plan_any(ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    identity = ctx.identity
    target: Target = ANY
    sub = _whole(hdr, payload)
    stand_in: str | None = None  # the real broker answering for kfan's own node id
    if hdr.api_key in _CONFIG_ANSWERS and ctx.topology.brokers:
        kfan_name = str(identity.node_id)
        if any(r["resource_type"] in _BROKER_RESOURCES and r["resource_name"] == kfan_name for r in request["resources"]):
            # Broker configs are answered by the broker they name; kfan's are a backend broker's.
            broker = min(ctx.topology.brokers)
            target, stand_in = broker, str(broker)
            resources = [
                {**r, "resource_name": stand_in} if r["resource_type"] in _BROKER_RESOURCES and r["resource_name"] == kfan_name else r
                for r in request["resources"]
            ]
            sub = _reencoded(hdr, payload, {**request, "resources": resources})
    elif hdr.api_key in routing.CONTROLLER_PREFERRED and ctx.topology.controller_id in ctx.topology.brokers:
        target = ctx.topology.controller_id

    def merge(answers: Mapping[Target, Answer]) -> Outcome:
        answer = answers[target]
        if isinstance(answer, int):
            return Outcome(_error_body(hdr, answer), broker_failed=True)
        try:
            return _merge_any(answer)
        except Malformed:
            # The broker's answer does not parse: the request failed there.
            return Outcome(_error_body(hdr, errors.NETWORK_EXCEPTION), refresh=True, broker_failed=True)

    def _merge_any(answer: memoryview | bytes) -> Outcome:
        api_key = hdr.api_key
        spec = response_spec(api_key, hdr.api_version)
        if api_key == apis.METADATA:
            decoded = decode_answer(hdr, answer)
            return Outcome(encode_body(spec, rewrite_metadata(identity, decoded, _broker_blank(spec))), metadata=decoded)
        if api_key == apis.FIND_COORDINATOR:
            body, learned = rewrite_find_coordinator(identity, request, decode_answer(hdr, answer))
            return Outcome(encode_body(spec, body), coordinators=learned)
        if api_key == apis.DESCRIBE_CLUSTER:
            return Outcome(encode_body(spec, rewrite_describe_cluster(identity, decode_answer(hdr, answer), _broker_blank(spec))))
        if api_key == apis.DESCRIBE_TOPIC_PARTITIONS:
            return Outcome(encode_body(spec, rewrite_describe_topic_partitions(identity, decode_answer(hdr, answer))))
        if api_key == apis.LIST_PARTITION_REASSIGNMENTS:
            return Outcome(encode_body(spec, rewrite_reassignments(identity, decode_answer(hdr, answer))))
        if stand_in is not None:
            body = rewrite_config_resources(decode_answer(hdr, answer), _CONFIG_ANSWERS[api_key], stand_in, str(identity.node_id))
            return Outcome(encode_body(spec, body))
        return Outcome(_passthrough_body(hdr, answer), refresh=api_key in routing.TOPOLOGY_CHANGING)

    return Plan(hdr, True, subs={target: sub}, merge=merge)


# --- identity rewriting -------------------------------------------------------------


def _broker_blank(spec: schema.StructSpec) -> Struct:
    broker = spec.field("brokers").struct
    assert broker is not None
    return broker.blank()


def _broker_entry(identity: Identity, base: Struct | None, id_field: str = "node_id") -> Struct:
    """kfan as a broker entry; ``base`` supplies the version's other fields (DescribeCluster v2 is_fenced)."""
    entry = {**(base or {}), id_field: identity.node_id, "host": identity.host, "port": identity.port, "rack": None}
    if "is_fenced" in entry:
        entry["is_fenced"] = False
    return entry


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


def rewrite_metadata(identity: Identity, response: Struct, broker_base: Struct | None = None) -> Struct:
    """kfan as the only broker: every leader, replica and controller is kfan.

    Except a leader that is not among the answer's brokers: Metadata lists live
    brokers only, so that partition's leader is down and kfan cannot reach it
    either. It is reported as Kafka reports an offline partition (no leader,
    LEADER_NOT_AVAILABLE), so that clients wait for a leader instead of
    sending kfan requests it can only refuse.
    """
    out = dict(response)
    live = {b["node_id"] for b in response["brokers"]}
    out["brokers"] = [_broker_entry(identity, broker_base)]
    if "controller_id" in out:
        out["controller_id"] = identity.node_id
    topics = [{**t, "partitions": [_without_absent_leader(p, live) for p in t["partitions"]]} for t in response["topics"]]
    out["topics"] = _topics_as_kfan(identity.node_id, topics)
    return out


def _without_absent_leader(p: Struct, live: set[int]) -> Struct:
    if p.get("leader_id", -1) < 0 or p["leader_id"] in live:
        return p
    return {**p, "leader_id": -1, "error_code": p.get("error_code") or errors.LEADER_NOT_AVAILABLE}


def rewrite_describe_topic_partitions(identity: Identity, response: Struct) -> Struct:
    return {**response, "topics": _topics_as_kfan(identity.node_id, response["topics"])}


def rewrite_reassignments(identity: Identity, response: Struct) -> Struct:
    return {**response, "topics": _topics_as_kfan(identity.node_id, response["topics"])}


def rewrite_config_resources(response: Struct, array: str, stand_in: str, kfan_name: str) -> Struct:
    """The stand-in broker's answers about itself become answers about kfan."""
    entries = [
        {**r, "resource_name": kfan_name} if r["resource_type"] in _BROKER_RESOURCES and r["resource_name"] == stand_in else r
        for r in response[array]
    ]
    return {**response, array: entries}


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


def rewrite_describe_cluster(identity: Identity, response: Struct, broker_base: Struct | None = None) -> Struct:
    out = dict(response)
    out["brokers"] = [_broker_entry(identity, broker_base, "broker_id")]
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
