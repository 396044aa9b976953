"""What the sans-IO core tests feed the core: kfan's identity, three brokers, and every version kfan knows of each API it routes;
and small readers of what the core gives back (a plan's body, a reply's effects)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from proxy.core import ROUTES, BrokerAnswer, Destination, Effect, Forward, Identity, LocalReply, Plan, Reply
from proxy.core.topology import Broker
from proxy.kafka import schema
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
