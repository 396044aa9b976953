"""Split a partition-keyed message by leader, and merge the answers back.

Partition-keyed APIs share one shape: an array of topics (keyed by name or,
in newer versions, topic id), each with an array of partitions (structs with
an index field, or bare int32 indexes). :class:`Layout` names those fields for
one message; :func:`split` and :func:`merge` work on any such layout, so
Produce, Fetch, ListOffsets, OffsetForLeaderEpoch, DeleteRecords and
DescribeProducers share one implementation. Pure functions over decoded dicts.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..kafka.schema import Struct, StructSpec

TopicKey = str | uuid.UUID
TopicPartition = tuple[TopicKey, int]
T = TypeVar("T", bound=Hashable)  # where a partition goes (a broker id, for a split by leader)


@dataclass(frozen=True, slots=True)
class Layout:
    """Where partitions sit in one message: ``topics[topic_key].partitions[index]``."""

    topics: str
    topic_key: str
    partitions: str
    index: str | None  # None: partitions are bare int32 indexes
    topic_spec: StructSpec
    partition_spec: StructSpec | None

    @classmethod
    def of(cls, spec: StructSpec, topics: str, partitions: str, index: str | None) -> Layout:
        tspec = spec.field(topics).struct
        assert tspec is not None
        key = next(k for k in ("topic_id", "name", "topic") if tspec.has(k))
        return cls(topics, key, partitions, index, tspec, tspec.field(partitions).struct)

    def partition_index(self, entry: Any) -> int:
        return entry if self.index is None else entry[self.index]

    def entries(self, message: Struct) -> Iterator[tuple[TopicKey, Any]]:
        for t in message[self.topics]:
            for p in t[self.partitions]:
                yield t[self.topic_key], p

    def keys(self, message: Struct) -> list[TopicPartition]:
        return [(k, self.partition_index(p)) for k, p in self.entries(message)]


def split(
    message: Struct,
    layout: Layout,
    route: Callable[[TopicKey, int], T | None],
) -> tuple[dict[T, Struct], list[TopicPartition]]:
    """Group the message's partitions by ``route`` (the leader), in client order.

    Each sub-message keeps every other field of the original verbatim. Returns
    the sub-messages and the partitions that have no route (unknown leader).
    """
    # Per target, topic entries in client order; a topic the client names twice
    # stays two entries, so every sub-request keeps the client's exact order.
    by_target: dict[T, list[Struct]] = {}
    unroutable: list[TopicPartition] = []
    for t in message[layout.topics]:
        key = t[layout.topic_key]
        groups: dict[T, list[Any]] = {}
        for p in t[layout.partitions]:
            index = layout.partition_index(p)
            target = route(key, index)
            if target is None:
                unroutable.append((key, index))
            else:
                groups.setdefault(target, []).append(p)
        for target, ps in groups.items():
            by_target.setdefault(target, []).append({**t, layout.partitions: ps})
    subs: dict[T, Struct] = {}
    for target, topics in by_target.items():
        sub = dict(message)
        sub[layout.topics] = topics
        subs[target] = sub
    return subs, unroutable


def merge(
    request: Struct,
    request_layout: Layout,
    answers: Mapping[T, Struct],
    response_layout: Layout,
    error_of: Callable[[TopicPartition], int],
) -> list[Struct]:
    """The response's topics array, one entry per requested partition, in client order.

    Partitions the answers do not carry (a failed broker, no leader) get an
    entry built from the schema with ``error_of(partition)`` as error code;
    partitions the answers carry but the client did not ask for are dropped.
    """
    found: dict[TopicPartition, Any] = {}
    topic_fields: dict[TopicKey, Struct] = {}
    for answer in answers.values():
        for t in answer[response_layout.topics]:
            key = t[response_layout.topic_key]
            topic_fields.setdefault(key, t)
            for p in t[response_layout.partitions]:
                found.setdefault((key, response_layout.partition_index(p)), p)
    out: list[Struct] = []
    for t in request[request_layout.topics]:
        key = t[request_layout.topic_key]
        partitions = []
        for p in t[request_layout.partitions]:
            tp = (key, request_layout.partition_index(p))
            entry = found.get(tp)
            if entry is None:
                entry = error_entry(response_layout, tp[1], error_of(tp))
            partitions.append(entry)
        base = topic_fields.get(key)
        topic = dict(base) if base is not None else {**response_layout.topic_spec.blank(), response_layout.topic_key: key}
        topic[response_layout.partitions] = partitions
        out.append(topic)
    return out


def error_entry(layout: Layout, index: int, error_code: int) -> Any:
    if layout.partition_spec is None:
        return index
    entry = layout.partition_spec.blank()
    entry[layout.index or "partition_index"] = index
    for name in ("error_code", "partition_error_code"):
        if name in entry:
            entry[name] = error_code
    if "records" in entry:
        entry["records"] = b""  # brokers send empty record sets with errors, not null
    return entry
