"""Produce's own rules, on top of the split by leader.

acks=0: the client expects no response, so none is written (the request
still holds its place in the response order), and the brokers are not
expected to answer either. A broker that fails under a Produce is reported
so that every client retries without losing or doubling a batch it cannot
know the fate of (see :data:`FAILURE`).
"""

from __future__ import annotations

from ..kafka import errors
from ..kafka.headers import RequestHeader
from ..kafka.schema import Struct
from . import leader
from .plan import BrokerFailure, Context, Plan, Route

# NETWORK_EXCEPTION is the general answer for a failed broker, but librdkafka
# fails a produced batch for good on it. So a Produce that reached the broker
# gets REQUEST_TIMED_OUT ("maybe written", retried by every client), and one
# that never left kfan NOT_LEADER_OR_FOLLOWER ("not written": refresh, retry).
FAILURE = BrokerFailure(written=errors.REQUEST_TIMED_OUT, unwritten=errors.NOT_LEADER_OR_FOLLOWER)


def plan(route: Route, ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    expect = request["acks"] != 0
    return leader.plan_split(route, ctx, hdr, payload, leader.split(route, ctx, hdr, request), expect)
