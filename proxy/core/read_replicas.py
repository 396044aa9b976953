"""Preferred read replicas (KIP-392): the replica a partition's leader named for a rack.

A leader that serves a rack-aware replica selector answers a Fetch carrying a
``rack_id`` with a ``preferred_read_replica`` and no records; the consumer is
to fetch that partition from the replica from then on. Clients see kfan as
their only broker, so kfan follows the preference for them: it remembers it
here, per rack and partition (a client's own rack gets its own replicas), and
routes the partition's next sub-fetches there (:mod:`.fetch`).

A preference ends as Kafka's consumer ends it: when the replica answers an
error or fails, and after ``max_age`` (the consumer's ``metadata.max.age.ms``),
so that a leader that would now choose otherwise is asked again. The store is
bounded: racks come from clients, so the oldest preferences go first beyond
``max_entries``. Pure: the caller passes the time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# rack (the client's, or kfan's own; "" when neither is set), topic name, partition index
ReadReplicaKey = tuple[str, str, int]


class ReadReplicas:
    def __init__(self, max_age: float, max_entries: int = 100_000) -> None:
        self.max_age = max_age
        self.max_entries = max_entries
        self._learned: dict[ReadReplicaKey, tuple[int, float]] = {}  # in the order learned, oldest first

    def get(self, key: ReadReplicaKey, now: float) -> int | None:
        """The replica to fetch this partition from for this rack; None: its leader."""
        entry = self._learned.get(key)
        if entry is None:
            return None
        replica, learned_at = entry
        if now - learned_at >= self.max_age:
            del self._learned[key]
            return None
        return replica

    def learn(self, replicas: Mapping[ReadReplicaKey, int], now: float) -> None:
        for key, replica in replicas.items():
            self._learned.pop(key, None)  # learned again: it is the newest now
            self._learned[key] = (replica, now)
        while len(self._learned) > self.max_entries:
            del self._learned[next(iter(self._learned))]

    def forget(self, keys: Iterable[ReadReplicaKey]) -> None:
        for key in keys:
            self._learned.pop(key, None)

    def __len__(self) -> int:
        return len(self._learned)
