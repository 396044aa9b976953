"""Share groups' ShareFetch and ShareAcknowledge (KIP-932): split by partition leader under one share session.

A client holds one share session with kfan per group and member: its epochs and the partitions it added.
kfan holds one with each broker that leads any of them, with that broker's own epochs, and maps the client's
onto them (:class:`~.plan.ShareSession`). A ShareFetch goes to every broker of the session (a share session
fetches from all its partitions each time), carrying what changed there: partitions added or forgotten, and
acknowledgements of the records that broker delivered. A ShareAcknowledge goes only to the brokers whose
records it acknowledges. The answers merge into one that names kfan as every leader.

The session changes as each request is planned (an ``at_plan`` effect), so requests a client sends back to
back get consecutive epochs at each broker. A broker whose session breaks (it failed, or answered a session
error) is opened afresh on the client's next request, with all its partitions, and the client sees nothing
of it: its partitions answer no records this time, and acknowledgements sent to it answer the error (their
records are delivered again once their acquisition lock expires). Kafka ties a share session to the
connection it was opened on, and kfan's links close when their client leaves: the brokers then release what
the client had acquired, as for a client that leaves them directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..kafka import apis, errors
from ..kafka.headers import RequestHeader
from ..kafka.schema import Struct, encode_body, response_spec
from . import identity
from .answers import decode_answers, error_body, reencoded
from .layout import Layout
from .leader import topic_name
from .plan import (
    Answers,
    Context,
    Effect,
    Forward,
    LocalReply,
    Plan,
    Reply,
    Route,
    SubRequest,
)
from .share_state import KeepShareSession, ReopenShareSessions, ShareKey, SharePartition, ShareSession

INVALID_RECORD_STATE = 121
SHARE_SESSION_NOT_FOUND = 122
INVALID_SHARE_SESSION_EPOCH = 123
SHARE_SESSION_LIMIT_REACHED = 133
# A broker answering one of these has no session kfan can go on with: open one afresh.
SESSION_ERRORS = frozenset({SHARE_SESSION_NOT_FOUND, INVALID_SHARE_SESSION_EPOCH, SHARE_SESSION_LIMIT_REACHED})
INITIAL_EPOCH, FINAL_EPOCH = 0, -1
# Share sessions one client connection may hold with kfan (Kafka's are one per connection, in practice).
MAX_SESSIONS_PER_CONNECTION = 16
# Partitions a session keeps without a leader kfan knows (an unknown topic id, say): the others are bounded by
# the cluster's own, these by this; one more is answered its error each time it is named, and not kept.
MAX_UNROUTED_PER_SESSION = 1000

Acks = dict[SharePartition, list[Struct]]  # a partition's acknowledgement batches


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch`` in a session (Kafka's ShareRequestMetadata.nextEpoch): wraps to 1."""
    return 1 if epoch >= 0x7FFFFFFF else epoch + 1


@dataclass(slots=True)
class Sent:
    """What one broker's sub-request carried, for the merge."""

    epoch: int
    fetching: list[SharePartition] = field(default_factory=list)  # partitions it fetches for (ShareFetch)
    acks: list[SharePartition] = field(default_factory=list)  # partitions whose acknowledgements it carries


@dataclass(slots=True)
class SharePlan:
    """A share request's split: per broker what it was sent, and what kfan answers itself."""

    key: ShareKey
    sent: dict[int, Sent]
    local: dict[SharePartition, tuple[int, int | None]]  # partition -> (error code, acknowledgement error or None)


# --- planning --------------------------------------------------------------------------------------------


def plan(route: Route[Any], ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    key: ShareKey = (request["group_id"], request["member_id"])
    epoch = request["share_session_epoch"]
    fetch = hdr.api_key == apis.SHARE_FETCH
    current = ctx.share_sessions.get(key)
    # Checked as a broker checks its own sessions (Kafka's SharePartitionManager).
    if epoch == INITIAL_EPOCH and not fetch:
        return LocalReply(hdr, True, error_body(hdr, INVALID_SHARE_SESSION_EPOCH))
    if epoch != INITIAL_EPOCH and current is None:
        return LocalReply(hdr, True, error_body(hdr, SHARE_SESSION_NOT_FOUND))
    if epoch > 0 and current is not None and epoch != current.client_epoch:
        return LocalReply(hdr, True, error_body(hdr, INVALID_SHARE_SESSION_EPOCH))
    if epoch == INITIAL_EPOCH and current is None and len(ctx.share_sessions) >= MAX_SESSIONS_PER_CONNECTION:
        return LocalReply(hdr, True, error_body(hdr, SHARE_SESSION_LIMIT_REACHED))

    acks: Acks = {}
    named: list[SharePartition] = []
    for t in request["topics"]:
        for p in t["partitions"]:
            tp = (t["topic_id"], p["partition_index"])
            named.append(tp)
            if p["acknowledgement_batches"]:
                acks.setdefault(tp, []).extend(p["acknowledgement_batches"])
    forgotten = [(t["topic_id"], i) for t in request.get("forgotten_topics_data") or () for i in t["partitions"]]

    fresh = epoch == INITIAL_EPOCH
    before: dict[SharePartition, int | None] = {} if fresh or current is None else dict(current.partitions)
    # A broker gone from the cluster took its session with it: its partitions are placed again.
    live = ctx.topology.brokers
    open_epochs = {b: e for b, e in current.broker_epochs.items() if b in live} if not fresh and current is not None else {}
    held = {tp: (b if b in live else None) for tp, b in before.items()}
    adds: dict[int, list[SharePartition]] = {}
    forgets: dict[int, list[SharePartition]] = {}
    dropped: list[SharePartition] = []  # named, but not kept: answered by kfan
    if fetch and epoch != FINAL_EPOCH:
        for tp in forgotten:
            if (b := held.pop(tp, None)) is not None:
                forgets.setdefault(b, []).append(tp)
        unrouted = sum(1 for b in held.values() if b is None)
        gone = set(forgotten)  # named with their last acknowledgements, and forgotten: not added back
        for tp in named:
            if tp in held or tp in gone:
                continue
            if _leader(ctx, tp) is not None:
                held[tp] = None  # placed at its leader below
            elif unrouted < MAX_UNROUTED_PER_SESSION:
                held[tp] = None
                unrouted += 1
            else:
                dropped.append(tp)
        for tp, b in list(held.items()):
            leader = _leader(ctx, tp)
            if tp in ctx.refused and b is not None:  # no longer authorized (the ACLs changed): answered by kfan
                forgets.setdefault(b, []).append(tp)
                held[tp] = None
                continue
            if leader is None or leader == b or (b is not None and tp in acks):
                continue  # no better place; or its acknowledgements go first to the broker that delivered it
            if b is not None:
                forgets.setdefault(b, []).append(tp)
            held[tp] = leader
            adds.setdefault(leader, []).append(tp)

    # Acknowledgements go to the broker that delivered the records: the one whose session holds the partition.
    acks_to: dict[int, list[SharePartition]] = {}
    local: dict[SharePartition, tuple[int, int | None]] = {}
    for tp in acks:
        if (code := ctx.refused.get(tp)) is not None:
            local[tp] = (code, code)  # a broker checks READ on the topic before acknowledging
            continue
        b = before[tp] if tp in before else held.get(tp)
        b = b if b is not None else _leader(ctx, tp)
        if b is None:
            local[tp] = (0, SHARE_SESSION_NOT_FOUND)
        else:
            acks_to.setdefault(b, []).append(tp)

    sent: dict[int, Sent] = {}
    bodies: dict[int, Struct] = {}
    next_open: dict[int, int] = {}

    def final(b: int, mine: list[SharePartition]) -> None:
        sent[b] = Sent(FINAL_EPOCH, acks=mine)
        bodies[b] = {"share_session_epoch": FINAL_EPOCH, "topics": _topic_entries(mine, acks)}
        if fetch:
            bodies[b]["forgotten_topics_data"] = []

    def unsent(tps: list[SharePartition]) -> None:
        local.update({tp: (0, SHARE_SESSION_NOT_FOUND) for tp in tps})  # no session there to acknowledge in

    if epoch == FINAL_EPOCH:
        for b in sorted(open_epochs):
            final(b, acks_to.get(b, []))
        for b, tps in acks_to.items():
            if b not in open_epochs:
                unsent(tps)
    elif not fetch:
        next_open = dict(open_epochs)
        for b, mine in sorted(acks_to.items()):
            if b not in open_epochs:
                unsent(mine)
                continue
            sent[b] = Sent(open_epochs[b], acks=mine)
            bodies[b] = {"share_session_epoch": open_epochs[b], "topics": _topic_entries(mine, acks)}
            next_open[b] = next_epoch(open_epochs[b])
    else:
        holding: dict[int, list[SharePartition]] = {}
        for tp in dropped:
            local[tp] = (_unroutable_code(ctx, tp), local.get(tp, (0, None))[1])
        for tp, b in held.items():
            if b is None:
                local[tp] = (_unroutable_code(ctx, tp), local.get(tp, (0, None))[1])
            else:
                holding.setdefault(b, []).append(tp)
        for b in sorted(set(holding) | set(acks_to) | set(open_epochs)):
            mine_acks = acks_to.get(b, [])
            if b in open_epochs and not holding.get(b):
                final(b, mine_acks)  # nothing left to fetch there: its session ends
            elif b in open_epochs:
                e = open_epochs[b]
                changed = [tp for tp in named if tp in set(adds.get(b, [])) | set(mine_acks)]
                changed += [tp for tp in adds.get(b, []) if tp not in changed]
                sent[b] = Sent(e, fetching=holding[b], acks=mine_acks)
                bodies[b] = {
                    "share_session_epoch": e,
                    "topics": _topic_entries(changed, acks),
                    "forgotten_topics_data": _forgotten(forgets.get(b, [])),
                }
                next_open[b] = next_epoch(e)
            elif holding.get(b):
                # Opened now, with all its partitions; acknowledgements may not come with an initial epoch.
                unsent(mine_acks)
                sent[b] = Sent(INITIAL_EPOCH, fetching=holding[b])
                bodies[b] = {"share_session_epoch": INITIAL_EPOCH, "topics": _topic_entries(holding[b], {}), "forgotten_topics_data": []}
                next_open[b] = next_epoch(INITIAL_EPOCH)
            else:
                unsent(mine_acks)
        fetchers = [b for b, s in sent.items() if s.epoch != FINAL_EPOCH]
        for b in fetchers:
            # The client's max_bytes bounds the whole answer: each broker gets its share.
            bodies[b]["max_bytes"] = max(1, request["max_bytes"] // len(fetchers))

    closing = epoch == FINAL_EPOCH
    after = None if closing else ShareSession(next_epoch(epoch), dict(held), next_open)
    at_plan: list[Effect] = [KeepShareSession(key, after)]
    state = SharePlan(key, sent, local)
    subs: dict[Any, SubRequest] = {b: reencoded(hdr, payload, {**request, **body}) for b, body in bodies.items()}
    unknown = {tp[0] for tp in named if tp[0] is not None and ctx.topology.topic_name(tp[0]) is None}
    forward = Forward(hdr, True, route, ctx, request, subs, merge, unknown_topics=unknown, state=state, at_plan=at_plan)
    if not subs:
        return LocalReply(hdr, True, merge(forward, {}).body, unknown_topics=unknown, at_plan=at_plan)
    return forward


def reopened(session: ShareSession, brokers: frozenset[int]) -> ShareSession:
    """``session`` with its sessions at ``brokers`` gone: the next request opens them afresh."""
    return replace(session, broker_epochs={b: e for b, e in session.broker_epochs.items() if b not in brokers})


def _leader(ctx: Context, tp: SharePartition) -> int | None:
    if tp in ctx.refused:
        return None
    name = topic_name(ctx.topology, tp[0])
    if name is None:
        return None
    leader = ctx.topology.leader(name, tp[1])
    return leader if leader is not None and leader in ctx.topology.brokers else None


def _unroutable_code(ctx: Context, tp: SharePartition) -> int:
    if (code := ctx.refused.get(tp)) is not None:
        return code
    name = topic_name(ctx.topology, tp[0])
    if name is None:
        return errors.UNKNOWN_TOPIC_ID
    return errors.LEADER_NOT_AVAILABLE if tp[1] in ctx.topology.leaders.get(name, {}) else errors.UNKNOWN_TOPIC_OR_PARTITION


def _by_topic(tps: list[SharePartition]) -> dict[Any, list[int]]:
    """``tps``' partition indexes per topic id, both in the order given."""
    out: dict[Any, list[int]] = {}
    for topic_id, partition in tps:
        out.setdefault(topic_id, []).append(partition)
    return out


def _topic_entries(tps: list[SharePartition], acks: Acks) -> list[Struct]:
    """Request topic entries naming ``tps`` (in that order), with their acknowledgements."""
    return [
        {"topic_id": t, "partitions": [{"partition_index": p, "acknowledgement_batches": acks.get((t, p), [])} for p in ps]}
        for t, ps in _by_topic(tps).items()
    ]


def _forgotten(tps: list[SharePartition]) -> list[Struct]:
    return [{"topic_id": t, "partitions": ps} for t, ps in _by_topic(tps).items()]


# --- merging ---------------------------------------------------------------------------------------------


def merge(plan: Forward[SharePlan], answers: Answers) -> Reply:
    hdr = plan.header
    state = plan.state
    spec = response_spec(hdr.api_key, hdr.api_version)
    partition_spec = spec.field("responses").struct.field("partitions").struct  # type: ignore[union-attr]
    topics: dict[Any, list[Struct]] = {}
    reopen: set[int] = set()
    refused: dict[int, tuple[int, str | None]] = {}  # broker -> its top-level error, other than a session's
    throttle, lock_timeout = 0, None
    effects: list[Effect] = []

    def blank(tp: SharePartition, code: int = 0, ack_code: int | None = None) -> None:
        if code == 0 and ack_code is None:
            return  # nothing to say of it: a broker leaves it out too
        entry = {**partition_spec.blank(), "partition_index": tp[1], "error_code": code}
        if "acknowledge_error_code" in entry:
            entry["acknowledge_error_code"] = ack_code or 0
        elif ack_code is not None and code == 0:
            entry["error_code"] = ack_code  # ShareAcknowledge's one error code per partition
        topics.setdefault(tp[0], []).append(entry)

    decoded = decode_answers(hdr, answers, errors.NETWORK_EXCEPTION)
    for b, sent in state.sent.items():
        body = decoded.bodies.get(b)
        if body is None:  # failed, or unreadable: its session went with its link, or cannot be trusted
            reopen.add(b)
            code = decoded.failed.get(b, errors.NETWORK_EXCEPTION)
            _answer_unanswered(sent, blank, code, code)
            continue
        throttle = max(throttle, body.get("throttle_time", 0))
        if (lock := body.get("acquisition_lock_timeout", 0)) > 0:
            lock_timeout = lock if lock_timeout is None else min(lock_timeout, lock)
        top = body.get("error_code", 0)
        if top in SESSION_ERRORS:
            reopen.add(b)
            _answer_unanswered(sent, blank, 0, top)
        elif top != 0:
            reopen.add(b)
            refused[b] = (top, body.get("error_message"))
            _answer_unanswered(sent, blank, top, top)
        else:
            for t in body["responses"]:
                topics.setdefault(t["topic_id"], []).extend(t["partitions"])

    for tp, (code, ack_code) in state.local.items():
        blank(tp, code, ack_code)

    out = spec.blank()
    out["throttle_time"] = throttle
    out["error_code"] = 0
    if lock_timeout is not None and "acquisition_lock_timeout" in out:
        out["acquisition_lock_timeout"] = lock_timeout
    whole = refused and len(refused) == len(state.sent) and len({c for c, _ in refused.values()}) == 1
    if whole:
        # Every broker refused it alike (the group not authorized, say): the client's request is refused, with no
        # partitions, as a broker answers a request it refuses whole.
        out["error_code"], out["error_message"] = next(iter(refused.values()))
    out["responses"] = [] if whole else [{"topic_id": t, "partitions": ps} for t, ps in topics.items()]
    layout = Layout.of(spec, "responses", "partitions", "partition_index")
    effects.extend(identity.partitions(plan.ctx.identity, out, layout))
    out.setdefault("node_endpoints", [])
    if reopen:
        effects.append(ReopenShareSessions(state.key, frozenset(reopen)))
    return Reply(encode_body(spec, out), effects)


def _answer_unanswered(sent: Sent, blank: Any, code: int, ack_code: int) -> None:
    """A broker's partitions and acknowledgements, answered for it: ``code`` for what it fetched, ``ack_code``
    for what it was to acknowledge."""
    acked = set(sent.acks)
    for tp in sent.fetching:
        blank(tp, code, ack_code if tp in acked else None)
    for tp in sent.acks:
        if tp not in sent.fetching:
            blank(tp, code, ack_code)
