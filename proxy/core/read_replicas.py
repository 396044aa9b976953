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
``max_entries`` or ``max_bytes``, and a rack longer than
:data:`MAX_RACK_CHARS` is not remembered at all (its partitions are fetched
from their leaders). Pure: the caller passes the time.

Shared by every connection, whatever identity the brokers see it as: a
preference is a fact of the cluster (where a rack's replica is), and a
client is still answered by the replica as its own authorization says.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping

# rack (the client's, or kfan's own; "" when neither is set), topic name, partition index
ReadReplicaKey = tuple[str, str, int]

# Rack ids are short names (an availability zone); a client's longer one is never kept.
MAX_RACK_CHARS = 255
# An entry's memory beside its rack and topic strings: the dict slot, the key and value tuples (measured, rounded up).
_ENTRY_OVERHEAD = 250


def entry_bytes(key: ReadReplicaKey) -> int:
    return sys.getsizeof(key[0]) + sys.getsizeof(key[1]) + _ENTRY_OVERHEAD


class ReadReplicas:
    def __init__(self, max_age: float, max_entries: int = 100_000, max_bytes: int = 16 * 1024 * 1024) -> None:
        self.max_age = max_age
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0  # what the entries cost, as ``max_bytes`` counts it
        self.evictions = 0
        self._learned: dict[ReadReplicaKey, tuple[int, float]] = {}  # in the order learned, oldest first

    def get(self, key: ReadReplicaKey, now: float) -> int | None:
        """The replica to fetch this partition from for this rack; None: its leader."""
        entry = self._learned.get(key)
        if entry is None:
            return None
        replica, learned_at = entry
        if now - learned_at >= self.max_age:
            self._drop(key)
            return None
        return replica

    def learn(self, replicas: Mapping[ReadReplicaKey, int], now: float) -> None:
        for key, replica in replicas.items():
            if len(key[0]) > MAX_RACK_CHARS:
                continue
            self._drop(key)  # learned again: it is the newest now
            self._learned[key] = (replica, now)
            self.bytes += entry_bytes(key)
        while len(self._learned) > self.max_entries or self.bytes > self.max_bytes:
            self._drop(next(iter(self._learned)))
            self.evictions += 1

    def forget(self, keys: Iterable[ReadReplicaKey]) -> None:
        for key in keys:
            self._drop(key)

    def _drop(self, key: ReadReplicaKey) -> None:
        if self._learned.pop(key, None) is not None:
            self.bytes -= entry_bytes(key)

    def __len__(self) -> int:
        return len(self._learned)
