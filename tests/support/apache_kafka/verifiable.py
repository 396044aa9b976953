"""Kafka's own verifiable clients, run as Kafka's system tests run them, and the verdict they give.

``VerifiableProducer`` (kafka-tools) produces increasing integers and prints a
JSON line for every acknowledged (``producer_send_success``: partition, offset)
or failed send; ``VerifiableConsumer`` consumes in a group, commits after each
poll and, with ``--verbose``, prints every record it got (``record_data``).
Kafka's system tests (``tests/kafkatest``: ProduceConsumeValidateTest) judge a
fault by them: every acknowledged value must be consumed. :func:`verdict`
says that and more: values written twice (at two offsets, which idempotence
forbids), partitions whose offsets do not follow the order of the values, and
the longest time no send was acknowledged.

Each client is its own JVM (client compiler only: they run for seconds to
minutes at a few hundred records a second). A reader thread collects its
events while it runs; :meth:`_Tool.stop` sends SIGTERM, on which both tools
close their client (the producer flushes what it holds) and say
``shutdown_complete``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.apache_kafka.distribution import CLIENT_JVM, KAFKA_4, classpath, shared_classes
from tests.support.processes import stop_process
from tests.support.waiting import wait_for

PRODUCER = "org.apache.kafka.tools.VerifiableProducer"
CONSUMER = "org.apache.kafka.tools.VerifiableConsumer"
# A producer that rides out faults as applications configure one: retries until the delivery timeout,
# idempotent (no duplicates, order kept per partition), acks from every in-sync replica.
RELIABLE_PRODUCER = {
    "acks": "all",
    "enable.idempotence": "true",
    "retries": "2147483647",
    "delivery.timeout.ms": "120000",
    "request.timeout.ms": "15000",
    "max.in.flight.requests.per.connection": "5",
    "linger.ms": "5",
}


class _Tool:
    def __init__(self, main: str, args: list[str], config: dict[str, str], workdir: Path, name: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.config_path = workdir / f"{name}.properties"
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
        self.log_path = workdir / f"{name}.log"
        self.events: list[dict[str, Any]] = []
        self.other_lines = 0  # log lines and anything else that is not an event
        java = shutil.which("java") or "java"
        self._argv = [java, *CLIENT_JVM, *shared_classes(KAFKA_4), "-cp", classpath(KAFKA_4), main, *args]
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        err = open(self.log_path, "a")  # noqa: SIM115 (the child writes to it until it ends)
        self._process = subprocess.Popen(self._argv, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1)
        err.close()
        self._reader = threading.Thread(target=self._read, name=f"{self.name} events", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        with open(self.log_path, "a") as log:
            for line in self._process.stdout:
                try:
                    event = json.loads(line) if line.startswith("{") else None
                except json.JSONDecodeError:
                    event = None
                if isinstance(event, dict) and "name" in event:
                    with self._lock:
                        self.events.append(event)
                else:
                    self.other_lines += 1
                    log.write(line)

    def named(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e["name"] == name]

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM: the tool closes its client and says ``shutdown_complete`` (SIGKILL past ``timeout``)."""
        if self._process is None:
            return
        stop_process(self._process, timeout)
        if self._reader is not None:
            self._reader.join(10)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:]) if self.log_path.exists() else ""


class VerifiableProducer(_Tool):
    """Sends ``throughput`` increasing integers a second to ``topic`` until stopped."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        workdir: Path,
        *,
        throughput: int = 300,
        config: dict[str, str] | None = None,
        name: str = "producer",
    ) -> None:
        args = ["--bootstrap-server", bootstrap, "--topic", topic, "--throughput", str(throughput), "--acks", "-1"]
        super().__init__(
            PRODUCER, [*args, "--command-config", str(workdir / f"{name}.properties")], config or RELIABLE_PRODUCER, workdir, name
        )

    def acked(self) -> int:
        with self._lock:
            return sum(1 for e in self.events if e["name"] == "producer_send_success")


class VerifiableConsumer(_Tool):
    """A member of ``group`` consuming ``topic`` from the earliest offset, committing after every poll, printing every record."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        workdir: Path,
        *,
        protocol: str = "classic",
        config: dict[str, str] | None = None,
        name: str = "consumer",
    ) -> None:
        args = ["--bootstrap-server", bootstrap, "--topic", topic, "--group-id", group, "--group-protocol", protocol]
        args += ["--verbose", "--reset-policy", "earliest", "--command-config", str(workdir / f"{name}.properties")]
        if protocol == "classic":
            args += ["--session-timeout", "10000"]
        super().__init__(CONSUMER, args, config or {}, workdir, name)

    def consumed(self) -> int:
        with self._lock:
            return sum(1 for e in self.events if e["name"] == "record_data")

    def values(self) -> set[str]:
        with self._lock:
            return {e["value"] for e in self.events if e["name"] == "record_data"}


@dataclass
class Verdict:
    """What Kafka's system tests check, and what the closing table reports."""

    acked: int
    consumed: int  # records the consumer got, redeliveries included
    lost: list[str]  # acknowledged values never consumed
    written_twice: list[str]  # values at two or more offsets (a producer duplicate)
    out_of_order: list[int]  # partitions where a higher offset holds a lower value
    send_errors: Counter[str] = field(default_factory=Counter)  # failed sends by exception, as the producer saw them
    longest_stall_ms: int = 0  # the longest time between two acknowledgements
    commit_failures: int = 0
    aborted_seen: list[str] = field(default_factory=list)  # values of aborted transactions a read_committed consumer got

    def row(self) -> str:
        errors = sum(self.send_errors.values())
        return (
            f"acked {self.acked}, consumed {self.consumed}, lost {len(self.lost)}, duplicates {len(self.written_twice)}, "
            f"out of order {len(self.out_of_order)}, send errors {errors}, failed commits {self.commit_failures}, "
            f"longest produce stall {self.longest_stall_ms} ms" + (f", aborted seen {len(self.aborted_seen)}" if self.aborted_seen else "")
        )


def verdict(producer: VerifiableProducer, consumer: VerifiableConsumer) -> Verdict:
    successes = producer.named("producer_send_success")
    where: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for e in successes:
        where[e["value"]].add((e["partition"], e["offset"]))
    records = consumer.named("record_data")
    for e in records:
        where[e["value"]].add((e["partition"], e["offset"]))
    consumed = {e["value"] for e in records}
    lost = sorted((v for v in {e["value"] for e in successes} - consumed), key=int)
    twice = sorted((v for v, places in where.items() if len(places) > 1), key=int)
    by_partition: dict[int, dict[int, int]] = defaultdict(dict)
    for e in [*successes, *records]:
        by_partition[e["partition"]][e["offset"]] = int(e["value"])
    out_of_order = []
    for partition, values in sorted(by_partition.items()):
        in_offset_order = [values[o] for o in sorted(values)]
        if in_offset_order != sorted(in_offset_order):
            out_of_order.append(partition)
    times = sorted(e["timestamp"] for e in successes)
    stall = max((b - a for a, b in zip(times, times[1:], strict=False)), default=0)
    errors = Counter(str(e.get("exception", "?")) for e in producer.named("producer_send_error"))
    failed_commits = sum(1 for e in consumer.named("offsets_committed") if not e.get("success", True))
    return Verdict(len(successes), len(records), lost, twice, out_of_order, errors, stall, failed_commits)


def caught_up(producer: VerifiableProducer, consumer: VerifiableConsumer, timeout: float = 120.0) -> None:
    """Wait until the consumer has every value the (stopped) producer had acknowledged."""
    acked = {e["value"] for e in producer.named("producer_send_success")}
    wait_for(
        f"{consumer.name} to consume the {len(acked)} values {producer.name} had acknowledged",
        lambda: not consumer.running() or acked <= consumer.values(),
        timeout,
        seen=lambda: f"missing {len(acked - consumer.values())}; consumer log:\n{consumer.log_tail()}",
    )


class VerifiableRun:
    """A verifiable producer and a verifiable consumer (in its own group) on one topic: one side of a fault test."""

    def __init__(self, bootstrap: str, topic: str, workdir: Path, *, throughput: int, name: str) -> None:
        self.name = name
        self.topic = topic
        self.producer = VerifiableProducer(bootstrap, topic, workdir, throughput=throughput, name=f"producer-{name}")
        self.consumer = VerifiableConsumer(bootstrap, topic, f"group-{topic}", workdir, name=f"consumer-{name}")

    def start(self) -> None:
        self.consumer.start()
        self.producer.start()

    def acked(self) -> int:
        return self.producer.acked()

    def consuming(self) -> bool:
        return self.consumer.consumed() > 0

    def acks(self) -> list[tuple[int, int]]:
        """(time, 1) for every acknowledged send."""
        return [(e["timestamp"], 1) for e in self.producer.named("producer_send_success")]

    def errors(self) -> list[tuple[int, str]]:
        """(time, what) for every error the clients reported: failed sends (by exception) and failed commits."""
        sends = [(e["timestamp"], str(e.get("exception", "?")).rsplit(".", 1)[-1]) for e in self.producer.named("producer_send_error")]
        commits = [(e["timestamp"], "commit failed") for e in self.consumer.named("offsets_committed") if not e.get("success", True)]
        return sends + commits

    def finish(self, timeout: float) -> Verdict:
        """Stop producing, let the consumer read everything acknowledged, stop it: the verdict."""
        self.producer.stop()
        caught_up(self.producer, self.consumer, timeout)
        self.consumer.stop()
        return verdict(self.producer, self.consumer)

    def stop(self) -> None:
        self.producer.stop()
        self.consumer.stop()

    def log_tail(self) -> str:
        return self.producer.log_tail() + "\n" + self.consumer.log_tail()
