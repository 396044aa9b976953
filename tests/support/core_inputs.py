"""What the sans-IO core tests feed the core: kfan's identity, three brokers, and every version kfan knows of each API it routes;
small readers of what the core gives back (a plan's body, a reply's effects, whether a Fetch is satisfied), and
the README's name for each route's policy."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

from proxy.core import (
    ROUTES,
    BrokerAnswer,
    Destination,
    Effect,
    Forward,
    Identity,
    KeepShareSession,
    LocalReply,
    Plan,
    ReopenShareSessions,
    Reply,
    Route,
    ShareKey,
    ShareSession,
    any_broker,
    broadcast,
    coordinator,
    fetch,
    fetch_wait,
    leader,
    local,
    produce,
    share,
)
from proxy.core.topology import Broker, Topology
from proxy.kafka import schema
from proxy.kafka.headers import RequestHeader
from proxy.kafka.wire import Parts

IDENTITY = Identity(node_id=42, host="kfan.example", port=19092)
BROKERS = {i: Broker(i, f"broker{i}.internal", 9000 + i) for i in (1, 2, 3)}
ALL_VERSIONS = {k: (r.start, r.stop - 1) for k in ROUTES if (r := schema.known_versions(k))}  # api key -> (lowest, highest)


def body_of(plan: Plan, answers: Mapping[Destination, BrokerAnswer] | None = None) -> Parts:
    """The client's response body: a local reply's, or the merge of ``answers``."""
    if isinstance(plan, LocalReply):
        return plan.body
    assert isinstance(plan, Forward), plan
    return plan.merge(plan, answers or {}).body


E = TypeVar("E", bound=Effect)


def effects_of(reply: Reply, kind: type[E]) -> list[E]:
    """The reply's effects of one kind, in order."""
    return [e for e in reply.effects if isinstance(e, kind)]


def keep_share_sessions(sessions: dict[ShareKey, ShareSession], effects: Iterable[Effect]) -> None:
    """Apply ``effects``' share-session changes to ``sessions`` as a connection keeps them (:class:`proxy.server.fetches.Fetches`)."""
    for e in effects:
        if isinstance(e, KeepShareSession):
            if e.session is None:
                sessions.pop(e.key, None)
            else:
                sessions[e.key] = e.session
        elif isinstance(e, ReopenShareSessions) and e.key in sessions:
            sessions[e.key] = share.reopened(sessions[e.key], e.brokers)


def satisfied(hdr: RequestHeader, answers: Mapping[Destination, BrokerAnswer], min_bytes: int) -> bool:
    """Would a broker answer this Fetch now: ``min_bytes`` of records in, or an error to report?"""
    return fetch_wait.enough((fetch_wait.weigh(hdr, a) for a in answers.values()), min_bytes)


def without_topics(topology: Topology, names: Iterable[str]) -> Topology:
    """``topology`` as if these topics were deleted: their leaders and in-sync replicas gone."""
    gone = set(names)
    leaders = {k: v for k, v in topology.leaders.items() if k not in gone}
    isr = {k: v for k, v in topology.isr.items() if k not in gone}
    return Topology(topology.brokers, leaders, topology.topic_ids, topology.cluster_id, topology.controller_id, isr)


# The README's names for the planners' policies.
_POLICIES = {
    local.plan: "local",
    local.login: "local",  # answered by kfan's login exchange (when it authenticates clients)
    local.telemetry: "local",  # answered by kfan's client telemetry (when it has subscriptions)
    share.plan: "share",
    leader.plan: "leader",
    produce.plan: "leader",
    fetch.plan: "leader",
    coordinator.plan: "coordinator",
    broadcast.plan: "every broker",
    any_broker.plan: "any",
}


def policy(route: Route) -> str:
    """The routing policy's name, as the README's API table gives it."""
    return _POLICIES[route.plan]
