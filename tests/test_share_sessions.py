"""The client's share session (KIP-932) mapped onto one per broker (:mod:`proxy.core.share`), sans I/O.

Each test plays a client's ShareFetch and ShareAcknowledge requests through the core, applying the session each
plan leaves (``at_plan``) and the merges' effects as the connection does, against three brokers: orders 0, 1
and 2 are led by brokers 1, 2 and 3.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from proxy.core import (
    Context,
    Failed,
    Forward,
    LocalReply,
    Response,
    ShareKey,
    ShareSession,
    plan_request,
)
from proxy.core import share as core_share
from proxy.core.topology import Broker, Topology
from proxy.kafka import apis, errors
from tests.support.core_inputs import IDENTITY, keep_share_sessions
from tests.support.golden import answer_payload, decode_reply, decode_sub, request_payload

ORDERS = uuid.UUID("00000000-0000-0000-0000-0000000000a1")
BROKERS = {b: Broker(b, f"broker{b}", 9090 + b) for b in (1, 2, 3)}
TOPOLOGY = Topology(brokers=BROKERS, leaders={"orders": {0: 1, 1: 2, 2: 3}}, topic_ids={ORDERS: "orders"})
ADVERTISED = {apis.SHARE_FETCH: (1, 2), apis.SHARE_ACKNOWLEDGE: (1, 2)}
KEY: ShareKey = ("g", "m")
ACCEPT = {"first_offset": 0, "last_offset": 4, "acknowledge_types": [1]}


class Client:
    """One client connection's share sessions, kept as the connection keeps them."""

    def __init__(self, topology: Topology = TOPOLOGY) -> None:
        self.sessions: dict[ShareKey, ShareSession] = {}
        self.topology = topology

    def plan(self, api: int, body: dict[str, Any]) -> Forward[Any] | LocalReply:
        ctx = Context(IDENTITY, self.topology, ADVERTISED, share_sessions=dict(self.sessions))
        request = {"group_id": KEY[0], "member_id": KEY[1], **body}
        plan = plan_request(ctx, request_payload(api, 1, request))
        assert isinstance(plan, Forward | LocalReply)
        self.apply(plan.at_plan)
        return plan

    def apply(self, effects: Any) -> None:
        keep_share_sessions(self.sessions, effects)

    def merge(self, plan: Forward[Any], answers: Mapping[Any, Any]) -> dict[str, Any]:
        reply = plan.merge(plan, answers)
        self.apply(reply.effects)
        return decode_reply(plan.header.api_key, 1, b"".join(reply.body))


def fetch(epoch: int, partitions: tuple[int, ...] = (), acks: Mapping[int, list[dict]] | None = None, forget: tuple[int, ...] = ()) -> dict:
    named = sorted(set(partitions) | set(acks or {}))
    topics = [
        {"topic_id": ORDERS, "partitions": [{"partition_index": p, "acknowledgement_batches": (acks or {}).get(p, [])} for p in named]}
    ]
    return {
        "share_session_epoch": epoch,
        "max_wait": 500,
        "min_bytes": 1,
        "max_bytes": 3_000_000,
        "max_records": 500,
        "batch_size": 500,
        "topics": topics if named else [],
        "forgotten_topics_data": [{"topic_id": ORDERS, "partitions": list(forget)}] if forget else [],
    }


def acknowledge(epoch: int, acks: Mapping[int, list[dict]]) -> dict:
    return {
        "share_session_epoch": epoch,
        "topics": [{"topic_id": ORDERS, "partitions": [{"partition_index": p, "acknowledgement_batches": a} for p, a in acks.items()]}],
    }


def sent(plan: Forward[Any]) -> dict[int, dict[str, Any]]:
    """Per broker, the sub-request's body."""
    return {b: decode_sub(plan.header.api_key, 1, b"".join(sub.tail))[1] for b, sub in plan.subs.items()}


def partitions_of(body: dict[str, Any]) -> dict[int, list]:
    """A sub-request's partitions -> their acknowledgement batches."""
    return {p["partition_index"]: p["acknowledgement_batches"] for t in body["topics"] for p in t["partitions"]}


def answer(api: int, partitions: Mapping[int, dict] | None = None, error_code: int = 0) -> Response:
    entries = [{"partition_index": p, "error_code": 0, **fields} for p, fields in (partitions or {}).items()]
    body = {"error_code": error_code, "responses": [{"topic_id": ORDERS, "partitions": entries}] if entries else []}
    return Response(answer_payload(api, 1, body))


def open_session(client: Client) -> None:
    plan = client.plan(apis.SHARE_FETCH, fetch(0, (0, 1, 2)))
    assert isinstance(plan, Forward)
    client.merge(plan, {b: answer(apis.SHARE_FETCH) for b in plan.subs})


def test_a_new_session_opens_one_at_each_leader_with_its_own_partitions() -> None:
    client = Client()
    plan = client.plan(apis.SHARE_FETCH, fetch(0, (0, 1, 2)))
    assert isinstance(plan, Forward)
    subs = sent(plan)
    assert {b: (s["share_session_epoch"], partitions_of(s)) for b, s in subs.items()} == {1: (0, {0: []}), 2: (0, {1: []}), 3: (0, {2: []})}
    assert {s["max_bytes"] for s in subs.values()} == {1_000_000}  # the client's budget, shared
    assert client.sessions[KEY] == ShareSession(1, {(ORDERS, 0): 1, (ORDERS, 1): 2, (ORDERS, 2): 3}, {1: 1, 2: 1, 3: 1})


def test_each_request_moves_every_broker_session_one_epoch_on() -> None:
    client = Client()
    open_session(client)
    for epoch in (1, 2, 3):
        plan = client.plan(apis.SHARE_FETCH, fetch(epoch))
        assert isinstance(plan, Forward)
        assert {b: s["share_session_epoch"] for b, s in sent(plan).items()} == {1: epoch, 2: epoch, 3: epoch}
        assert all(partitions_of(s) == {} for s in sent(plan).values())  # nothing changed: nothing named
    assert client.sessions[KEY].client_epoch == 4


def test_acknowledgements_go_only_to_the_broker_that_delivered_the_records() -> None:
    client = Client()
    open_session(client)
    plan = client.plan(apis.SHARE_FETCH, fetch(1, acks={2: [ACCEPT]}))
    assert isinstance(plan, Forward)
    subs = sent(plan)
    assert {b: partitions_of(s) for b, s in subs.items()} == {1: {}, 2: {}, 3: {2: [ACCEPT]}}
    ack = client.plan(apis.SHARE_ACKNOWLEDGE, acknowledge(2, {0: [ACCEPT]}))
    assert isinstance(ack, Forward)
    assert {b: (s["share_session_epoch"], partitions_of(s)) for b, s in sent(ack).items()} == {1: (2, {0: [ACCEPT]})}
    # Broker 1 moved on by the acknowledgement; the others did not.
    assert client.sessions[KEY].broker_epochs == {1: 3, 2: 2, 3: 2}


def test_a_forgotten_partition_leaves_its_broker_and_the_last_one_ends_that_session() -> None:
    client = Client()
    open_session(client)
    plan = client.plan(apis.SHARE_FETCH, fetch(1, acks={1: [ACCEPT]}, forget=(1,)))
    assert isinstance(plan, Forward)
    subs = sent(plan)
    # Broker 2 held only partition 1: its session ends, with the acknowledgement it delivered.
    assert subs[2]["share_session_epoch"] == core_share.FINAL_EPOCH
    assert partitions_of(subs[2]) == {1: [ACCEPT]}
    assert client.sessions[KEY].broker_epochs == {1: 2, 3: 2}
    assert (ORDERS, 1) not in client.sessions[KEY].partitions


def test_the_client_is_told_of_a_wrong_epoch_or_a_missing_session_as_a_broker_tells_it() -> None:
    client = Client()
    missing = client.plan(apis.SHARE_FETCH, fetch(3, (0,)))
    assert isinstance(missing, LocalReply)
    assert decode_reply(apis.SHARE_FETCH, 1, b"".join(missing.body))["error_code"] == core_share.SHARE_SESSION_NOT_FOUND
    open_session(client)
    wrong = client.plan(apis.SHARE_FETCH, fetch(5))
    assert isinstance(wrong, LocalReply)
    assert decode_reply(apis.SHARE_FETCH, 1, b"".join(wrong.body))["error_code"] == core_share.INVALID_SHARE_SESSION_EPOCH
    assert client.sessions[KEY].client_epoch == 1  # unchanged: the next right epoch still works
    initial_ack = client.plan(apis.SHARE_ACKNOWLEDGE, acknowledge(0, {0: [ACCEPT]}))
    assert isinstance(initial_ack, LocalReply)


def test_a_failed_broker_is_reopened_on_the_next_request_and_the_client_sees_no_session_error() -> None:
    client = Client()
    open_session(client)
    plan = client.plan(apis.SHARE_FETCH, fetch(1, acks={1: [ACCEPT]}))
    assert isinstance(plan, Forward)
    records = {"records": b"", "acquired_records": [{"first_offset": 7, "last_offset": 7, "delivery_count": 1}]}
    merged = client.merge(
        plan, {1: answer(apis.SHARE_FETCH, {0: records}), 2: Failed(errors.NOT_LEADER_OR_FOLLOWER), 3: answer(apis.SHARE_FETCH)}
    )
    assert merged["error_code"] == 0
    by_partition = {p["partition_index"]: p for t in merged["responses"] for p in t["partitions"]}
    assert by_partition[0]["acquired_records"][0]["first_offset"] == 7
    assert by_partition[1]["error_code"] == errors.NOT_LEADER_OR_FOLLOWER  # the client looks its leader up again
    assert by_partition[1]["acknowledge_error_code"] == errors.NOT_LEADER_OR_FOLLOWER
    nxt = client.plan(apis.SHARE_FETCH, fetch(2))
    assert isinstance(nxt, Forward)
    subs = sent(nxt)
    assert {b: s["share_session_epoch"] for b, s in subs.items()} == {1: 2, 2: 0, 3: 2}
    assert partitions_of(subs[2]) == {1: []}  # opened afresh with all it holds


def test_a_session_error_reopens_that_broker_and_answers_its_partitions_with_no_records() -> None:
    client = Client()
    open_session(client)
    plan = client.plan(apis.SHARE_FETCH, fetch(1))
    assert isinstance(plan, Forward)
    answers = {
        1: answer(apis.SHARE_FETCH),
        2: answer(apis.SHARE_FETCH, error_code=core_share.SHARE_SESSION_NOT_FOUND),
        3: answer(apis.SHARE_FETCH),
    }
    merged = client.merge(plan, answers)
    assert merged["error_code"] == 0 and merged["responses"] == []
    assert client.sessions[KEY].broker_epochs == {1: 2, 3: 2}


def test_a_partition_whose_leader_moved_moves_with_it() -> None:
    client = Client()
    open_session(client)
    client.topology = replace(TOPOLOGY, leaders={"orders": {0: 2, 1: 2, 2: 3}})
    plan = client.plan(apis.SHARE_FETCH, fetch(1))
    assert isinstance(plan, Forward)
    subs = sent(plan)
    # Broker 1 held only partition 0: its session ends; broker 2 adds it.
    assert subs[1]["share_session_epoch"] == core_share.FINAL_EPOCH
    assert partitions_of(subs[2]) == {0: []}
    assert client.sessions[KEY].partitions[(ORDERS, 0)] == 2


def test_the_final_epoch_closes_every_broker_session_and_the_client_one() -> None:
    client = Client()
    open_session(client)
    plan = client.plan(apis.SHARE_ACKNOWLEDGE, acknowledge(core_share.FINAL_EPOCH, {2: [ACCEPT]}))
    assert isinstance(plan, Forward)
    subs = sent(plan)
    assert {b: s["share_session_epoch"] for b, s in subs.items()} == {1: -1, 2: -1, 3: -1}
    assert partitions_of(subs[3]) == {2: [ACCEPT]}
    assert KEY not in client.sessions


def test_a_connection_holds_a_bounded_number_of_sessions() -> None:
    client = Client()
    for i in range(core_share.MAX_SESSIONS_PER_CONNECTION):
        client.sessions[(f"g{i}", "m")] = ShareSession(1, {}, {})
    refused = client.plan(apis.SHARE_FETCH, fetch(0, (0,)))
    assert isinstance(refused, LocalReply)
    assert decode_reply(apis.SHARE_FETCH, 1, b"".join(refused.body))["error_code"] == core_share.SHARE_SESSION_LIMIT_REACHED
    assert len(client.sessions) == core_share.MAX_SESSIONS_PER_CONNECTION


def test_partitions_of_unknown_topics_are_answered_by_kfan_and_kept_within_a_bound() -> None:
    client = Client()
    unknown = uuid.UUID(int=99)
    body = fetch(0, (0,))
    body["topics"].append(
        {"topic_id": unknown, "partitions": [{"partition_index": i} for i in range(core_share.MAX_UNROUTED_PER_SESSION + 5)]}
    )
    plan = client.plan(apis.SHARE_FETCH, body)
    assert isinstance(plan, Forward) and plan.unknown_topics == {unknown}
    merged = client.merge(plan, {1: answer(apis.SHARE_FETCH)})
    answered = [p for t in merged["responses"] if t["topic_id"] == unknown for p in t["partitions"]]
    assert len(answered) == core_share.MAX_UNROUTED_PER_SESSION + 5
    assert {p["error_code"] for p in answered} == {errors.UNKNOWN_TOPIC_ID}
    assert sum(1 for b in client.sessions[KEY].partitions.values() if b is None) == core_share.MAX_UNROUTED_PER_SESSION
