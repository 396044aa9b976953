"""What a merge asks of the world, done: the one place a :data:`proxy.core.Effect` is applied.

The core's merges return effects as values (:mod:`proxy.core.plan`); this
module applies each one, the cluster's to the control plane
(:class:`backends.cluster.Cluster`) and the connection's coordinator view,
a connection's own to its Fetch memory (:class:`FetchMemory`: watermarks, sub-fetches sent ahead, share sessions). One
exhaustive ``match``: a new effect type without a case here is a type error
for a checker and an ``AssertionError`` at run time, never ignored.

Boundaries: no decision is made here; each case hands its effect's values
to the one object that keeps them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, assert_never

from backends.cluster import Cluster
from backends.coordinators import Coordinators
from proxy.core import (
    Effect,
    FetchAhead,
    FoldMetadata,
    ForgetCoordinators,
    ForgetReadReplicas,
    KeepShareSession,
    LearnCoordinators,
    LearnReadReplicas,
    ProducerBatchesNotSent,
    RefreshTopology,
    RememberWatermarks,
    ReopenShareSessions,
    ShareKey,
    ShareSession,
    Watermarks,
)
from proxy.core.layout import TopicPartition


class FetchMemory(Protocol):
    """What one client connection keeps between its Fetches (:class:`proxy.server.fetches.Fetches`)."""

    def remember_watermarks(self, watermarks: Mapping[TopicPartition, Watermarks]) -> None: ...

    def fetch_ahead(self, ahead: FetchAhead) -> None: ...

    def keep_share_session(self, key: ShareKey, session: ShareSession | None) -> None: ...

    def reopen_share_sessions(self, key: ShareKey, brokers: frozenset[int]) -> None: ...


def apply_effects(effects: Iterable[Effect], cluster: Cluster, coordinators: Coordinators, fetches: FetchMemory) -> None:
    """Apply ``effects`` in order. ``coordinators``: the connection's view of the cache (its own with
    ``--broker-identity client``, else kfan's); ``fetches``: the connection's Fetch memory."""
    for effect in effects:
        match effect:
            case FoldMetadata():
                cluster.fold_metadata(effect.metadata, described_only=effect.described_only)
            case LearnCoordinators():
                coordinators.learn(effect.coordinators)
            case ForgetCoordinators():
                for c in effect.coordinators:
                    coordinators.forget(c)
            case RefreshTopology():
                cluster.request_refresh()
            case LearnReadReplicas():
                cluster.learn_read_replicas(effect.replicas)
            case ForgetReadReplicas():
                cluster.forget_read_replicas(effect.keys)
            case RememberWatermarks():
                fetches.remember_watermarks(effect.watermarks)
            case FetchAhead():
                fetches.fetch_ahead(effect)
            case KeepShareSession():
                fetches.keep_share_session(effect.key, effect.session)
            case ReopenShareSessions():
                fetches.reopen_share_sessions(effect.key, effect.brokers)
            case ProducerBatchesNotSent():
                cluster.sequences.not_sent(effect.batches)
            case _:
                assert_never(effect)
