"""Real clients kept busy through kfan while a test breaks things: a producer and a
consumer in threads (Flow), the producer's delivery reports, and the checks on
what they saw."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.support.client_security import PLAINTEXT, ClientSecurity
from tests.support.kfan import Kfan
from tests.support.round_trip import SESSION_MS
from tests.support.waiting import wait_for

PARTITIONS = 6  # a Flow's topic has six
FLUSH_S = 60  # how long the producer may take to deliver what it holds once told to stop


Row = tuple[int, int, bytes | None, bytes]  # partition, offset, key, value


def check_in_order(rows: list[Row]) -> None:
    """Per partition offsets strictly increase (nothing read twice) and so do the producer's sequence numbers."""
    by_partition: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for partition, offset, _, value in rows:
        by_partition[partition].append((offset, int(value)))
    for partition, pairs in by_partition.items():
        offsets = [o for o, _ in pairs]
        assert offsets == sorted(set(offsets)), f"partition {partition}: offsets out of order or repeated"
        seq = [v for _, v in pairs]
        assert seq == sorted(seq), f"partition {partition}: produce order lost"


class Reports:
    """Delivery reports of a confluent-kafka producer: value -> error (None when written)."""

    def __init__(self) -> None:
        self.by_value: dict[int, KafkaError | None] = {}
        self.count = 0  # reports received, to catch a record reported twice
        self.lock = threading.Lock()

    def __call__(self, err: KafkaError | None, msg: object) -> None:
        with self.lock:
            self.by_value[int(msg.value())] = err  # type: ignore[attr-defined]
            self.count += 1

    @property
    def ok(self) -> set[int]:
        with self.lock:
            return {v for v, e in self.by_value.items() if e is None}

    @property
    def failed(self) -> dict[int, KafkaError]:
        with self.lock:
            return {v: e for v, e in self.by_value.items() if e is not None}


class Flow:
    """A producer and a consumer running in threads, through the kfan (or kfans) given.

    The producer (idempotent, one request in flight, so each retriable error is
    one the client saw and not a pipelining echo) writes keyed records with
    increasing sequence numbers round-robin to every partition, at ``rate``
    per second. The consumer reads every partition from the start: assigned,
    or as a member of ``group`` that commits after every batch.
    """

    def __init__(
        self,
        topic: str,
        produce_via: Kfan,
        consume_via: Kfan,
        rate: int = 600,
        group: str | None = None,
        security: ClientSecurity = PLAINTEXT,
        consumer_config: dict[str, Any] | None = None,
    ) -> None:
        """``consumer_config``: more librdkafka settings for the consumer (``client.rack``)."""
        self.topic = topic
        self.reports = Reports()
        self.sent = 0
        self.consumed: list[Row] = []
        self.consumer_errors: list[KafkaError] = []
        self.producer_errors: list[KafkaError] = []
        self.stop_producing = threading.Event()
        self.stop_consuming = threading.Event()
        self.failures: list[BaseException] = []
        self.rate = rate
        self.group = group
        self.commits: list[float] = []  # when each successful commit returned
        self.assignments: list[list[int]] = []  # each (re)assignment of a group member
        self.revocations = 0
        self.commit_errors: list[KafkaException] = []
        self.producer = Producer(
            {
                "bootstrap.servers": produce_via.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "max.in.flight.requests.per.connection": 1,
                "message.timeout.ms": 60_000,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500,
                "error_cb": self.producer_errors.append,
                **security.librdkafka(),
            }
        )
        self.consumer = Consumer(
            {
                "bootstrap.servers": consume_via.bootstrap,
                "group.id": group or f"flow-{uuid.uuid4()}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100,
                "session.timeout.ms": SESSION_MS,
                "heartbeat.interval.ms": 500,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500,
                "error_cb": self.consumer_errors.append,
                **security.librdkafka(),
                **(consumer_config or {}),
            }
        )
        if group is None:
            self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        else:
            self.consumer.subscribe(
                [topic],
                on_assign=lambda _, tps: self.assignments.append(sorted(tp.partition for tp in tps)),
                on_revoke=lambda _, tps: setattr(self, "revocations", self.revocations + 1),
            )
        self.threads = [threading.Thread(target=self._guard(self._produce)), threading.Thread(target=self._guard(self._consume))]

    def _guard(self, body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as e:  # reported by finish()
                self.failures.append(e)

        return run

    def _produce(self) -> None:
        started = time.monotonic()
        while not self.stop_producing.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while self.sent < due:
                i = self.sent
                self.producer.produce(
                    self.topic, key=f"k{i % 97}".encode(), value=str(i).encode(), partition=i % PARTITIONS, on_delivery=self.reports
                )
                self.sent += 1
            self.producer.poll(0.01)
        assert self.producer.flush(FLUSH_S) == 0, "records still undelivered"

    def _consume(self) -> None:
        while not self.stop_consuming.is_set():
            got = False
            for m in self.consumer.consume(500, timeout=0.2):
                if m.error() is not None:
                    self.consumer_errors.append(m.error())
                    continue
                self.consumed.append((m.partition(), m.offset(), m.key(), m.value()))
                got = True
            if self.group is not None and got:
                # A group member commits what it consumed, synchronously, batch by batch.
                try:
                    self.consumer.commit(asynchronous=False)
                    self.commits.append(time.monotonic())
                except KafkaException as e:
                    self.commit_errors.append(e)
        self.consumer.close()  # a group member leaves its group

    def start(self) -> Flow:
        for t in self.threads:
            t.start()
        return self

    def values_from(self, partition: int) -> list[int]:
        return [int(v) for p, _, _, v in list(self.consumed) if p == partition]

    def finish(self, timeout: float = 60) -> None:
        """Stop producing, wait until everything delivered is consumed, stop consuming.

        Both threads have ended when it returns: what the test reads of the flow no longer changes.
        """
        self.stop_producing.set()
        producer, consumer = self.threads
        producer.join(FLUSH_S + 10)  # its flush ends by then, delivered or not
        try:
            assert not producer.is_alive(), f"the producer did not stop within {FLUSH_S + 10} s"
            wait_for(
                "the consumer to catch up with every delivered record",
                lambda: bool(self.failures) or len(self.consumed) >= len(self.reports.ok),
                timeout,
            )
        finally:
            self.stop_consuming.set()
            consumer.join(timeout)
        assert not consumer.is_alive(), f"the consumer did not stop within {timeout:g} s"
        if self.failures:
            raise self.failures[0]
