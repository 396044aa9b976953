"""The one place effects are applied (:func:`proxy.server.effects.apply_effects`): each effect type reaches the one
object that keeps what it says, in the order the merge gave them, and an effect type it has no case for is
refused loudly instead of being ignored."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

import pytest

from proxy.core import (
    Coordinator,
    Effect,
    FetchAhead,
    FoldMetadata,
    ForgetCoordinators,
    ForgetReadReplicas,
    KeepShareSession,
    KeyType,
    LearnCoordinators,
    LearnReadReplicas,
    ProducerBatchesNotSent,
    RefreshTopology,
    RememberWatermarks,
    ReopenShareSessions,
    ShareSession,
    SubRequest,
)
from proxy.server.effects import apply_effects

GROUP = Coordinator(KeyType.GROUP, "orders")


class Recorder:
    """Stands in for the cluster, the coordinator view and the Fetch memory: every call, in order."""

    def __init__(self, calls: list[tuple[str, Any]], name: str) -> None:
        self._calls = calls
        self._name = name

    def __getattr__(self, attribute: str) -> Recorder:
        return Recorder(self._calls, f"{self._name}.{attribute}")  # a method, or an object kept there (its methods)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self._calls.append((self._name, args[0] if args else None))


SAMPLES: dict[type, tuple[Effect, str]] = {
    FoldMetadata: (FoldMetadata({"brokers": []}), "cluster.fold_metadata"),
    LearnCoordinators: (LearnCoordinators({GROUP: 2}), "coordinators.learn"),
    ForgetCoordinators: (ForgetCoordinators(frozenset({GROUP})), "coordinators.forget"),
    RefreshTopology: (RefreshTopology(), "cluster.request_refresh"),
    RememberWatermarks: (RememberWatermarks({("orders", 0): (5, 5, 0)}), "fetches.remember_watermarks"),
    FetchAhead: (FetchAhead({1: (SubRequest(1, 12, [b""], True), "key")}), "fetches.fetch_ahead"),
    LearnReadReplicas: (LearnReadReplicas({("zone-a", "orders", 0): 3}), "cluster.learn_read_replicas"),
    ForgetReadReplicas: (ForgetReadReplicas(frozenset({("zone-a", "orders", 0)})), "cluster.forget_read_replicas"),
    KeepShareSession: (KeepShareSession(("g", "m"), ShareSession(1, {}, {})), "fetches.keep_share_session"),
    ReopenShareSessions: (ReopenShareSessions(("g", "m"), frozenset({2})), "fetches.reopen_share_sessions"),
    ProducerBatchesNotSent: (ProducerBatchesNotSent({(4711, "orders", 0): (0, 0)}), "cluster.sequences.not_sent"),
}


def apply(effects: list[Any]) -> list[tuple[str, Any]]:
    calls: list[tuple[str, Any]] = []
    apply_effects(effects, Recorder(calls, "cluster"), Recorder(calls, "coordinators"), Recorder(calls, "fetches"))  # type: ignore[arg-type]
    return calls


def test_every_effect_type_has_its_case() -> None:
    assert set(SAMPLES) == set(typing.get_args(Effect)), "a sample per member of the Effect union"
    for kind, (effect, target) in SAMPLES.items():
        assert [name for name, _ in apply([effect])] == [target], kind.__name__


def test_effects_are_applied_in_the_order_the_merge_gave_them() -> None:
    effects = [e for e, _ in SAMPLES.values()]
    assert [name for name, _ in apply(effects)] == [target for _, target in SAMPLES.values()]


def test_an_effect_type_without_a_case_is_refused() -> None:
    @dataclass(frozen=True)
    class NewEffect:
        """An effect the core might grow: without a case in apply_effects it must not pass unnoticed."""

    with pytest.raises(AssertionError):
        apply([NewEffect()])
    with pytest.raises(AssertionError):
        apply([RefreshTopology(), object()])
