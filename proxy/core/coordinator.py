"""To the group or transaction coordinator.

A request belongs to the coordinator of one group or transaction (its route's
``coordinator_key`` says which field names it) and goes there whole; the
answer goes back to the client as the coordinator sent it. Batched forms
(OffsetFetch v8+, DescribeGroups, DeleteGroups, ConsumerGroupDescribe,
DescribeTransactions, AddPartitionsToTxn v4+: the route's ``batch`` column)
name several keys: they are split by coordinating broker and the answers
merged back in the client's order. A coordinator that fails or answers that
it moved is forgotten, and the client is told NOT_COORDINATOR, which makes it
look the coordinator up again.
"""

from __future__ import annotations

from collections import deque
from functools import partial
from typing import Any

from ..kafka import errors
from ..kafka.headers import RequestHeader
from ..kafka.schema import Encoded, Struct, encode_body, response_spec
from ..kafka.skim import Entry
from ..kafka.wire import Malformed, Parts
from . import any_broker, undecodable
from .answers import (
    decode_answer,
    decode_answers,
    error_body,
    error_codes,
    fold_top_level,
    mirrored_error_body,
    passthrough_body,
    reencoded,
    split_answer,
    whole,
)
from .plan import (
    Answers,
    Batch,
    Context,
    Coordinator,
    Destination,
    ForgetCoordinators,
    Forward,
    KeyType,
    LocalReply,
    NeedCoordinators,
    Plan,
    Reply,
    Response,
    Route,
    SubRequest,
    cacheable,
)

# --- which coordinator: the routes' coordinator_key column -------------------------------------------


def group_id(request: Struct) -> Coordinator | None:
    return Coordinator(KeyType.GROUP, request["group_id"])


def transactional_id(request: Struct) -> Coordinator | None:
    return Coordinator(KeyType.TRANSACTION, request["transactional_id"])


def transactional_id_if_any(request: Struct) -> Coordinator | None:
    """InitProducerId: an idempotent, non-transactional producer asks any broker."""
    txn = request.get("transactional_id")
    return None if txn is None else Coordinator(KeyType.TRANSACTION, txn)


def v3_transactional_id(request: Struct) -> Coordinator | None:
    """AddPartitionsToTxn up to v3 (v4+ is a batch)."""
    return Coordinator(KeyType.TRANSACTION, request["v3_and_below_transactional_id"])


# --- planning ------------------------------------------------------------------------------------------


def batch_of(route: Route[Any], request: Struct) -> Batch | None:
    """The route's batched form, when this request (version) uses it."""
    batch = route.batch
    return batch if batch is not None and batch.request_array in request else None


def _batch_key(batch: Batch, entry: Any) -> str:
    return entry if batch.request_key is None else entry[batch.request_key]


def coordinators_of(route: Route[Any], request: Struct) -> list[Coordinator]:
    """The coordinator(s) a request belongs to, one per entry of a batched form; none: any broker will do."""
    if (batch := batch_of(route, request)) is not None:
        return [Coordinator(batch.key_type, _batch_key(batch, e)) for e in request[batch.request_array]]
    assert route.coordinator_key is not None
    key = route.coordinator_key(request)
    return [] if key is None else [key]


def plan(route: Route[Any], ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    keys = coordinators_of(route, request)
    if not keys:  # not transactional, or a batch naming nothing
        return any_broker.plan(route, ctx, hdr, payload, request)
    if len(set(keys)) > 1:
        batch = batch_of(route, request)
        assert batch is not None
        return _plan_batch(route, ctx, hdr, payload, request, batch)
    return Forward(hdr, True, route, ctx, request, {keys[0]: whole(hdr, payload)}, merge, state=None)


def merge(plan: Forward[None], answers: Answers) -> Reply:
    hdr = plan.header
    (coordinator, answer), *_ = answers.items()
    assert isinstance(coordinator, Coordinator)
    forget = ForgetCoordinators(frozenset({coordinator}))
    if not isinstance(answer, Response):
        return Reply(_coordinator_error_body(plan.route, hdr, plan.request), [forget])
    # The answer goes to the client as the coordinator sent it; kfan only
    # reads its error codes, so an answer that breaks the schema (the mock's
    # null OffsetFetch topics) still reaches the client, as it would directly.
    try:
        body = passthrough_body(hdr, answer.payload)
    except Malformed as e:
        # Not even its header parses: nothing of it can reach the client.
        undecodable.note(answer.payload, e)
        return Reply(_coordinator_error_body(plan.route, hdr, plan.request), [forget])
    try:
        codes = error_codes(decode_answer(hdr, answer.payload))
    except Malformed:
        codes = []
    if any(c in errors.COORDINATOR_MOVED for c in codes):
        return Reply(body, [forget])
    return Reply(body)


def _coordinator_error_body(route: Route[Any], hdr: RequestHeader, request: Struct) -> Parts:
    """NOT_COORDINATOR for a coordinator we could not reach: the client looks it up again."""
    batch = batch_of(route, request)
    if batch is None:
        # OffsetCommit and TxnOffsetCommit have no top-level error code: each partition the client named gets it.
        if response_spec(hdr.api_key, hdr.api_version).has("error_code"):
            return error_body(hdr, errors.NOT_COORDINATOR)
        return mirrored_error_body(hdr, request, errors.NOT_COORDINATOR)
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


# --- batched forms -------------------------------------------------------------------------------------


def _plan_batch(route: Route[Any], ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct, batch: Batch) -> Plan:
    """One sub-request per coordinating broker, each keeping the client's order; merged back in that order.

    Keys whose coordinator is unknown are first resolved by the I/O layer, all
    at once (:class:`NeedCoordinators`): a request naming thousands of groups
    costs a few lookups and a few sub-requests, not thousands. Keys still
    unknown after that are answered NOT_COORDINATOR without being sent; the
    client looks them up again. Keys too long to be cached are never in the
    cache: they go to their own coordinator, looked up as they are sent.
    """
    by_destination: dict[Destination, list[Any]] = {}
    keys_of: KeysOf = {}
    unknown: set[Coordinator] = set()
    for e in request[batch.request_array]:
        c = Coordinator(batch.key_type, _batch_key(batch, e))
        node = ctx.coordinator_of(c)
        destination: Destination = node if node is not None and node in ctx.topology.brokers else c
        if destination is c:
            unknown.add(c)
            if ctx.coordinators_looked_up and cacheable(c):
                continue  # looked up, not found: NOT_COORDINATOR
            # Not looked up yet, or too long a key to be kept: the I/O layer looks it up as it sends it.
        by_destination.setdefault(destination, []).append(e)
        keys_of.setdefault(destination, set()).add(c)
    if len(unknown) > 1 and not ctx.coordinators_looked_up:
        return NeedCoordinators(hdr, unknown)
    subs: dict[Destination, SubRequest] = {
        d: reencoded(hdr, payload, {**request, batch.request_array: mine}) for d, mine in by_destination.items()
    }
    forward = Forward(hdr, True, route, ctx, request, subs, merge_batch, state=keys_of)
    if not subs:
        return LocalReply(hdr, True, merge_batch(forward, {}).body)
    return forward


# Per destination, the groups or transactions its sub-request names.
KeysOf = dict[Destination, set[Coordinator]]


def merge_batch(plan: Forward[KeysOf], answers: Answers) -> Reply:
    """The coordinators' entries, moved as bytes into the client's order (see :mod:`proxy.kafka.skim`)."""
    hdr = plan.header
    batch = batch_of(plan.route, plan.request)
    assert batch is not None
    keys_of = plan.state
    # Per key, the answer's entries in order (a key the client named twice is answered twice).
    by_key: dict[str, deque[memoryview]] = {}
    moved: set[Coordinator] = set()
    decoded = decode_answers(
        hdr, answers, errors.NOT_COORDINATOR, partial(split_answer, array=batch.response_array, key=batch.response_key)
    )
    for destination in decoded.failed:
        moved.update(keys_of.get(destination, ()))
    throttle, top_error = fold_top_level(decoded.bodies.values())
    for d in decoded.bodies.values():
        entry: Entry
        for entry in d[batch.response_array] or ():
            by_key.setdefault(entry.key, deque()).append(entry.raw)
            if any(c in errors.COORDINATOR_MOVED for c in entry.error_codes):
                moved.add(Coordinator(batch.key_type, entry.key))
    spec = response_spec(hdr.api_key, hdr.api_version)
    entry_spec = spec.field(batch.response_array).struct
    assert entry_spec is not None
    merged = Encoded()
    for e in plan.request[batch.request_array]:
        pending = by_key.get(_batch_key(batch, e))
        if pending:
            merged.append(pending.popleft())
        else:
            merged.append(b"".join(encode_body(entry_spec, _batch_error_entry(hdr, batch, e, errors.NOT_COORDINATOR))))
    body = spec.blank()
    body[batch.response_array] = merged
    if "throttle_time" in body:
        body["throttle_time"] = throttle
    if "error_code" in body:
        body["error_code"] = top_error
    return Reply(encode_body(spec, body), [ForgetCoordinators(frozenset(moved))] if moved else [])
