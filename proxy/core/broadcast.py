"""Ask every broker: ListGroups, ListTransactions, DescribeLogDirs.

Each broker coordinates or stores its own share, so the request goes whole
to every broker and the answers' arrays (the route's ``broadcast_array``)
are concatenated. A broker that fails leaves part of the list missing: the
answer says so with a retriable top-level error. DescribeLogDirs has a merge
of its own (:mod:`.log_dirs`).
"""

from __future__ import annotations

from typing import Any

from ..kafka import errors
from ..kafka.headers import RequestHeader
from ..kafka.schema import Struct, encode_body, response_spec
from . import any_broker
from .answers import decode_answers, whole
from .plan import Answers, BrokerUnavailable, Context, Forward, Plan, Reply, Route


def plan(route: Route[Any], ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    brokers = sorted(ctx.topology.brokers)
    if not brokers:
        return any_broker.plan(route, ctx, hdr, payload, request)
    assert route.merge is not None
    return Forward(hdr, True, route, ctx, request, {b: whole(hdr, payload) for b in brokers}, route.merge, state=brokers)


def merge(plan: Forward[list[int]], answers: Answers) -> Reply:
    hdr = plan.header
    array = plan.route.broadcast_array
    assert array is not None
    spec = response_spec(hdr.api_key, hdr.api_version)
    body = spec.blank()
    merged: list[Any] = []
    unknown_filters: list[str] = []
    decoded = decode_answers(hdr, answers, errors.COORDINATOR_NOT_AVAILABLE)
    throttle = error = 0
    for broker in plan.state:
        d = decoded.bodies.get(broker)
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
    return Reply(encode_body(spec, body))
