"""The measurements of ``kfan bench`` on one path: produce and consume throughput, and produce latency.

A :class:`Path` holds the default confluent-kafka clients of one path (a
bootstrap address: the brokers, or kfan; it does not know which) and times
one produce run or one consume run at a time; the caller alternates paths and
rounds. For the kfan path the caller passes ``cpu``, kfan's CPU clock, read
around each timed run. Each wait has a deadline; a run that cannot finish
raises :class:`BenchError` saying why.

Each consume run reads back exactly the offsets its produce run wrote
(known from the acknowledgements, or with acks=0 from the end offsets read on
the direct path outside the timed part), whatever the other path wrote
before or after.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from proxy.tools.bench.errors import BenchError

Update = Callable[[str], None]

FLUSH_TIMEOUT_S = 120.0  # every produced record acknowledged within this after the last produce
STALL_TIMEOUT_S = 30.0  # a consumer that reads nothing new for this long has failed
OFFSETS_TIMEOUT_S = 30.0
LATENCY_FLUSH_TIMEOUT_S = 10.0
LATENCY_RECORD_BYTES = 100
LATENCY_WARMUP = 20
KEY_BYTES = 8


@dataclass
class Moved:
    """Records moved by one timed run."""

    records: int
    bytes: int  # keys and values
    seconds: float
    cpu_s: float | None = None  # kfan's CPU time across the run (kfan path only)


@dataclass
class Written:
    """What a produce run wrote: offsets [start, end) per partition, for the consume run to read back."""

    moved: Moved
    ranges: dict[int, tuple[int, int]]


def _common(bootstrap: str) -> dict[str, object]:
    # A default client otherwise: the figures are what an application left at the defaults sees.
    return {"bootstrap.servers": bootstrap, "client.id": "kfan-bench", "log.connection.close": False}


def _consumer(bootstrap: str) -> Consumer:
    # group.id is required by the client even with assign(); nothing is committed.
    return Consumer({**_common(bootstrap), "group.id": f"kfan-bench-{uuid.uuid4().hex}", "enable.auto.commit": False})


class EndOffsets:
    """Reads a topic's end offsets (high watermarks) with a consumer of its own."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.topic, self.partitions = topic, partitions
        self._consumer = _consumer(bootstrap)

    def read(self) -> list[int]:
        try:
            return [
                self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=OFFSETS_TIMEOUT_S, cached=False)[1]
                for p in range(self.partitions)
            ]
        except KafkaException as e:
            raise BenchError(f"cannot read the end offsets of {self.topic}: {e}") from None

    def wait_for(self, at_least: list[int], what: str) -> list[int]:
        """Wait until every end offset reaches ``at_least`` (acks=0: flushed is not yet written); the offsets."""
        deadline = time.monotonic() + OFFSETS_TIMEOUT_S
        while True:
            now = self.read()
            if all(n >= a for n, a in zip(now, at_least, strict=True)):
                return now
            if time.monotonic() > deadline:
                missing = sum(max(0, a - n) for n, a in zip(now, at_least, strict=True))
                raise BenchError(f"{what}: {missing} records sent never reached the brokers within {OFFSETS_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    def close(self) -> None:
        self._consumer.close()


class Path:
    """The throughput clients of one path: a producer (acks as given) kept across runs, a consumer per run."""

    def __init__(
        self, name: str, bootstrap: str, topic: str, partitions: int, acks: str, record_size: int, cpu: Callable[[], float] | None
    ) -> None:
        self.name, self.topic, self.partitions, self.acks, self.cpu = name, topic, partitions, acks, cpu
        self._bootstrap = bootstrap
        self._errors: list[str] = []
        self._first: dict[int, int] = {}  # per partition, the offset of the run's first record (from its acknowledgement)
        self._value = os.urandom(record_size)
        self._record_bytes = record_size + KEY_BYTES
        self._producer = Producer({**_common(bootstrap), "acks": acks, "on_delivery": self._delivered})

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._errors.append(str(err))
        elif (p := msg.partition()) not in self._first:
            self._first[p] = msg.offset()  # acks=0: no offset (negative), unused

    def warm_up(self, offsets: EndOffsets) -> None:
        """Not timed: metadata known and a connection open to every leader; waits until the records are written."""
        before = offsets.read() if self.acks == "0" else []
        for p in range(self.partitions):
            self._producer.produce(self.topic, b"warm-up", b"warm-up", partition=p)
        self._flush(f"warm-up ({self.name})")
        if before:
            offsets.wait_for([b + 1 for b in before], f"warm-up ({self.name})")

    def produce(self, records: int, offsets: EndOffsets, cap_s: float, update: Update) -> Written:
        """Produce ``records`` records round-robin to every partition; time first produce to flush done. Stops early at ``cap_s``.

        Where the records went comes from their acknowledgements (partition
        offsets are consecutive); with acks=0 there are none, and the end
        offsets are read before and after instead. (Not the other way round:
        Tansu reports the end offset as the last batch's base offset plus one.)
        """
        start = offsets.read() if self.acks == "0" else []
        self._first.clear()
        counts = [0] * self.partitions
        produced = 0
        cpu0 = self.cpu() if self.cpu else None
        t0 = time.perf_counter()
        for i in range(records):
            p = i % self.partitions
            while True:
                try:
                    self._producer.produce(self.topic, self._value, b"%08d" % (i % 100_000_000), partition=p)
                    break
                except BufferError:
                    # The client's queue is full: wait for acknowledgements, as an application would.
                    self._producer.poll(0.005)
                    if time.perf_counter() - t0 > cap_s + FLUSH_TIMEOUT_S:
                        raise BenchError(f"produce ({self.name}): the client's queue stayed full for {FLUSH_TIMEOUT_S:.0f} s") from None
            counts[p] += 1
            produced += 1
            if produced % 5000 == 0:
                self._producer.poll(0)
                elapsed = time.perf_counter() - t0
                update(f"produce {self.name} {produced}/{records}, {produced * self._record_bytes / 1e6 / elapsed:.0f} MB/s")
                if elapsed > cap_s:
                    break
        self._flush(f"produce ({self.name})")
        seconds = time.perf_counter() - t0
        if start:
            # acks=0: flushed means sent; kfan's work is done once the records are written.
            offsets.wait_for([s + c for s, c in zip(start, counts, strict=True)], f"produce ({self.name})")
        cpu_s = self.cpu() - cpu0 if self.cpu and cpu0 is not None else None
        if not start:
            start = [self._first.get(p, -1) for p in range(self.partitions)]
            if any(start[p] < 0 for p in range(self.partitions) if counts[p]):
                raise BenchError(f"produce ({self.name}): acknowledgements without offsets")
        moved = Moved(produced, produced * self._record_bytes, seconds, cpu_s)
        return Written(moved, {p: (start[p], start[p] + counts[p]) for p in range(self.partitions) if counts[p]})

    def _flush(self, what: str) -> None:
        left = self._producer.flush(FLUSH_TIMEOUT_S)
        if left:
            raise BenchError(f"{what}: {left} records still unacknowledged {FLUSH_TIMEOUT_S:.0f} s after the last was produced")
        if self._errors:
            raise BenchError(f"{what}: {len(self._errors)} records failed, the first with: {self._errors[0]}")

    def consume(self, ranges: dict[int, tuple[int, int]], cap_s: float, update: Update) -> Moved:
        """Read back the offset ranges a produce run wrote, with ``assign()``; time assign to last record. Stops early at ``cap_s``.

        A fresh consumer each run: one kept between runs has a Fetch waiting at
        the end of the log, which the mock holds for the whole fetch.wait.max.ms
        (500 ms) even when records arrive, and the next run would wait for it.
        It is warmed up first (not timed): metadata known, a connection open to every leader.
        """
        consumer = _consumer(self._bootstrap)
        try:
            _connect_leaders(consumer, self.topic)
            return self._consume(consumer, ranges, cap_s, update)
        finally:
            consumer.close()

    def _consume(self, consumer: Consumer, ranges: dict[int, tuple[int, int]], cap_s: float, update: Update) -> Moved:
        expected = sum(end - start for start, end in ranges.values())
        remaining = {p: end for p, (start, end) in ranges.items() if end > start}
        records = size = 0
        cpu0 = self.cpu() if self.cpu else None
        t0 = last_progress = time.perf_counter()
        consumer.assign([TopicPartition(self.topic, p, start) for p, (start, _) in ranges.items()])
        while remaining:
            # A batch call returns when full or at its timeout: keep the timeout short, or the last
            # partial batch would add its whole timeout to the measured time.
            batch = consumer.consume(1000, timeout=0.01)
            now = time.perf_counter()
            for m in batch:
                if (err := m.error()) is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise BenchError(f"consume ({self.name}): {err}")
                p, offset = m.partition(), m.offset()
                end = remaining.get(p)
                if end is None or offset >= end:
                    continue
                records += 1
                size += len(m.value() or b"") + len(m.key() or b"")
                if offset == end - 1:
                    del remaining[p]
            if batch:
                last_progress = now
                update(f"consume {self.name} {records}/{expected}, {size / 1e6 / (now - t0):.0f} MB/s")
            elif now - last_progress > STALL_TIMEOUT_S:
                raise BenchError(
                    f"consume ({self.name}): {records} of {expected} records read, then nothing for {STALL_TIMEOUT_S:.0f} s"
                    f" ({len(remaining)} partitions unfinished)"
                )
            if now - t0 > cap_s:
                break
        seconds = time.perf_counter() - t0
        cpu_s = self.cpu() - cpu0 if self.cpu and cpu0 is not None else None
        return Moved(records, size, seconds, cpu_s)

    def close(self) -> None:
        self._producer.flush(10)
        # The producer holds this object (its delivery callback): drop it here, or the cycle keeps
        # the client, and its reconnection attempts, alive after kfan and the brokers are gone.
        del self._producer


def _connect_leaders(consumer: Consumer, topic: str) -> None:
    """Ask each leader of ``topic`` for one of its partitions' offsets: the consumer then has its metadata and connections."""
    try:
        partitions = consumer.list_topics(topic, timeout=OFFSETS_TIMEOUT_S).topics[topic].partitions
        one_per_leader = {meta.leader: p for p, meta in sorted(partitions.items(), reverse=True)}
        for p in one_per_leader.values():
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=OFFSETS_TIMEOUT_S, cached=False)
    except (KafkaException, KeyError) as e:
        raise BenchError(f"cannot reach the leaders of {topic}: {e}") from None


def produce_latency(paths: dict[str, str], topic: str, partitions: int, records: int, acks: str, update: Update) -> dict[str, list[float]]:
    """Milliseconds from produce() to flush() done for one 100 B record at a time, per path.

    The paths take turns record by record, the order swapped every record, so
    neither gains from drift; each first sends a few unmeasured records.
    """
    value = os.urandom(LATENCY_RECORD_BYTES)
    errors: list[str] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(str(err))

    # linger.ms=0: the record leaves at once instead of waiting for company.
    producers = {name: Producer({**_common(b), "acks": acks, "linger.ms": 0, "on_delivery": delivered}) for name, b in paths.items()}
    latencies: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for i in range(-LATENCY_WARMUP, records):
        for name in names if i % 2 == 0 else names[::-1]:
            producer = producers[name]
            t0 = time.perf_counter()
            producer.produce(topic, value, partition=i % partitions)
            left = producer.flush(LATENCY_FLUSH_TIMEOUT_S)
            elapsed_ms = (time.perf_counter() - t0) * 1000
            if left:
                raise BenchError(f"produce latency ({name}): a record not acknowledged within {LATENCY_FLUSH_TIMEOUT_S:.0f} s")
            if errors:
                raise BenchError(f"produce latency ({name}): {errors[0]}")
            if i >= 0:
                latencies[name].append(elapsed_ms)
        if i >= 0 and i % 50 == 0:
            update(f"{i}/{records} per path")
    return latencies
