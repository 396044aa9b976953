"""A transactional run with confluent-kafka (librdkafka), the second client of the fault suites.

A transactional producer writes increasing integers in transactions of
:data:`TXN_SIZE` records and aborts one transaction in :data:`ABORT_EVERY` on
purpose; a consumer in a group reads with ``isolation.level=read_committed``.
What must hold, as Kafka's own transaction system test (``transactions_test.py``)
asks of its copier: every record of a committed transaction consumed, no
record of an aborted one ever seen, nothing at two offsets, each partition in
order. An error the client says requires an abort (a broker died under the
transaction) aborts that transaction and the run goes on. An error it calls
fatal ends that producer, and a new one takes over as an application's would
(``init_transactions`` fences the old one and aborts what it left open): the
transaction whose end failed counts as neither committed nor aborted (either
outcome is right), and more than :data:`MAX_RECOVERIES` in one run fail it.
Seen under the fault suite's faults with the brokers directly as well as
through kfan: INVALID_TXN_STATE at a commit after a broker's failure.

Both clients run on threads of the test process and record what they saw with
the time they saw it, for :mod:`tests.support.apache_kafka.faults`' windows.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from tests.support.apache_kafka.faults import now_ms
from tests.support.apache_kafka.verifiable import Verdict
from tests.support.waiting import wait_for

TXN_SIZE = 20
ABORT_EVERY = 5  # the 5th, 10th, ... transaction is aborted on purpose
PAUSE_S = 0.1  # between transactions: about 150 records a second
GIVE_UP_S = 120.0  # a commit or abort still failing retriably after this is a failure
MAX_RECOVERIES = 3  # fatal errors a run takes a new producer after


class TransactionalRun:
    def __init__(self, bootstrap: str, topic: str, *, name: str) -> None:
        self.name = name
        self.topic = topic
        common: dict[str, Any] = {"bootstrap.servers": bootstrap, "log_level": 0}
        self._producer_conf = {
            **common,
            "transactional.id": f"txn-{topic}",
            "acks": "all",
            "linger.ms": 5,
            "transaction.timeout.ms": 60000,
        }
        self._consumer_conf = {
            **common,
            "group.id": f"group-{topic}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000,
        }
        self._lock = threading.Lock()
        self._stop_producing = threading.Event()
        self._stop_consuming = threading.Event()
        self.committed: list[tuple[int, list[str]]] = []  # (time, values) per committed transaction
        self.aborted: list[str] = []
        self.placed: dict[str, tuple[int, int]] = {}  # value -> (partition, offset) the producer was told
        self.consumed: list[tuple[str, int, int]] = []  # (value, partition, offset)
        self.seen_errors: list[tuple[int, str]] = []
        self.failure: str | None = None
        self._threads = [
            threading.Thread(target=self._guarded, args=(self._produce,), name=f"{name} producer", daemon=True),
            threading.Thread(target=self._guarded, args=(self._consume,), name=f"{name} consumer", daemon=True),
        ]

    # --- the clients ----------------------------------------------------------------------------

    def _guarded(self, body: Any) -> None:
        try:
            body()
        except Exception as e:  # the verdict reports it; a thread's exception would only be printed
            self.failure = f"{threading.current_thread().name}: {e!r}"

    def _error(self, what: str) -> None:
        with self._lock:
            self.seen_errors.append((now_ms(), what))

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            # Records an abort purged before they were sent: the abort (counted where it failed, or meant) is the event.
            if err.code() not in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
                self._error(err.name())
        else:
            with self._lock:
                self.placed[msg.value().decode()] = (msg.partition(), msg.offset())

    def _finish(self, producer: Producer, abort: bool) -> bool:
        """Commit (or abort) the open transaction; True if it committed. Retriable errors are retried, an
        abortable one aborts it; a fatal one raises."""
        deadline = time.monotonic() + GIVE_UP_S
        while True:
            try:
                if abort:
                    producer.abort_transaction(30)
                    return False
                producer.commit_transaction(30)
                return True
            except KafkaException as e:
                err: KafkaError = e.args[0]
                self._error(err.name())
                if err.fatal() or time.monotonic() > deadline:
                    raise
                if err.txn_requires_abort():
                    abort = True
                elif not err.retriable():
                    raise

    def _produce(self) -> None:
        producer = Producer(self._producer_conf)
        producer.init_transactions(60)
        value, count, recoveries = 0, 0, 0
        while not self._stop_producing.is_set():
            producer.begin_transaction()
            values = [str(v) for v in range(value, value + TXN_SIZE)]
            value += TXN_SIZE
            count += 1
            abort = count % ABORT_EVERY == 0
            try:
                try:
                    for v in values:
                        producer.produce(self.topic, value=v.encode(), on_delivery=self._delivered)
                except KafkaException as e:  # the transaction failed under us: only an abort ends it
                    err: KafkaError = e.args[0]
                    self._error(err.name())
                    if not err.txn_requires_abort():
                        raise
                    abort = True
                committed = self._finish(producer, abort)
            except KafkaException as e:
                fatal: KafkaError = e.args[0]
                if not fatal.fatal() or recoveries >= MAX_RECOVERIES:
                    raise
                recoveries += 1
                self._error(f"recovered from fatal {fatal.name()}")  # this transaction: committed or not, either is right
                producer = Producer(self._producer_conf)
                producer.init_transactions(60)
                continue
            if committed:
                with self._lock:
                    self.committed.append((now_ms(), values))
            else:
                with self._lock:
                    self.aborted.extend(values)
            time.sleep(PAUSE_S)
        producer.flush(30)

    def _consume(self) -> None:
        consumer = Consumer(self._consumer_conf)
        consumer.subscribe([self.topic])
        try:
            while not self._stop_consuming.is_set():
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                if msg.error() is not None:
                    self._error(msg.error().name())
                    continue
                with self._lock:
                    self.consumed.append((msg.value().decode(), msg.partition(), msg.offset()))
        finally:
            consumer.close()

    # --- the run, as the fault suites drive it ----------------------------------------------------

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def acked(self) -> int:
        with self._lock:
            return sum(len(values) for _, values in self.committed)

    def consuming(self) -> bool:
        with self._lock:
            return bool(self.consumed)

    def acks(self) -> list[tuple[int, int]]:
        """(time, records) for every committed transaction."""
        with self._lock:
            return [(t, len(values)) for t, values in self.committed]

    def errors(self) -> list[tuple[int, str]]:
        with self._lock:
            return list(self.seen_errors)

    def _consumed_values(self) -> set[str]:
        with self._lock:
            return {v for v, _, _ in self.consumed}

    def finish(self, timeout: float) -> Verdict:
        """Stop producing, let the consumer read every committed record, stop it: the verdict."""
        self._stop_producing.set()
        self._threads[0].join(GIVE_UP_S + 60)
        with self._lock:
            committed = {v for _, values in self.committed for v in values}
        wait_for(
            f"{self.name}: the consumer to read the {len(committed)} committed records",
            lambda: self.failure is not None or committed <= self._consumed_values(),
            timeout,
            seen=lambda: f"missing {len(committed - self._consumed_values())}; failure {self.failure}",
        )
        self.stop()
        return self.verdict()

    def stop(self) -> None:
        self._stop_producing.set()
        self._stop_consuming.set()
        for thread in self._threads:
            if thread.ident is not None:
                thread.join(GIVE_UP_S + 60)

    def verdict(self) -> Verdict:
        with self._lock:
            committed = [v for _, values in self.committed for v in values]
            aborted = set(self.aborted)
            consumed = list(self.consumed)
            times = sorted(t for t, _ in self.committed)
            errors = Counter(name for _, name in self.seen_errors)
            placed = dict(self.placed)
        if self.failure is not None:
            errors[f"FATAL {self.failure}"] += 1
        where: dict[str, set[tuple[int, int]]] = defaultdict(set)
        for v in committed:
            if v in placed:
                where[v].add(placed[v])
        for v, partition, offset in consumed:
            where[v].add((partition, offset))
        seen = {v for v, _, _ in consumed}
        lost = sorted(set(committed) - seen, key=int)
        twice = sorted((v for v, places in where.items() if len(places) > 1), key=int)
        by_partition: dict[int, dict[int, int]] = defaultdict(dict)
        for v, partition, offset in consumed:
            by_partition[partition][offset] = int(v)
        out_of_order = [p for p, values in sorted(by_partition.items()) if [values[o] for o in sorted(values)] != sorted(values.values())]
        stall = max((b - a for a, b in zip(times, times[1:], strict=False)), default=0)
        return Verdict(
            len(committed), len(consumed), lost, twice, out_of_order, errors, stall, aborted_seen=sorted(aborted & seen, key=int)
        )

    def log_tail(self) -> str:
        return f"committed {self.acked()}, consumed {len(self.consumed)}, errors {self.errors()[-10:]}, failure {self.failure}"
