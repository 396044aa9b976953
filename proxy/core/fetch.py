"""Fetch's own rules, on top of the split by leader: how a Fetch is planned
and how its answers are merged (its row's planner and merge).

- Planning: fetch sessions are per broker and cannot fan out, so kfan never
  hands one out; sub-fetches are sessionless. They carry the client's rack,
  or kfan's own, and a partition whose leader named a preferred read replica
  for that rack goes to the replica (KIP-392; :mod:`.read_replicas`).
- Following replicas: what leaders name is learned and what replicas fail is
  forgotten in the merge, before the client's answer hides every broker.
- Merging: the client's ``max_bytes`` budget holds for the merged answer;
  partitions whose broker has not answered yet report the watermarks that
  broker last gave (clients compute lag and end-of-partition from them).
- Fetching ahead: the sub-fetches the client's next Fetch will make, sent
  while it reads this answer (:class:`~.plan.FetchAhead`).

When a Fetch is answered, and which sub-fetches in flight a later Fetch
reuses, is :mod:`.fetch_wait`'s.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from ..kafka import errors
from ..kafka.headers import RequestHeader
from ..kafka.schema import Struct, encode_body, request_spec, response_spec
from ..kafka.wire import Malformed, Parts
from . import leader
from .answers import Decoded, decode_answer, passthrough_body
from .layout import Layout, TopicKey, TopicPartition
from .layout import error_entry as layout_error_entry
from .plan import (
    Answers,
    BrokerAnswer,
    BrokerFailure,
    Context,
    FetchAhead,
    FetchForward,
    ForgetReadReplicas,
    LearnReadReplicas,
    LocalReply,
    Plan,
    RememberWatermarks,
    Reply,
    Response,
    Route,
    SubRequest,
    Watermarks,
)
from .read_replicas import ReadReplicaKey
from .topology import Topology

# A failed broker's partitions get NOT_LEADER_OR_FOLLOWER, which every
# consumer handles quietly by refreshing metadata and fetching again (the
# Java consumer throws on codes it does not expect; librdkafka hands
# NETWORK_EXCEPTION to the application as a consumer error).
FAILURE = BrokerFailure(written=errors.NOT_LEADER_OR_FOLLOWER, unwritten=errors.NOT_LEADER_OR_FOLLOWER)

_WATERMARKS = ("high_watermark", "last_stable_offset", "log_start_offset")


def plan(route: Route[FetchForward], ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    if request.get("session_id", 0) != 0 and request.get("session_epoch", -1) > 0:
        # We never hand out fetch sessions, so an incremental fetch names a session we do not know.
        return LocalReply(hdr, True, _session_error(hdr))
    rewritten = request.get("session_id", 0) != 0 or request.get("session_epoch", -1) != -1
    request = {**request, "session_id": 0, "session_epoch": -1, "forgotten_topics_data": []}
    cap = ctx.fetch_quota_bytes(hdr.client_id)
    if cap is not None and request.get("max_bytes", cap) > cap:
        # Over a fetch quota's window an answer is throttled for sure: ask no more than it allows (as a broker does).
        request["max_bytes"] = cap
        rewritten = True
    unusable: set[ReadReplicaKey] = set()
    prefer = None
    if "rack_id" in request:  # v11+ (KIP-392)
        # The client's own rack wins; kfan's stands in for clients that name none.
        rack = request["rack_id"] or ctx.rack
        if rack != request["rack_id"]:
            request["rack_id"] = rack
            rewritten = True
        prefer = _read_replica_router(ctx, rack, unusable)
    found = leader.split(route, ctx, hdr, request, prefer=prefer)
    assert route.merge is not None
    forward = FetchForward(
        hdr,
        True,
        route,
        ctx,
        request,
        leader.sub_requests(hdr, payload, found, True, rewritten),
        route.merge,
        state=found,
        unknown_topics=found.unknown_topics(),
        min_bytes=request["min_bytes"],
        keys={d: fetch_key(hdr.api_version, sub, found.request_layout) for d, sub in found.by_leader.items()},
        partitions={d: frozenset(found.request_layout.keys(sub)) for d, sub in found.by_leader.items()},
        unusable_replicas=frozenset(unusable),
    )
    return forward if forward.subs else leader.unroutable_reply(forward)


def _read_replica_router(ctx: Context, rack: str, unusable: set[ReadReplicaKey]) -> Callable[[TopicKey, int, int], int | None]:
    """Where a partition's sub-fetch goes: the preferred read replica its leader named for ``rack``, while kfan can
    read from it (a live broker, in sync); None: the leader. Preferences found unusable are collected to be forgotten."""
    topology = ctx.topology

    def prefer(key: TopicKey, partition: int, lead: int) -> int | None:
        name = leader.topic_name(topology, key)
        if name is None:
            return None
        replica = ctx.read_replica((rack, name, partition))
        if replica is None or replica == lead:
            return None
        if not topology.can_read_from(name, partition, replica):
            unusable.add((rack, name, partition))
            return None
        return replica

    return prefer


def _session_error(hdr: RequestHeader) -> Parts:
    spec = response_spec(hdr.api_key, hdr.api_version)
    body = spec.blank()
    body.update(error_code=errors.FETCH_SESSION_ID_NOT_FOUND, session_id=0, responses=[])
    return encode_body(spec, body)


_SCALARS = frozenset({int, str, bool, float, bytes, type(None), uuid.UUID})  # hashable as they are


def fetch_key(version: int, sub: Struct, layout: Layout) -> Hashable:
    """What a sub-fetch asks for, whatever the order of its partitions.

    Clients rotate partition order between Fetches for fairness; two
    sub-fetches with equal keys get equal answers from the broker. The
    version is part of it: an answer is read by its request's version (v0
    lacks v1's throttle time, so the same fields differ on the wire).
    """

    # Fields keep the order their decoder gives them (fixed per version, which
    # the key holds), and a predicted Fetch is built by replacing values in
    # place: no sort is needed, and a different order can only miss, not match.
    def frozen(value: Any) -> Hashable:
        if isinstance(value, dict):
            return tuple([(k, v if v.__class__ in _SCALARS else frozen(v)) for k, v in value.items()])
        if isinstance(value, list):
            return tuple([frozen(v) for v in value])
        return value

    partitions = frozenset((key, frozen(p)) for key, p in layout.entries(sub))
    rest = frozen({k: v for k, v in sub.items() if k != layout.topics})
    return version, rest, partitions


def merge(plan: FetchForward, answers: Answers) -> Reply:
    rerouted: set[int] = set()

    def read_replicas(body: Struct, decoded: Decoded, reply: Reply) -> None:
        rerouted.update(_follow_read_replicas(plan, body, decoded, reply))

    body, reply, decoded = leader.merge_partitions(plan, answers, read_replicas)
    found = plan.state
    waiting = {tp for tp, d in found.leader_of.items() if d in decoded.waiting}
    seen, cut = _finish(body, found.request, found.response_layout, decoded.bodies, waiting, plan.ctx.watermarks)
    if seen:
        reply.effects.append(RememberWatermarks(seen))
    if plan.ctx.fetch_ahead_bytes > 0:
        ahead = _fetch_ahead(plan, body, rerouted)
        if ahead:
            reply.effects.append(FetchAhead(ahead))
    if not cut and _as_answered(plan, decoded, body):
        # One broker answered the whole Fetch and nothing in it changed: its body goes as it came.
        (answer,) = answers.values()
        assert isinstance(answer, Response)
        reply.body = passthrough_body(plan.header, answer.payload)
    else:
        reply.body = encode_body(response_spec(plan.header.api_key, plan.header.api_version), body)
    return reply


def _as_answered(plan: FetchForward, decoded: Decoded, body: Struct) -> bool:
    """The merged Fetch is its one broker's answer unchanged (the caller knows no records were cut).

    Only the leaders' own answers qualify: a replica's may have its last stable offset held
    back, and a partition waiting on its broker reports remembered watermarks.
    """
    found = plan.state
    if found.replicas or plan.refused or plan.unknown_topics:
        return False
    if any(only.get("session_id", 0) != 0 for only in decoded.bodies.values()):
        return False  # a broker that kept a session for a sessionless fetch: the client must not see it
    return leader.one_answer_unchanged(found, decoded, body)


def _follow_read_replicas(plan: FetchForward, body: Struct, decoded: Decoded, reply: Reply) -> set[int]:
    """Follow the preferred read replicas leaders named (KIP-392), before the client's answer hides them.

    - A leader naming a replica kfan can read from: remember it (the partition's
      next sub-fetches go there). Its answer has no records; the client just asks again.
    - A replica answering an error or failing (OFFSET_NOT_AVAILABLE, OFFSET_OUT_OF_RANGE
      for an offset it has not caught up to, NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH,
      a broker failure, ...): forget it; the client is told "no data yet" (with the
      watermarks it last saw) and asks again, of the leader. An error from the
      leader's own log reaches it from there, once, as it would directly.
    - A replica's answer: its last stable offset is held to its high watermark
      (a follower cannot know of more; the mock reports the leader's).

    Also counts the bytes of records each broker sent, by locality. Returns
    the destinations whose partitions now go elsewhere (no fetching ahead to them).
    """
    found = plan.state
    ctx = plan.ctx
    topology = ctx.topology
    layout = found.response_layout
    for destination, d in decoded.bodies.items():
        if isinstance(destination, int):
            sent = sum(len(p.get("records") or b"") for _, p in layout.entries(d))
            reply.fetched[(destination, locality(topology, ctx.rack, destination))] += sent
    rack = found.request.get("rack_id")
    if rack is None:
        return set()  # before v11 a leader names no replica
    learned: dict[ReadReplicaKey, int] = {}
    forget = set(plan.unusable_replicas)
    rerouted: set[int] = set()
    for t in body[layout.topics]:
        key = t[layout.topic_key]
        name = leader.topic_name(topology, key)
        partitions = t[layout.partitions]
        for i, p in enumerate(partitions):
            index = p["partition_index"]
            source = found.leader_of.get((key, index))
            if source is None or source in decoded.waiting or name is None:
                continue
            if (key, index) in found.replicas:
                if p["error_code"] != errors.NONE:
                    forget.add((rack, name, index))
                    rerouted.add(source)
                    partitions[i] = _no_data_yet(layout, index, ctx.watermarks.get((key, index)))
                elif 0 <= p["high_watermark"] < p.get("last_stable_offset", -1):
                    p["last_stable_offset"] = p["high_watermark"]
                continue
            replica = p.get("preferred_read_replica", -1)
            if replica >= 0 and replica != source and topology.can_read_from(name, index, replica):
                learned[(rack, name, index)] = replica
                rerouted.add(source)
    if learned:
        reply.effects.append(LearnReadReplicas(learned))
    if forget:
        reply.effects.append(ForgetReadReplicas(frozenset(forget)))
    return rerouted


def _no_data_yet(layout: Layout, index: int, watermarks: Watermarks | None) -> Struct:
    """A partition whose replica could not serve it, as its leader would answer an offset with nothing new yet.

    Without watermarks to report (a broker never reports -1 with no error) it
    is a NOT_LEADER_OR_FOLLOWER instead, which every client retries quietly.
    """
    if watermarks is None:
        return layout_error_entry(layout, index, errors.NOT_LEADER_OR_FOLLOWER)
    entry = layout_error_entry(layout, index, errors.NONE)
    _report(entry, watermarks)
    return entry


def _reported(p: Struct) -> Watermarks:
    """The watermarks a partition entry says (-1 for those its version lacks)."""
    high, stable, start = (p.get(name, -1) for name in _WATERMARKS)
    return high, stable, start


def _report(p: Struct, watermarks: Watermarks) -> None:
    """A partition entry says these watermarks (those its version has)."""
    for name, value in zip(_WATERMARKS, watermarks, strict=True):
        if name in p:  # older versions lack the later ones
            p[name] = value


def locality(topology: Topology, rack: str, broker: int) -> str:
    """Where a broker sits from kfan: same-rack, cross-rack, or unknown (kfan's rack or the broker's not known)."""
    b = topology.brokers.get(broker)
    if not rack or b is None or not b.rack:
        return "unknown"
    return "same-rack" if b.rack == rack else "cross-rack"


def _fetch_ahead(plan: FetchForward, body: Struct, rerouted: set[int]) -> dict[int, tuple[SubRequest, Hashable]]:
    """The sub-fetches the client's next Fetch will ask, for the brokers that just returned records.

    A consumer asks next from the offset after the last whole batch it got
    (the same offset where it got none), so that Fetch is known before it
    comes. The one sent ahead waits for nothing (``max_wait`` 0: it must
    not hold the broker link if the client asks otherwise) and brings at most
    the connection's share of ``fetch_ahead_bytes``; it is kept under the key
    of the sub-fetch the client's Fetch will make, and used only if that Fetch
    asks exactly this (:class:`InflightFetches`).
    """
    found = plan.state
    hdr = plan.header
    if "max_bytes" not in found.request:
        return {}  # before v3 a Fetch has no budget of its own to bound what comes ahead
    answered = {(key, found.response_layout.partition_index(p)): p for key, p in found.response_layout.entries(body)}
    brokers = [d for d in found.by_leader if d not in rerouted]
    share = plan.ctx.fetch_ahead_bytes // max(1, len(brokers))
    request_layout = found.request_layout
    out: dict[int, tuple[SubRequest, Hashable]] = {}
    for broker in brokers:
        sub = found.by_leader[broker]
        ends: dict[TopicPartition, int] = {}
        for key, p in request_layout.entries(sub):
            tp = (key, request_layout.partition_index(p))
            got = answered.get(tp)
            end = None if got is None or got["error_code"] else records_end(got.get("records"))
            if end is None:
                break  # an error, or records kfan cannot read ahead of: the next Fetch is the client's to tell
            if end > p["fetch_offset"]:
                ends[tp] = end
        else:
            if not ends:
                continue  # nothing came: no reason to think more is there
            topics = []
            for t in sub[request_layout.topics]:
                key = t[request_layout.topic_key]
                partitions = [
                    {**p, "fetch_offset": ends.get((key, request_layout.partition_index(p)), p["fetch_offset"])}
                    for p in t[request_layout.partitions]
                ]
                topics.append({**t, request_layout.partitions: partitions})
            predicted = {**sub, request_layout.topics: topics}
            ahead = {**predicted, "max_wait": 0, "min_bytes": 1, "max_bytes": max(1, min(predicted["max_bytes"], share))}
            client_header = plan.subs[broker].tail[0][: hdr.body_offset - 8]
            tail: Parts = [bytes(client_header), *encode_body(request_spec(hdr.api_key, hdr.api_version), ahead)]
            out[broker] = (SubRequest(hdr.api_key, hdr.api_version, tail, True), fetch_key(hdr.api_version, predicted, request_layout))
    return out


_BATCH_HEAD = struct.Struct(">qiib")  # base offset, batch length, partition leader epoch, magic
_LAST_OFFSET_DELTA = struct.Struct(">i")  # at byte 23 of a v2 batch


def records_end(records: bytes | memoryview | None) -> int | None:
    """The offset after the last whole v2 batch of ``records``; -1 when none is whole; None for older formats."""
    if not records:
        return -1
    view = memoryview(records)
    end, pos, n = -1, 0, len(view)
    while pos + 27 <= n:
        base, length, _, magic = _BATCH_HEAD.unpack_from(view, pos)
        if magic != 2:
            return None
        if length < 49 or pos + 12 + length > n:
            break  # cut short at the end of the partition's bytes: the client asks for it again
        end = base + _LAST_OFFSET_DELTA.unpack_from(view, pos + 23)[0] + 1
        pos += 12 + length
    return end


def _watermarks_of(answer: Struct, layout: Layout) -> dict[TopicPartition, Watermarks]:
    """The watermarks of every error-free partition of a decoded Fetch answer."""
    return {
        (t[layout.topic_key], p["partition_index"]): _reported(p)
        for t in answer[layout.topics]
        for p in t[layout.partitions]
        if p["error_code"] == 0
    }


def answer_watermarks(plan: FetchForward, answer: BrokerAnswer) -> dict[TopicPartition, Watermarks]:
    """The watermarks a broker's Fetch answer carries (none when it failed)."""
    if not isinstance(answer, Response):
        return {}
    found = plan.state
    try:
        return _watermarks_of(decode_answer(plan.header, answer.payload), found.response_layout)
    except Malformed:
        return {}


def _finish(
    body: Struct,
    request: Struct,
    layout: Layout,
    decoded: Mapping[Any, Struct],
    waiting: set[TopicPartition],
    watermarks: Mapping[TopicPartition, Watermarks],
) -> tuple[dict[TopicPartition, Watermarks], bool]:
    """Session, error and budget of the merged Fetch; the watermarks its answers carried, and whether
    records were cut to the budget.

    A partition whose broker has not answered yet reports the watermarks that
    broker last gave for it: "unknown" (-1) would be a lie a broker never tells.
    """
    seen: dict[TopicPartition, Watermarks] = {}
    for d in decoded.values():
        seen.update(_watermarks_of(d, layout))
    for t in body[layout.topics]:
        for p in t[layout.partitions]:
            tp = (t[layout.topic_key], p["partition_index"])
            if tp in waiting and tp in watermarks:
                _report(p, watermarks[tp])
    body["session_id"] = 0
    body["error_code"] = next((d["error_code"] for d in decoded.values() if d.get("error_code")), 0)
    # The merged response honours the client's budget, not N brokers' budgets.
    # Records beyond it are dropped whole; the consumer fetches them next time
    # from the same offset. The first non-empty partition always goes (KIP-74).
    # Before v3 there is no budget for the whole answer, only each partition's
    # partition_max_bytes, which its broker applies (a message cut short at
    # the end of a partition's bytes is the client's to handle, as it arrives).
    budget = request.get("max_bytes")
    if budget is None:
        return seen, False
    used, cut = 0, False
    for t in body[layout.topics]:
        for p in t[layout.partitions]:
            records = p.get("records")
            if not records:
                continue
            n = len(records)
            if used and used + n > budget:
                p["records"] = b""
                cut = True
            else:
                used += n
    return seen, cut
