"""Whole to any live broker: Metadata, FindCoordinator, DescribeCluster, the admin APIs.

The request goes as the client sent it to one live broker (the I/O layer
picks it, and asks another when a read-only request's broker fails). Admin
APIs a ZooKeeper-era broker serves only on its controller go to the
controller when it is known (the route's ``prefers_controller``). Answers
that name brokers are rewritten to name kfan (the route's ``rewrite``, see
:mod:`.identity`); a config request about kfan's own BROKER resource is
answered by a real broker standing in for it, and, with the cluster's ids,
one about a broker's by that broker.
"""

from __future__ import annotations

from typing import Any

from ..kafka import errors
from ..kafka.headers import RequestHeader
from ..kafka.schema import Struct, encode_body, response_spec
from ..kafka.wire import Malformed
from . import undecodable
from .answers import decode_answer, error_body, passthrough_body, reencoded, whole
from .identity import BROKER_RESOURCES, rewrite_config_resources
from .plan import ANY_BROKER, Answers, Context, Destination, Failed, FoldMetadata, Forward, Plan, RefreshTopology, Reply, Response, Route


def plan(route: Route[Any], ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    destination: Destination = ANY_BROKER
    sub = whole(hdr, payload)
    stand_in: str | None = None  # the real broker answering for kfan's own node id
    topology = ctx.topology
    if route.broker_configs is not None and ctx.identity.cluster_ids:
        # A broker's own configs are answered by that broker (any other refuses them, as Kafka's ConfigHelper does).
        named = [
            b for r in request["resources"] if r["resource_type"] in BROKER_RESOURCES and (b := _broker_id(r["resource_name"])) is not None
        ]
        if named and named[0] in topology.brokers:
            destination = named[0]
    elif route.broker_configs is not None and topology.brokers:
        kfan_name = str(ctx.identity.node_id)
        if any(r["resource_type"] in BROKER_RESOURCES and r["resource_name"] == kfan_name for r in request["resources"]):
            # Broker configs are answered by the broker they name; kfan's are a backend broker's.
            broker = min(topology.brokers)
            destination, stand_in = broker, str(broker)
            resources = [
                {**r, "resource_name": stand_in} if r["resource_type"] in BROKER_RESOURCES and r["resource_name"] == kfan_name else r
                for r in request["resources"]
            ]
            sub = reencoded(hdr, payload, {**request, "resources": resources})
    elif route.prefers_controller and topology.controller_id in topology.brokers:
        destination = topology.controller_id
    return Forward(hdr, True, route, ctx, request, {destination: sub}, merge, state=stand_in)


def _broker_id(resource_name: object) -> int | None:
    ok = isinstance(resource_name, str) and resource_name.isascii() and resource_name.isdigit() and len(resource_name) < 11
    return int(resource_name) if ok else None  # type: ignore[arg-type]


def merge(plan: Forward[str | None], answers: Answers) -> Reply:
    hdr = plan.header
    (answer,) = answers.values()
    if not isinstance(answer, Response):
        assert isinstance(answer, Failed)
        return Reply(error_body(hdr, answer.code), broker_failed=True)
    try:
        return _rewritten(plan, answer.payload)
    except Malformed as e:
        # The broker's answer does not parse: the request failed there.
        undecodable.note(answer.payload, e)
        return Reply(error_body(hdr, errors.NETWORK_EXCEPTION), [RefreshTopology()], broker_failed=True)


def _rewritten(plan: Forward[str | None], payload: memoryview | bytes) -> Reply:
    hdr = plan.header
    route = plan.route
    spec = response_spec(hdr.api_key, hdr.api_version)
    if route.rewrite is not None:
        body, effects = route.rewrite(plan.ctx, plan.request, decode_answer(hdr, payload), spec)
        if plan.ctx.client_identity:
            # Answered as the client: its errors are the client's, not the cluster's.
            effects = [FoldMetadata(e.metadata, described_only=True) if isinstance(e, FoldMetadata) else e for e in effects]
        return Reply(encode_body(spec, body), effects)
    stand_in = plan.state
    if stand_in is not None:
        assert route.broker_configs is not None
        body = rewrite_config_resources(decode_answer(hdr, payload), route.broker_configs, stand_in, str(plan.ctx.identity.node_id))
        return Reply(encode_body(spec, body))
    return Reply(passthrough_body(hdr, payload), [RefreshTopology()] if route.changes_topology else [])
