"""Fetch's own rules, on top of the split by leader: everything about when and
how a Fetch is answered lives here, as pure objects the I/O layer drives.

- Planning: fetch sessions are per broker and cannot fan out, so kfan never
  hands one out; sub-fetches are sessionless. They carry the client's rack,
  or kfan's own, and a partition whose leader named a preferred read replica
  for that rack goes to the replica (KIP-392; :mod:`.read_replicas`).
- Following replicas: what leaders name is learned and what replicas fail is
  forgotten in the merge, before the client's answer hides every broker.
- Merging: the client's ``max_bytes`` budget holds for the merged answer;
  partitions whose broker has not answered yet report the watermarks that
  broker last gave (clients compute lag and end-of-partition from them).
- :class:`FetchWait`: when one Fetch is answered. As a broker would: once
  ``min_bytes`` of records (or an error) are in, or at ``max_wait``; a
  sub-fetch still long-polling an idle broker does not hold back data another
  broker returned. An earlier Fetch's sub-fetch that comes back empty within
  this one's ``max_wait`` is asked again, as a broker keeps waiting.
- :class:`InflightFetches`: per connection, the sub-fetch in flight to each
  broker that no client answer used yet, reused by the next Fetch that asks
  the same (so a slow broker's data arrives at all while a fast one keeps
  answering first); each one it drops unused goes to its ``on_evict``, whose
  answer nobody will read. :func:`answer_ceilings` is what a Fetch's answers may
  hold, for the connection's budget.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..kafka import errors
from ..kafka.headers import RequestHeader
from ..kafka.schema import Struct, encode_body, request_spec, response_spec
from ..kafka.wire import Malformed, Parts
from . import leader
from .answers import Decoded, decode_answer
from .layout import Layout, TopicKey, TopicPartition
from .layout import error_entry as layout_error_entry
from .plan import (
    NOT_YET,
    Answers,
    BrokerAnswer,
    BrokerFailure,
    Context,
    Destination,
    Failed,
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


def fetch_key(version: int, sub: Struct, layout: Layout) -> Hashable:
    """What a sub-fetch asks for, whatever the order of its partitions.

    Clients rotate partition order between Fetches for fairness; two
    sub-fetches with equal keys get equal answers from the broker. The
    version is part of it: an answer is read by its request's version (v0
    lacks v1's throttle time, so the same fields differ on the wire).
    """

    def frozen(value: Any) -> Hashable:
        if isinstance(value, dict):
            return tuple(sorted((k, frozen(v)) for k, v in value.items()))
        if isinstance(value, list):
            return tuple(frozen(v) for v in value)
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
    seen = _finish(body, found.request, found.response_layout, decoded.bodies, waiting, plan.ctx.watermarks)
    if seen:
        reply.effects.append(RememberWatermarks(seen))
    if plan.ctx.fetch_ahead_bytes > 0:
        ahead = _fetch_ahead(plan, body, rerouted)
        if ahead:
            reply.effects.append(FetchAhead(ahead))
    reply.body = encode_body(response_spec(plan.header.api_key, plan.header.api_version), body)
    return reply


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
) -> dict[TopicPartition, Watermarks]:
    """Session, error and budget of the merged Fetch; the watermarks its answers carried.

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
        return seen
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


def weigh(hdr: RequestHeader, answer: BrokerAnswer) -> tuple[int, bool]:
    """One broker's Fetch answer as the waiting sees it: (bytes of records, an error to report)."""
    if isinstance(answer, Failed):
        return 0, True
    if not isinstance(answer, Response):
        return 0, False  # not in yet
    try:
        decoded = decode_answer(hdr, answer.payload)
    except Malformed:
        return 0, True  # a failure to report for that broker's partitions
    if decoded.get("error_code"):
        return 0, True
    total = 0
    for t in decoded["responses"]:
        for p in t["partitions"]:
            if p["error_code"]:
                return 0, True
            total += len(p["records"] or b"")
    return total, False


def enough(weights: Iterable[tuple[int, bool]], min_bytes: int) -> bool:
    """Would a broker answer a Fetch with these answers in (each weighed by :func:`weigh`):
    ``min_bytes`` of records, or an error to report?"""
    total = 0
    for n, error in weights:
        if error:
            return True
        total += n
    return total >= max(min_bytes, 1)


# --- when a Fetch is answered -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AskAgain:
    """An earlier Fetch's sub-fetch came back empty inside this Fetch's max_wait:
    send it again (its watermarks are news all the same)."""

    destination: Destination
    watermarks: Mapping[TopicPartition, Watermarks]


class FetchWait:
    """When one Fetch is answered: a pure state machine over answers and time.

    ``fresh``: the sub-fetches sent for this Fetch (others were still out from
    an earlier one and are reused). They get ``grace`` past the Fetch's
    max_wait (a broker's answer may lag it by the network); older ones none.
    Those still out at the end answer :data:`NOT_YET` and stay for the
    client's next Fetch.
    """

    def __init__(
        self,
        plan: FetchForward,
        now: float,
        max_wait: float,
        grace: float,
        outstanding: set[Destination],
        fresh: set[Destination],
        answers: Mapping[Destination, BrokerAnswer] | None = None,
    ) -> None:
        self.plan = plan
        self.soft = now + max_wait
        self.hard = self.soft + grace
        self.outstanding = set(outstanding)
        self.fresh = set(fresh)
        self.answers: dict[Destination, BrokerAnswer] = {}
        # Each answer weighed once as it comes, not again at every wake-up.
        self._weights: dict[Destination, tuple[int, bool]] = {}
        for d, answer in (answers or {}).items():
            self.keep(d, answer)

    def answered(self, destination: Destination, answer: BrokerAnswer, now: float) -> AskAgain | None:
        """Take one broker's answer; an :class:`AskAgain` when it should be asked again instead."""
        self.outstanding.discard(destination)
        weight = weigh(self.plan.header, answer)
        if destination not in self.fresh and now < self.soft and not enough([weight], 1):
            return AskAgain(destination, answer_watermarks(self.plan, answer))
        self.answers[destination] = answer
        self._weights[destination] = weight
        return None

    def asked_again(self, destination: Destination) -> None:
        self.fresh.add(destination)
        self.outstanding.add(destination)

    def keep(self, destination: Destination, answer: BrokerAnswer) -> None:
        """It could not be asked again: its answer stands."""
        self.answers[destination] = answer
        self._weights[destination] = weigh(self.plan.header, answer)

    def wake_at(self, now: float) -> float | None:
        """When to look again if no answer comes; None: answer the client now."""
        if not self.outstanding or now >= self.hard:
            return None
        if self.answers and enough(self._weights.values(), self.plan.min_bytes):
            # Answered early only if every partition still out has watermarks
            # to report (see _finish); at first, wait for all.
            known = self.plan.ctx.watermarks.keys()
            if all(self.plan.partitions[d] <= known for d in self.outstanding):
                return None
        if now >= self.soft and not self.outstanding & self.fresh:
            return None
        return self.soft if now < self.soft else self.hard

    def final(self) -> dict[Destination, BrokerAnswer]:
        """Every destination's answer; those still out are :data:`NOT_YET`."""
        return {d: self.answers.get(d, NOT_YET) for d in self.plan.subs}


def answer_ceilings(plan: FetchForward) -> dict[Destination, int]:
    """The most each sub-fetch's answer holds: its ``max_bytes``, or the sum of its partitions'
    ``partition_max_bytes`` when less (before v3, only that sum). A broker may pass it by one
    batch (KIP-74): the answer, once in, is counted as it is."""
    found = plan.state
    layout = found.request_layout
    limit = found.request.get("max_bytes")
    out: dict[Destination, int] = {}
    for destination, sub in found.by_leader.items():
        partitions = sum(p.get("partition_max_bytes", 0) for _, p in layout.entries(sub))
        out[destination] = partitions if limit is None else min(limit, partitions)
    return out


H = TypeVar("H")


@dataclass(frozen=True, slots=True)
class Reuse(Generic[H]):
    handle: H
    hung: bool  # far past any max_wait: close its link, which fails it (a retriable error)


class InflightFetches(Generic[H]):
    """Per client connection, the sub-fetch out to each broker that no client answer used yet.

    ``done_at(handle)``: when its answer came (None: not yet), on the caller's clock.
    ``on_evict(handle)``: a sub-fetch dropped without going to a Fetch (replaced,
    stale, expired); the caller gives back what it holds unless a Fetch still uses it.
    """

    def __init__(self, done_at: Callable[[H], float | None], ttl: float, on_evict: Callable[[H], None] | None = None) -> None:
        self._done_at = done_at
        self._ttl = ttl  # how long an answered, unused sub-fetch may stand in for a new one
        self._on_evict = on_evict
        self._by_broker: dict[int, tuple[Hashable, H, float]] = {}

    def _evict(self, broker: int) -> None:
        _, handle, _ = self._by_broker.pop(broker)
        if self._on_evict is not None:
            self._on_evict(handle)

    def reusable(self, broker: int, wanted: Hashable, now: float, hung_after: float) -> Reuse[H] | None:
        """The sub-fetch already out to ``broker`` for exactly these partitions and offsets."""
        entry = self._by_broker.get(broker)
        if entry is None:
            return None
        key, handle, sent_at = entry
        done_at = self._done_at(handle)
        if done_at is None and now - sent_at > hung_after:
            del self._by_broker[broker]
            return Reuse(handle, hung=True)
        if (done_at is None or now - done_at < self._ttl) and key == wanted:
            return Reuse(handle, hung=False)
        self._evict(broker)
        return None

    def record(self, broker: int, key: Hashable, handle: H, now: float) -> None:
        old = self._by_broker.get(broker)
        if old is not None and old[1] is not handle:
            self._evict(broker)
        self._by_broker[broker] = (key, handle, now)

    def expires_at(self, broker: int, handle: H) -> float | None:
        """When ``handle``, kept for ``broker``, may no longer stand in for a new sub-fetch (None: not kept, or no answer yet)."""
        entry = self._by_broker.get(broker)
        if entry is None or entry[1] is not handle:
            return None
        done_at = self._done_at(handle)
        return None if done_at is None else done_at + self._ttl

    def expire(self, broker: int, handle: H, now: float) -> bool:
        """Drop ``handle`` if it is still kept for ``broker`` and its answer is past the ttl: whether it was."""
        expires = self.expires_at(broker, handle)
        if expires is None or now < expires:
            return False
        self._evict(broker)
        return True

    def kept(self, broker: int, handle: H) -> bool:
        entry = self._by_broker.get(broker)
        return entry is not None and entry[1] is handle

    def settle(self, handles: Mapping[Destination, H | Failed], answers: Mapping[Destination, BrokerAnswer]) -> None:
        """A sub-fetch whose answer went to the client is spent; one still out stays for the next Fetch."""
        for destination, handle in handles.items():
            if answers.get(destination) is NOT_YET or not isinstance(destination, int):
                continue
            entry = self._by_broker.get(destination)
            if entry is not None and entry[1] is handle:
                del self._by_broker[destination]

    def holds(self, broker: int) -> bool:
        return broker in self._by_broker

    def __len__(self) -> int:
        return len(self._by_broker)
