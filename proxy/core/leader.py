"""Split by partition leader: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch,
DeleteRecords, DescribeProducers.

A request naming partitions is split into one sub-request per leading broker
(client order kept within each), and the answers are merged back into one
entry per requested partition, in the client's order. Partitions with no
known leader are answered at once with a per-partition error, and the
topology is refreshed; with the client's identity at the brokers
(``--broker-identity client``) they go to a broker instead, which answers
them as the client's authorization says (see :func:`_stand_in`). Where the partitions sit in each API's messages is the
``layout`` column of its route; Produce and Fetch add rules of their own
(:mod:`.produce`, :mod:`.fetch`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from ..kafka import errors, skim
from ..kafka.headers import RequestHeader, response_body_offset
from ..kafka.records import Invalid
from ..kafka.schema import Struct, encode_body, request_spec, response_spec
from ..kafka.wire import Malformed, Parts, Reader
from . import identity, layout
from .answers import Decoded, decode_answers, passthrough_body, reencoded, whole
from .layout import Layout, TopicKey, TopicPartition
from .plan import (
    Answers,
    Context,
    Destination,
    Forward,
    LeaderSplit,
    LocalReply,
    PartitionFields,
    Plan,
    RefreshTopology,
    Reply,
    Response,
    Route,
    SubRequest,
)
from .topology import Topology


@cache
def layouts(fields: PartitionFields, api_key: int, api_version: int) -> tuple[Layout, Layout]:
    """The request's and the response's :class:`Layout` for one version."""
    return (
        Layout.of(request_spec(api_key, api_version), *fields.request),
        Layout.of(response_spec(api_key, api_version), *fields.response),
    )


def layouts_of(route: Route, api_version: int) -> tuple[Layout, Layout]:
    assert route.layout is not None
    return layouts(route.layout, route.api, api_version)


def topic_name(topology: Topology, key: TopicKey) -> str | None:
    return topology.topic_name(key) if isinstance(key, uuid.UUID) else key


def split(
    route: Route[Any],
    ctx: Context,
    hdr: RequestHeader,
    request: Struct,
    refuse: Mapping[TopicPartition, int] | None = None,
    prefer: Callable[[TopicKey, int, int], int | None] | None = None,
) -> LeaderSplit:
    """``refuse``: partitions answered at once with that error code, sent to no broker.

    ``prefer(topic, partition, leader)``: another replica to send the partition to (a Fetch's
    preferred read replica); None: its leader.
    """
    topology = ctx.topology
    request_layout, response_layout = layouts_of(route, hdr.api_version)
    refuse = {**refuse, **ctx.refused} if refuse else ctx.refused  # a broker checks the ACLs first

    def leader(key: TopicKey, partition: int) -> int | None:
        name = topic_name(topology, key)
        return None if name is None else topology.leader(name, partition)

    if refuse:

        def leader_unless_refused(key: TopicKey, partition: int) -> int | None:
            return None if (key, partition) in refuse else leader(key, partition)

        route_to = leader_unless_refused
    else:
        route_to = leader

    replicas: dict[TopicPartition, int] = {}
    if prefer is not None:
        to_leader = route_to

        def to_preferred(key: TopicKey, partition: int) -> int | None:
            lead = to_leader(key, partition)
            if lead is None:
                return None
            replica = prefer(key, partition, lead)
            if replica is None:
                return lead
            replicas[(key, partition)] = replica
            return replica

        route_to = to_preferred

    stand_in = _stand_in(ctx)
    if stand_in is not None:
        to_known = route_to

        def to_known_or_stand_in(key: TopicKey, partition: int) -> int | None:
            found = to_known(key, partition)
            if found is None and (key, partition) not in refuse:
                return stand_in
            return found

        route_to = to_known_or_stand_in

    leader_of: dict[TopicPartition, int] = {}
    routed = route_to

    def recorded(key: TopicKey, partition: int) -> int | None:
        target = routed(key, partition)
        if target is not None:
            leader_of[(key, partition)] = target
        return target

    by_leader, unroutable = layout.split(request, request_layout, recorded)
    out = LeaderSplit(request, request_layout, response_layout, by_leader, leader_of, replicas)
    for tp in unroutable:
        if tp in refuse:
            out.unroutable[tp] = refuse[tp]
            continue
        name = topic_name(topology, tp[0])
        if name is not None and topology.knows_topic(name) and tp[1] in topology.leaders[name]:
            out.unroutable[tp] = errors.NOT_LEADER_OR_FOLLOWER  # no leader known: the client looks again
        elif name is not None and topology.knows_topic(name):
            out.unroutable[tp] = errors.UNKNOWN_TOPIC_OR_PARTITION  # a partition the topic does not have, as a broker says
        else:
            out.unroutable[tp] = errors.UNKNOWN_TOPIC_ID if isinstance(tp[0], uuid.UUID) else errors.UNKNOWN_TOPIC_OR_PARTITION
    return out


def _stand_in(ctx: Context) -> int | None:
    """With the client's identity at the brokers, the broker that answers for partitions kfan cannot route
    (a topic its own view lacks, a partition with no known leader); None: kfan answers them itself.

    kfan's own view is not the client's: answering UNKNOWN_TOPIC_OR_PARTITION
    from it would tell the client which topics exist where Kafka, with ACLs,
    answers TOPIC_AUTHORIZATION_FAILED either way. A broker answers as the
    client's authorization says (or NOT_LEADER_OR_FOLLOWER, and the client
    refreshes its metadata). The lowest node id: the same broker for every
    such partition of a request, so they cost one sub-request at most.
    """
    if not ctx.client_identity or not ctx.topology.brokers:
        return None
    return min(ctx.topology.brokers)


def sub_requests(
    hdr: RequestHeader, payload: memoryview, split: LeaderSplit, expect: bool, rewritten: bool = False
) -> dict[Destination, SubRequest]:
    """One sub-request per leader; the client's own bytes when one leader has it all, unchanged."""
    if len(split.by_leader) == 1 and not split.unroutable and not rewritten:
        return {d: whole(hdr, payload, expect) for d in split.by_leader}
    return {d: reencoded(hdr, payload, sub, expect) for d, sub in split.by_leader.items()}


def plan(route: Route[Any], ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    return plan_split(route, ctx, hdr, payload, split(route, ctx, hdr, request), expect=True)


def plan_split(
    route: Route[Any],
    ctx: Context,
    hdr: RequestHeader,
    payload: memoryview,
    found: LeaderSplit,
    expect: bool,
    refused: dict[TopicPartition, Invalid] | None = None,
) -> Plan:
    assert route.merge is not None
    forward = Forward(
        hdr,
        expect,
        route,
        ctx,
        found.request,
        sub_requests(hdr, payload, found, expect),
        route.merge,
        unknown_topics=found.unknown_topics(),
        refused=refused or {},
        state=found,
    )
    return forward if forward.subs else unroutable_reply(forward)


def unroutable_reply(forward: Forward[Any]) -> LocalReply:
    """Nothing routable: answer at once with per-partition errors."""
    reply = forward.merge(forward, {})
    return LocalReply(
        forward.header,
        forward.expect_response,
        reply.body if forward.expect_response else [],
        reply.errors,
        forward.unknown_topics,
        refused=forward.refused,
    )


def merge(plan: Forward[LeaderSplit], answers: Answers) -> Reply:
    found = plan.state
    as_sent = _answered_cleanly(plan, found, answers)
    if as_sent is not None:
        return Reply(as_sent)
    body, reply, decoded = merge_partitions(plan, answers)
    if _as_answered(plan, found, decoded, body, reply):
        # One broker answered the whole request, no error to act on: its body goes as it came.
        (answer,) = answers.values()
        assert isinstance(answer, Response)
        reply.body = passthrough_body(plan.header, answer.payload)
    else:
        reply.body = encode_body(response_spec(plan.header.api_key, plan.header.api_version), body)
    return reply


def _answered_cleanly(plan: Forward[LeaderSplit], found: LeaderSplit, answers: Answers) -> Parts | None:
    """The one broker's body as it came, when it answered the whole request with nothing to act on: every error
    code zero, no broker named, the request's partitions in its order. Only its keys are read, not decoded
    (most requests: one leader has all the partitions a client sends at once); None: merge it."""
    if len(answers) != 1 or len(found.by_leader) != 1 or found.unroutable:
        return None
    (answer,) = answers.values()
    if not isinstance(answer, Response):
        return None
    hdr = plan.header
    assert plan.route.layout is not None
    read_keys = _partition_keys(plan.route.layout, hdr.api_key, hdr.api_version)
    if read_keys is None:
        return None
    payload = answer.payload
    try:
        offset = response_body_offset(payload, hdr.api_key, hdr.api_version)
        keys = read_keys(Reader(payload, offset))
    except Malformed:
        return None  # the merge decodes it and says what is wrong
    if keys is None or keys != found.request_layout.keys(found.request):
        return None
    return [memoryview(payload)[offset:]]


@cache
def _partition_keys(fields: PartitionFields, api_key: int, api_version: int) -> skim.PartitionKeys | None:
    """The reader of an answer's partition keys, or None for a message with a field naming brokers."""
    spec = response_spec(api_key, api_version)
    at = layouts(fields, api_key, api_version)[1]
    levels = (spec, at.topic_spec) if at.partition_spec is None else (spec, at.topic_spec, at.partition_spec)
    if any(f.name in identity.PARTITION_BROKER_FIELDS for level in levels for f in level.fields):
        return None
    return skim.partition_keys(spec, at.topics, at.topic_key, at.partitions, at.index)


def _as_answered(plan: Forward[LeaderSplit], found: LeaderSplit, decoded: Decoded, body: Struct, reply: Reply) -> bool:
    """The merged body is the one broker's answer unchanged: nothing to rewrite or re-encode."""
    return not reply.errors and not reply.effects and one_answer_unchanged(found, decoded, body)


def one_answer_unchanged(found: LeaderSplit, decoded: Decoded, body: Struct) -> bool:
    """The merged body holds one broker's whole answer as it came: one body, nothing failed, waiting or
    unroutable, no broker named, and its partitions in the merged order. Each merge that passes answers on
    adds what else would change them for its API."""
    if len(decoded.bodies) != 1 or decoded.failed or decoded.waiting or decoded.names_brokers or found.unroutable:
        return False
    (only,) = decoded.bodies.values()
    layout = found.response_layout
    return _shape(layout, only) == _shape(layout, body)


def _shape(layout: Layout, message: Struct) -> list[tuple[Any, list[int]]]:
    # Topics, not only partitions: the merge gives each topic the client asked an entry, one with no partitions
    # too, and a broker may leave that out (Kafka's Fetch does).
    return [(t[layout.topic_key], [layout.partition_index(p) for p in t[layout.partitions]]) for t in message[layout.topics]]


def merge_partitions(
    plan: Forward[LeaderSplit], answers: Answers, before_identity: Callable[[Struct, Decoded, Reply], None] | None = None
) -> tuple[Struct, Reply, Decoded]:
    """The merged response (decoded, to be finished by the caller), its effects, and the answers as read.

    ``before_identity``: reads the merged body while it still names brokers (a Fetch's preferred read replicas).
    """
    found = plan.state
    hdr = plan.header
    # An undecodable answer may still have been acted on (a Produce written).
    decoded = decode_answers(hdr, answers, plan.route.failure.code(written=True))
    response_layout = found.response_layout

    def error_of(tp: TopicPartition) -> int:
        if tp in found.unroutable:
            return found.unroutable[tp]
        leader = found.leader_of.get(tp)
        if leader is None:
            return errors.NETWORK_EXCEPTION
        if leader in decoded.waiting:
            return errors.NONE  # not in yet: "no data yet", as an idle broker answers
        return decoded.failed.get(leader, errors.NETWORK_EXCEPTION)

    topics = layout.merge(found.request, found.request_layout, decoded.bodies, response_layout, error_of)
    bodies = decoded.bodies
    body: Struct = dict(next(iter(bodies.values()))) if bodies else response_spec(hdr.api_key, hdr.api_version).blank()
    body[response_layout.topics] = topics
    if "throttle_time" in body:
        body["throttle_time"] = max((d.get("throttle_time", 0) for d in bodies.values()), default=0)
    reply = Reply([])
    # Counted by the brokers the request was split to (a leader split's destinations are all brokers).
    for broker in found.by_leader:
        if (d := bodies.get(broker)) is not None:
            for _, p in response_layout.entries(d):
                if isinstance(p, dict) and (code := p.get("error_code", 0)):
                    reply.errors[(code, broker)] += 1
        if (code := decoded.failed.get(broker)) is not None:
            reply.errors[(code, broker)] += 1
    for code in found.unroutable.values():
        reply.errors[(code, -1)] += 1
    if found.moved() or found.unknown_topics() or decoded.failed:
        reply.effects.append(RefreshTopology())
    decoded.names_brokers = any(identity.names_brokers(d, response_layout) for d in bodies.values())
    if before_identity is not None:
        before_identity(body, decoded, reply)
    for effect in identity.partitions(plan.ctx.identity, body, response_layout):
        if effect not in reply.effects:
            reply.effects.append(effect)
    return body, reply, decoded
