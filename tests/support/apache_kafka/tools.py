"""Kafka's own command-line tools (``kafka-tools``), run as ``java -cp <jars> <main class> ...``.

What ``bin/kafka-topics.sh`` and its siblings run, without the scripts (they
are not on Maven Central): the same main classes, the same arguments.
"""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tests.support.apache_kafka.distribution import CLIENT_JVM, KAFKA_4, classpath, dumping_classes

MAIN = {
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-configs": "org.apache.kafka.tools.ConfigCommand",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-acls": "org.apache.kafka.tools.AclCommand",
    "kafka-delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "kafka-leader-election": "org.apache.kafka.tools.LeaderElectionCommand",
    "kafka-reassign-partitions": "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
    "kafka-log-dirs": "org.apache.kafka.tools.LogDirsCommand",
    "kafka-producer-perf-test": "org.apache.kafka.tools.ProducerPerformance",
    "kafka-consumer-perf-test": "org.apache.kafka.tools.ConsumerPerformance",
    "kafka-metadata-quorum": "org.apache.kafka.tools.MetadataQuorumCommand",
    "kafka-jmx": "org.apache.kafka.tools.JmxTool",
    "kafka-share-groups": "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
    "kafka-console-share-consumer": "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
    "kafka-features": "org.apache.kafka.tools.FeatureCommand",
    "kafka-client-metrics": "org.apache.kafka.tools.ClientMetricsCommand",
    "kafka-delegation-tokens": "org.apache.kafka.tools.DelegationTokenCommand",
    "kafka-streams-groups": "org.apache.kafka.tools.streams.StreamsGroupCommand",  # what ``kafka-run-class kafka.tools.JmxTool`` runs
}
TIMEOUT_S = 120.0


@dataclass
class Ran:
    code: int
    out: str
    err: str


def run_tool(tool: str, *args: str, version: str = KAFKA_4, check: bool = True) -> Ran:
    """Run ``tool`` (its script's name) with ``args``; ``check``: fail with its output unless it exits 0."""
    java = shutil.which("java") or "java"
    with dumping_classes(version) as cds:
        argv = [java, *CLIENT_JVM, *cds, "-cp", classpath(version), MAIN[tool], *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    ran = Ran(done.returncode, done.stdout, done.stderr)
    if check and done.returncode != 0:
        raise AssertionError(f"{tool} {' '.join(args)}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return ran


def run_tools(*runs: tuple[str, ...], check: bool = True) -> list[Ran]:
    """Several tool runs at once, each ``(tool, *args)``; their results in the same order.

    A tool's JVM spends most of its seconds starting up, so two of them side by
    side (the same command directly and through kfan) take little longer than one.
    """
    with ThreadPoolExecutor(len(runs)) as pool:
        return list(pool.map(lambda run: run_tool(*run, check=check), runs))
