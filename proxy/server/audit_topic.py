"""The audit log written to a Kafka topic on the cluster kfan serves (``--audit-topic``) (trio).

Each batch of events is one record batch (one record per event, keyless,
uncompressed), produced with acks=all by kfan's own identity to the next
partition in turn, so that the audit log is as durable as the cluster's
data. A topic that does not exist is created once (the brokers' default
partitions and replication). A batch that cannot be written (no leader, a
broker's error) raises :class:`OSError`: the audit log counts its events as
dropped and logs why (:mod:`proxy.runtime.audit`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

from backends.cluster import Cluster
from proxy.kafka import apis, errors
from proxy.kafka.headers import decode_response
from proxy.kafka.records import record_batch

MAX_BATCH_BYTES = 512 * 1024  # under a broker's default message.max.bytes (1 MiB), with room


class TopicSink:
    """Audit lines produced to ``topic``; :attr:`cluster` is set once kfan's cluster runs."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.cluster: Cluster | None = None
        self._next = itertools.count()
        self._created = False

    def reopen(self) -> None:
        pass  # nothing to reopen: a topic is not a file logrotate moves

    def close(self) -> None:
        pass

    async def write(self, lines: Sequence[str]) -> None:
        chunk: list[bytes] = []
        size = 0
        for line in lines:
            value = line.encode()
            if chunk and size + len(value) > MAX_BATCH_BYTES:
                await self._produce(chunk)
                chunk, size = [], 0
            chunk.append(value)
            size += len(value) + 16
        if chunk:
            await self._produce(chunk)

    async def _produce(self, values: list[bytes]) -> None:
        cluster = self.cluster
        if cluster is None:
            raise OSError("the cluster is not known yet")
        partitions = cluster.topology.leaders.get(self.topic)
        if not partitions:
            await self._create(cluster)
            partitions = cluster.topology.leaders.get(self.topic)
            if not partitions:
                raise OSError(f"audit topic {self.topic!r} has no partitions yet")
        indexes = sorted(partitions)
        partition = indexes[next(self._next) % len(indexes)]
        leader = cluster.topology.leader(self.topic, partition)
        if leader is None:
            raise OSError(f"audit topic {self.topic!r} partition {partition} has no leader")
        lo, hi = cluster.broker_versions.get(leader, {}).get(apis.PRODUCE, (3, 9))
        version = max(lo, min(hi, 12))  # v13 names topics by id
        batch = record_batch(values, int(time.time() * 1000))
        body = {
            "transactional_id": None,
            "acks": -1,
            "timeout": 30_000,
            "topic_data": [{"name": self.topic, "partition_data": [{"index": partition, "records": batch}]}],
        }
        try:
            answer = decode_response(await cluster.call(leader, apis.PRODUCE, version, body), apis.PRODUCE, version)
        except Exception as e:  # a link failure, a timeout, an undecodable answer
            cluster.request_refresh()
            raise OSError(f"audit topic {self.topic!r}: {e!r}") from e
        for t in answer["responses"]:
            for p in t["partition_responses"]:
                if p["error_code"] != errors.NONE:
                    cluster.request_refresh()
                    raise OSError(f"audit topic {self.topic!r} partition {partition}: error code {p['error_code']}")

    async def _create(self, cluster: Cluster) -> None:
        """Create the topic once (a broker's defaults), then learn where it is."""
        if not self._created:
            self._created = True
            broker = cluster.any_broker()
            if broker is not None:
                lo, hi = cluster.broker_versions.get(broker, {}).get(apis.CREATE_TOPICS, (2, 7))
                version = max(lo, min(hi, 7))
                body = {
                    "topics": [{"name": self.topic, "num_partitions": -1, "replication_factor": -1, "assignments": [], "configs": []}],
                    "timeout": 30_000,
                    "validate_only": False,
                }
                try:
                    await cluster.call(broker, apis.CREATE_TOPICS, version, body)
                except Exception as e:
                    raise OSError(f"audit topic {self.topic!r} could not be created: {e!r}") from e
        await cluster.refresh(timeout=5.0)
