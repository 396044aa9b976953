"""A snapshot of the cluster behind kfan: brokers (and their racks), partition leaders and in-sync replicas, topic ids.

Pure data, built from Metadata responses (decoded dicts); no I/O here, so the
same snapshot drives the live proxy, the tests and the replay job. Snapshots
are immutable: an update returns a new one, so a request in flight keeps
routing against the snapshot it started with.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

NO_LEADER = -1


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class Topology:
    brokers: Mapping[int, Broker] = field(default_factory=dict)
    # topic name -> partition index -> leader id (NO_LEADER when none)
    leaders: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    topic_ids: Mapping[uuid.UUID, str] = field(default_factory=dict)
    cluster_id: str | None = None
    controller_id: int = NO_LEADER
    # topic name -> partition index -> the in-sync replicas (a follower to read from must be one)
    isr: Mapping[str, Mapping[int, frozenset[int]]] = field(default_factory=dict)
    # Brokers the Metadata listed before and lists no more, until the I/O layer forgets them: with the cluster's ids
    # a client is still shown them (kfan serves every id), so that it keeps its connection to that id and the
    # requests out on it. librdkafka drops a broker missing from Metadata and counts its requests in flight as not
    # written; through kfan they went to the partitions' live leaders, and an idempotent producer that sends them
    # again under new sequence numbers fails for good (OUT_OF_ORDER_SEQUENCE_NUMBER).
    departed: Mapping[int, Broker] = field(default_factory=dict)

    def leader(self, topic: str, partition: int) -> int | None:
        """The leading broker, or None when the partition or its leader is unknown."""
        leader = self.leaders.get(topic, {}).get(partition)
        if leader is None or leader not in self.brokers:
            return None
        return leader

    def absent_leaders(self) -> dict[int, int]:
        """Broker ids that lead partitions but are not among the brokers -> how many partitions each leads.

        Metadata lists live brokers only: a broker that is down still leads its
        partitions (until the controller moves them) but has no address.
        """
        out: dict[int, int] = {}
        for partitions in self.leaders.values():
            for leader in partitions.values():
                if leader != NO_LEADER and leader not in self.brokers:
                    out[leader] = out.get(leader, 0) + 1
        return out

    def can_read_from(self, topic: str, partition: int, replica: int) -> bool:
        """A live broker kfan can reach, in sync for the partition as far as the last Metadata said."""
        if replica not in self.brokers:
            return False
        isr = self.isr.get(topic, {}).get(partition)
        return isr is None or replica in isr

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        return self.topic_ids.get(topic_id)

    def knows_topic(self, topic: str) -> bool:
        return topic in self.leaders

    def with_metadata(self, response: Mapping[str, Any], *, described_only: bool = False) -> Topology:
        """Fold a decoded Metadata response in; topics it names are replaced.

        ``described_only``: only topics it describes without error are taken
        in; a topic it answers with an error keeps what the topology holds
        (the answer came with a client's identity, and a topic that client may
        not describe is still there for others).
        """
        brokers = {b["node_id"]: Broker(b["node_id"], b["host"], b["port"], b.get("rack")) for b in response["brokers"]}
        leaders = dict(self.leaders)
        topic_ids = dict(self.topic_ids)
        isr = dict(self.isr)
        for t in response["topics"]:
            name = t.get("name")
            if name is None or (described_only and t["error_code"] != 0):
                continue
            if t["error_code"] != 0 and not t["partitions"]:
                leaders.pop(name, None)
                isr.pop(name, None)
                continue
            leaders[name] = {p["partition_index"]: p["leader_id"] for p in t["partitions"]}
            isr[name] = {p["partition_index"]: frozenset(p.get("isr_nodes") or ()) for p in t["partitions"]}
            tid = t.get("topic_id")
            if tid is not None and tid.int != 0:
                topic_ids[tid] = name
        brokers = brokers or dict(self.brokers)
        return Topology(
            brokers=brokers,
            leaders=leaders,
            topic_ids=topic_ids,
            cluster_id=response.get("cluster_id", self.cluster_id),
            controller_id=response.get("controller_id", self.controller_id),
            isr=isr,
            departed={i: b for i, b in {**self.departed, **self.brokers}.items() if i not in brokers},
        )

    def refreshed_by(self, response: Mapping[str, Any]) -> Topology:
        """A refresh's whole answer: its topics replace all the snapshot holds; topic ids learned from clients'
        answers stay (older versions carry none) while their topics do; brokers it leaves out are departed."""
        return Topology(brokers=self.brokers, topic_ids=self.topic_ids, departed=self.departed).with_metadata(response).known_ids_only()

    def known_ids_only(self) -> Topology:
        """The same snapshot without the topic ids of topics it no longer holds (deleted since they were learned)."""
        ids = {tid: name for tid, name in self.topic_ids.items() if name in self.leaders}
        if len(ids) == len(self.topic_ids):
            return self
        return replace(self, topic_ids=ids)

    def forgetting(self, departed: Iterable[int]) -> Topology:
        """The same snapshot without these departed brokers (no longer shown to clients)."""
        gone = set(departed)
        if not gone & self.departed.keys():
            return self
        return replace(self, departed={i: b for i, b in self.departed.items() if i not in gone})

    def to_json(self) -> str:
        return json.dumps(
            {
                "brokers": [[b.node_id, b.host, b.port, b.rack] for b in self.brokers.values()],
                "leaders": {t: {str(p): lead for p, lead in ps.items()} for t, ps in self.leaders.items()},
                "topic_ids": {str(k): v for k, v in self.topic_ids.items()},
                "cluster_id": self.cluster_id,
                "controller_id": self.controller_id,
                "isr": {t: {str(p): sorted(nodes) for p, nodes in ps.items()} for t, ps in self.isr.items()},
                "departed": [[b.node_id, b.host, b.port, b.rack] for b in self.departed.values()],
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Topology:
        d = json.loads(text)
        return cls(
            brokers={b[0]: Broker(b[0], b[1], b[2], b[3]) for b in d["brokers"]},
            leaders={t: {int(p): lead for p, lead in ps.items()} for t, ps in d["leaders"].items()},
            topic_ids={uuid.UUID(k): v for k, v in d["topic_ids"].items()},
            cluster_id=d["cluster_id"],
            controller_id=d["controller_id"],
            # Captures made before kfan read from followers have none.
            isr={t: {int(p): frozenset(nodes) for p, nodes in ps.items()} for t, ps in d.get("isr", {}).items()},
            departed={b[0]: Broker(b[0], b[1], b[2], b[3]) for b in d.get("departed", ())},  # captures before it: none
        )
