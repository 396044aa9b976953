"""Benchmark: consumer end-to-end latency through kfan vs direct, with slow brokers.

Six partitions over three brokers; brokers 2 and 3 answer every Fetch 300 ms
late (the embedded cluster's per-broker request delays). Records flow on
partition 0, led by broker 1, and a few on partition 1 (broker 2) to show the
slow broker's data still arrives. One run measures the direct path and the
path through kfan, and prints p50/p99 of produce-to-consume latency for both
and their difference. Not a test: figures, not pass/fail on timing.

    .venv/bin/python -m tests.bench.bench_fetch_latency [--records 300]
"""

from __future__ import annotations

import argparse
import statistics
import struct
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from backends.mock import MockCluster
from tests.support.kfan import start_kfan

FETCH = 1
SLOW_MS = 300
FETCH_WAIT_MS = 50


def measure(bootstrap: str, topic: str, records: int) -> tuple[list[float], int]:
    """Latencies (ms) of records on partition 0, and how many partition-1 records arrived."""
    # The mock holds an empty Fetch for the whole max_wait even when records
    # arrive meanwhile, so a short max_wait keeps the idle-poll floor low on both paths.
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": FETCH_WAIT_MS,
        }
    )
    consumer.assign([TopicPartition(topic, p, -1) for p in range(6)])  # from the end: only this run's records
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    # Let the consumer reach steady state (fetching, positions resolved).
    warm_until = time.monotonic() + 3
    while time.monotonic() < warm_until:
        consumer.poll(0.1)
    latencies: list[float] = []
    slow_seen = 0
    slow_sent = records // 20
    sent = 0
    deadline = time.monotonic() + records * 0.05 + 30
    next_send = time.monotonic()
    while (len(latencies) < records or slow_seen < slow_sent) and time.monotonic() < deadline:
        now = time.monotonic()
        if sent < records and now >= next_send:
            partition = 1 if sent % 20 == 0 and sent // 20 < slow_sent else 0
            producer.produce(topic, value=struct.pack(">d", time.time()), partition=partition)
            producer.poll(0)
            sent += 1
            next_send = now + 0.02
        m = consumer.poll(0.005)
        if m is None or m.error() is not None:
            continue
        if m.partition() == 0:
            latencies.append((time.time() - struct.unpack(">d", m.value())[0]) * 1000)
        elif m.partition() == 1:
            slow_seen += 1
    producer.flush(10)
    consumer.close()
    return latencies, slow_seen


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300)
    args = parser.parse_args()
    with MockCluster(3) as mock:
        topic = "latency"
        mock.create_topic(topic, 6)
        for broker in (2, 3):
            mock.push_broker_request_errors(broker, FETCH, [(0, SLOW_MS)] * 20_000)
        kfan = start_kfan(mock.bootstrap)
        try:
            rows = []
            for name, bootstrap in (("direct", mock.bootstrap), ("kfan", kfan.bootstrap)):
                latencies, slow_seen = measure(bootstrap, topic, args.records)
                rows.append((name, latencies, slow_seen))
        finally:
            kfan.stop()
    print(
        f"consumer end-to-end latency, partition 0 on broker 1; brokers 2,3 answer Fetch {SLOW_MS} ms late; "
        f"fetch.wait.max.ms={FETCH_WAIT_MS}"
    )
    print(f"{'path':8} {'records':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'broker-2 records':>17}")
    for name, latencies, slow_seen in rows:
        print(
            f"{name:8} {len(latencies):8d} {percentile(latencies, 50):8.1f} {percentile(latencies, 99):8.1f} "
            f"{max(latencies, default=float('nan')):8.1f} {slow_seen:>10d}/{args.records // 20}"
        )
    (_, direct, _), (_, proxied, _) = rows
    print(
        f"kfan - direct: p50 {percentile(proxied, 50) - percentile(direct, 50):+.1f} ms, "
        f"p99 {percentile(proxied, 99) - percentile(direct, 99):+.1f} ms"
    )


if __name__ == "__main__":
    main()
