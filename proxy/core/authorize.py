"""Requests judged by kfan's ACLs (``--authorizer acls``): the verdict, and the plan it leads to.

A broker checks a request's resources against its ACLs and answers what is
denied with the error codes its API has for that, in the places it has them
(:mod:`.authorize_apis` states, per API, what Kafka checks). kfan does the
same before routing, so that what the brokers see as kfan's own principal is
only what the client may do:

- the whole request may be answered by kfan (:attr:`Verdict.reply`), or the
  connection closed where no answer can say it (an acks=0 Produce);
- partitions of a request split by leader may be refused
  (:attr:`Verdict.refused`: answered in place, in client order, by the split);
- entries of a request's arrays may be stripped (:class:`Strip`): sent to no
  broker, and answered by kfan in the response's array;
- the response may be amended (:attr:`Verdict.amend`): topics, groups and
  transactions the client may not describe removed from listings, and the
  authorized-operations fields recomputed for the client.

Every decision is kept on the verdict for the metrics, the log and the audit
(:class:`Decision`). Pure: the ACLs come in with the :class:`Access`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..kafka.headers import RequestHeader
from ..kafka.schema import Struct, StructSpec, decode_body, encode_body, request_spec, response_spec
from ..kafka.wire import Parts
from .acls import CLUSTER_NAME, Access, Decision, Operation, ResourceType
from .answers import error_codes, mirrored_entry
from .layout import TopicPartition
from .plan import ClosesConnection, Context, Forward, LocalReply, Plan, Reply, Route

# The operations Kafka reports in authorized-operations fields, per resource type (AclEntry.supportedOperations).
SUPPORTED: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (
        Operation.READ,
        Operation.WRITE,
        Operation.CREATE,
        Operation.DELETE,
        Operation.ALTER,
        Operation.DESCRIBE,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.CLUSTER: (
        Operation.CREATE,
        Operation.CLUSTER_ACTION,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
        Operation.IDEMPOTENT_WRITE,
        Operation.ALTER,
        Operation.DESCRIBE,
    ),
    ResourceType.TRANSACTIONAL_ID: (Operation.DESCRIBE, Operation.WRITE, Operation.TWO_PHASE_COMMIT),
}
NOT_REQUESTED = -(2**31)  # an authorized-operations field the client did not ask for (Kafka's Int.MinValue)


class Judge:
    """One request's decisions, made and remembered."""

    def __init__(self, access: Access) -> None:
        self.access = access
        self.decisions: list[Decision] = []
        self._made: dict[tuple[Operation, ResourceType, str], bool] = {}

    def allows(self, op: Operation, resource_type: ResourceType, name: str | None) -> bool:
        """``name`` None (a nullable field left null): denied, no resource being named."""
        if name is None:
            self.decisions.append(Decision(op, resource_type, "", False))
            return False
        key = (op, resource_type, name)
        made = self._made.get(key)
        if made is None:  # one decision per distinct resource, as Kafka makes one action per name
            a = self.access
            made = self._made[key] = a.acls.allows(a.principal, a.host, op, resource_type, name)
            self.decisions.append(Decision(op, resource_type, name, made))
        return made

    def quietly(self, op: Operation, resource_type: ResourceType, name: str | None) -> bool:
        """A decision that is not the request's (a listing's filter, as Kafka's ``logIfDenied=false``): not kept."""
        if name is None:
            return False
        a = self.access
        return a.acls.allows(a.principal, a.host, op, resource_type, name)

    def cluster_shortcut(self, op: Operation) -> bool:
        """A cluster-wide permission that spares per-resource checks (CREATE on the cluster for CreateTopics): kept
        as a decision only when allowed, since its denial denies nothing (Kafka's ``logIfDenied=false``)."""
        a = self.access
        if not a.acls.allows(a.principal, a.host, op, ResourceType.CLUSTER, CLUSTER_NAME):
            return False
        return self.allows(op, ResourceType.CLUSTER, CLUSTER_NAME)

    def covered(self, op: Operation, resource_type: ResourceType, names: Iterable[str | None]) -> None:
        """Resources a cluster-wide permission allowed (a shortcut taken): kept as allowed decisions, so that what a
        request named is known (the audit log) whichever way it was allowed."""
        for name in names:
            if name is not None and (op, resource_type, name) not in self._made:
                self._made[(op, resource_type, name)] = True
                self.decisions.append(Decision(op, resource_type, name, True))

    def cluster(self, op: Operation) -> bool:
        return self.allows(op, ResourceType.CLUSTER, CLUSTER_NAME)

    def allows_any(self, op: Operation, resource_type: ResourceType) -> bool:
        a = self.access
        made = a.acls.allows_any(a.principal, a.host, op, resource_type)
        self.decisions.append(Decision(op, resource_type, "*", made))
        return made

    def operations(self, resource_type: ResourceType, name: str = CLUSTER_NAME) -> int:
        """The authorized-operations bit field of a resource (not counted as decisions: no request names them)."""
        bits = 0
        for op in SUPPORTED[resource_type]:
            if self.quietly(op, resource_type, name):
                bits |= 1 << op
        return bits


@dataclass(frozen=True, slots=True)
class Strip:
    """Entries of one request array that kfan answers itself: sent to no broker, answered in the response.

    ``within``: the path of (array, index) pairs from the request's top to the array's parent entry, and
    ``response_within`` the matching (array, key field, key) pairs in the response (empty: the top level).
    """

    array: str
    response_array: str
    answers: dict[int, Any]  # the request entry's index -> the response entry answering it
    within: tuple[tuple[str, int], ...] = ()
    response_within: tuple[tuple[str, str, Any], ...] = ()
    forward_empty: bool = False  # the request still goes to a broker when nothing is left in the array


Amend = Callable[[Struct], Struct]


@dataclass(slots=True)
class Verdict:
    """What the ACLs decided about one request (see the module's docstring)."""

    judge: Judge
    reply: Parts | None = None
    close: str | None = None
    refused: dict[TopicPartition, int] = field(default_factory=dict)
    strips: list[Strip] = field(default_factory=list)
    amend: list[Amend] = field(default_factory=list)
    # Topics judged as absent from kfan's topology (a create, a delete): refresh it and judge again if any.
    unknown_topics: set[str] = field(default_factory=set)

    @property
    def decisions(self) -> list[Decision]:
        return self.judge.decisions

    @property
    def denied(self) -> bool:
        return any(not d.allowed for d in self.judge.decisions)


# --- building answers --------------------------------------------------------------------------------


def array_spec(spec: StructSpec, *path: str) -> StructSpec:
    """The entry schema of a (nested) array of ``spec``."""
    for name in path:
        sub = spec.field(name).struct
        assert sub is not None, name
        spec = sub
    return spec


def mirrored(spec: StructSpec, request_entry: Any, code: int, key: str | None = None, **fields: Any) -> Struct:
    """A response entry for a request entry (a struct, copied by field name, or a bare name set as ``key``), every
    error code ``code``, and ``fields`` set."""
    if isinstance(request_entry, dict):
        entry = mirrored_entry(spec, request_entry, code)
    else:
        entry = mirrored_entry(spec, {}, code)
        assert key is not None
        entry[key] = request_entry
    entry.update(fields)
    return entry


def response_body(hdr: RequestHeader, body: Struct) -> Parts:
    return encode_body(response_spec(hdr.api_key, hdr.api_version), body)


def mirrored_reply(hdr: RequestHeader, request: Struct, code: int) -> Parts:
    """Every entry the request names answered ``code`` (nothing named: an empty answer, as a broker gives)."""
    return response_body(hdr, mirrored(response_spec(hdr.api_key, hdr.api_version), request, code))


def blank_response(hdr: RequestHeader, **fields: Any) -> Struct:
    body = response_spec(hdr.api_key, hdr.api_version).blank()
    body.update(fields)
    return body


# --- the plan a verdict leads to ------------------------------------------------------------------------


def planned(verdict: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    """The request's plan under the verdict: answered by kfan, or routed with what the client may do."""
    expect = request.get("acks", 1) != 0 if route.records == "request" else True
    if verdict.close is not None:
        raise ClosesConnection(verdict.close)
    if verdict.reply is not None:
        return LocalReply(hdr, expect, verdict.reply if expect else [], _denials(_decoded(hdr, verdict.reply)))
    if verdict.refused:
        ctx = dataclasses.replace(ctx, refused={**ctx.refused, **verdict.refused})
    if verdict.strips:
        request = _stripped(request, verdict.strips)
        if not any(s.forward_empty for s in verdict.strips) and all(not _array_at(request, s) for s in verdict.strips):
            return LocalReply(hdr, expect, _amended(hdr, blank_response(hdr), verdict), _denials(verdict.strips))
        encoded = encode_body(request_spec(hdr.api_key, hdr.api_version), request)
        payload = memoryview(b"".join([bytes(payload[: hdr.body_offset]), *(bytes(p) for p in encoded)]))
    plan = route.plan(route, ctx, hdr, payload, request)
    if not verdict.strips and not verdict.amend:
        return plan
    if isinstance(plan, LocalReply):
        if plan.expect_response:
            plan.body = _amended(hdr, _decoded(hdr, plan.body), verdict)
        plan.errors.update(_denials(verdict.strips))
        return plan
    if isinstance(plan, Forward):
        plan.merge = _amending(plan.merge, verdict)
    return plan


def _amending(merge: Callable[[Any, Any], Reply], verdict: Verdict) -> Callable[[Any, Any], Reply]:
    def amended_merge(plan: Forward[Any], answers: Any) -> Reply:
        reply = merge(plan, answers)
        reply.body = _amended(plan.header, _decoded(plan.header, reply.body), verdict)
        reply.errors.update(_denials(verdict.strips))
        return reply

    return amended_merge


def _denials(value: Any) -> Counter[tuple[int, int]]:
    """The error codes kfan answered (strips' entries, or a whole body), as a reply counts them: by code, broker -1."""
    if isinstance(value, list) and all(isinstance(s, Strip) for s in value):
        value = [entry for strip in value for entry in strip.answers.values()]
    return Counter((code, -1) for code in error_codes(value) if code)


def _decoded(hdr: RequestHeader, body: Parts) -> Struct:
    return decode_body(response_spec(hdr.api_key, hdr.api_version), b"".join(bytes(p) for p in body))


def _amended(hdr: RequestHeader, body: Struct, verdict: Verdict) -> Parts:
    # Entries found by key, each array indexed once: a batch of 10,000 groups costs 10,000 look-ups, not 10,000².
    index: dict[tuple[int, str, str], dict[Any, Struct]] = {}
    for strip in verdict.strips:
        parent = body
        for depth, (array, key, value) in enumerate(strip.response_within):
            table = index.get((id(parent), array, key))
            if table is None:
                # A copy, once: a blank answer's arrays are the schema's own zero values, shared by every blank.
                entries = parent[array] = list(parent.get(array) or [])
                table = index[(id(parent), array, key)] = {}
                for e in entries:
                    table.setdefault(e.get(key), e)
            entries = parent[array]
            found = table.get(value)
            if found is None:
                found = dict(
                    array_spec(response_spec(hdr.api_key, hdr.api_version), *(a for a, _, _ in strip.response_within[: depth + 1])).blank()
                )
                found[key] = value
                entries.append(found)
                table[value] = found
            parent = found
        parent[strip.response_array] = [*(parent.get(strip.response_array) or []), *strip.answers.values()]
    for amend in verdict.amend:
        body = amend(body)
    return response_body(hdr, body)


def _array_at(request: Struct, strip: Strip) -> list[Any]:
    entry: Any = request
    for array, index in strip.within:
        entry = entry[array][index]
    return list(entry.get(strip.array) or [])


def _stripped(request: Struct, strips: Iterable[Strip]) -> Struct:
    """The request without the stripped entries (copies along the paths; the client's struct is unchanged)."""
    out = dict(request)
    # Deepest first, so that indices of parents stay valid while their children are stripped.
    for strip in sorted(strips, key=lambda s: -len(s.within)):
        parent = out
        for array, index in strip.within:
            entries = list(parent[array])
            entries[index] = dict(entries[index])
            parent[array] = entries
            parent = entries[index]
        parent[strip.array] = [e for i, e in enumerate(parent.get(strip.array) or []) if i not in strip.answers]
    return out
