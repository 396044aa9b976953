"""The slow-broker Fetch phase of ``kfan bench``: consumer latency when some brokers are slow to answer Fetch.

Its own embedded cluster (three brokers) and its own kfan, so the injected
delays touch no other phase: brokers 2 and 3 answer every Fetch 300 ms late
(the mock's per-broker request delays). Records flow on partition 0, led by
broker 1; one in twenty goes to partition 1 (broker 2) to show the slow
broker's data still arrives. The figure is produce-to-consume latency of the
partition-0 records, as a consumer with ``fetch.wait.max.ms`` 50 sees it.

Each path has its own topic, producer and consumer, all started before the
measurement; the paths then take turns in blocks of 20 records, the order
swapped every block, so drift favours neither. Only the embedded cluster can
slow its brokers on demand: with ``--bootstrap`` this phase is skipped.
"""

from __future__ import annotations

import struct
import time
import uuid
from dataclasses import dataclass, field

from confluent_kafka import Consumer, Producer, TopicPartition

from proxy.kafka.apis import FETCH
from proxy.tools.bench.errors import BenchError
from proxy.tools.bench.measure import Update
from proxy.tools.bench.processes import ROOT, start_kfan

SLOW_MS = 300
SLOW_BROKERS = (2, 3)
FETCH_WAIT_MS = 50
PARTITIONS = 6
BLOCK = 20  # records per turn; the first of each goes to the slow broker's partition
SEND_INTERVAL_S = 0.02
WARMUP_S = 3.0
BLOCK_TIMEOUT_S = 10.0  # a block's partition-0 records must all arrive within this
SLOW_TIMEOUT_S = 10.0  # and the slow partition's, after the last block


@dataclass
class _Path:
    name: str
    topic: str
    producer: Producer
    consumer: Consumer
    latencies: list[float] = field(default_factory=list)
    slow_sent: int = 0
    slow_seen: int = 0

    def poll(self, timeout: float) -> None:
        m = self.consumer.poll(timeout)
        if m is None or m.error() is not None:
            return
        if m.partition() == 0:
            self.latencies.append((time.perf_counter() - struct.unpack(">d", m.value())[0]) * 1000)
        elif m.partition() == 1:
            self.slow_seen += 1


def measure(records: int, update: Update, broker_ids: str = "kfan") -> dict[str, list[float]]:
    """Produce-to-consume latencies (ms) of ``records`` partition-0 records per path ("direct", "kfan")."""
    from proxy.tools.mock_cluster import MockCluster

    with MockCluster(3) as mock:
        tag = uuid.uuid4().hex[:8]
        topics = {name: f"kfan-bench-slow-{name}-{tag}" for name in ("direct", "kfan")}
        for topic in topics.values():
            mock.create_topic(topic, PARTITIONS)  # partition 0 led by broker 1, partition 1 by broker 2
        for broker in SLOW_BROKERS:
            mock.push_broker_request_errors(broker, FETCH, [(0, SLOW_MS)] * 20_000)
        try:
            kfan = start_kfan(mock.bootstrap, "--broker-ids", broker_ids, log_level="WARNING", cwd=ROOT)
        except RuntimeError as e:
            raise BenchError(f"slow-broker fetch: {e}") from None
        paths: list[_Path] = []
        try:
            for name, bootstrap in (("direct", mock.bootstrap), ("kfan", kfan.bootstrap)):
                paths.append(_open(name, bootstrap, topics[name]))
            _run(paths, records, update)
            if not kfan.alive():
                raise BenchError("slow-broker fetch: its kfan exited:\n" + "".join(kfan.log[-20:]))
            latencies = {path.name: path.latencies for path in paths}
        finally:
            _close(paths)
            kfan.stop()
    return latencies


def _open(name: str, bootstrap: str, topic: str) -> _Path:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "kfan-bench",
            "group.id": f"kfan-bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            # The mock holds an empty Fetch for its whole max_wait even when records
            # arrive meanwhile: a short one keeps the idle-poll floor low on both paths.
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            "log.connection.close": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, -1) for p in range(PARTITIONS)])  # from the end
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": "kfan-bench", "linger.ms": 0, "log.connection.close": False})
    return _Path(name, topic, producer, consumer)


def _close(paths: list[_Path]) -> None:
    """Close the clients and drop them: they must be gone before the brokers, or they log failed reconnections to stderr."""
    for path in paths:
        path.producer.flush(5)
        path.consumer.close()
    paths.clear()


def _run(paths: list[_Path], records: int, update: Update) -> None:
    # Steady state first: positions resolved, fetching.
    warm_until = time.monotonic() + WARMUP_S
    while time.monotonic() < warm_until:
        for path in paths:
            path.poll(0.02)
    fast_sent = {path.name: 0 for path in paths}
    block = 0
    while min(fast_sent.values()) < records:
        for path in paths if block % 2 == 0 else paths[::-1]:
            if fast_sent[path.name] >= records:
                continue
            others = [p for p in paths if p is not path]
            n = min(BLOCK, records - fast_sent[path.name] + 1)
            next_send = time.monotonic()
            target = len(path.latencies) + n - 1
            for j in range(n):
                while time.monotonic() < next_send:
                    path.poll(0.005)
                    for other in others:
                        other.poll(0)
                partition = 1 if j == 0 else 0
                path.producer.produce(path.topic, struct.pack(">d", time.perf_counter()), partition=partition)
                path.producer.poll(0)
                if partition == 1:
                    path.slow_sent += 1
                else:
                    fast_sent[path.name] += 1
                next_send += SEND_INTERVAL_S
            deadline = time.monotonic() + BLOCK_TIMEOUT_S
            while len(path.latencies) < target:
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"slow-broker fetch ({path.name}): {target - len(path.latencies)} records on broker 1's partition"
                        f" not consumed within {BLOCK_TIMEOUT_S:.0f} s"
                    )
                path.poll(0.005)
        block += 1
        update(f"{min(fast_sent.values())}/{records} per path")
    deadline = time.monotonic() + SLOW_TIMEOUT_S
    while any(p.slow_seen < p.slow_sent for p in paths):
        if time.monotonic() > deadline:
            missing = ", ".join(f"{p.name} {p.slow_sent - p.slow_seen} of {p.slow_sent}" for p in paths if p.slow_seen < p.slow_sent)
            raise BenchError(f"slow-broker fetch: records on the slow broker's partition never arrived ({missing})")
        for path in paths:
            path.poll(0.01)
