"""A broker that misbehaves, behind the real kfan process (a failed or babbling broker becomes retriable per-partition errors).

A fresh 3-broker embedded cluster for this module; broker 2 sits behind a
:class:`tests.support.badbroker.BadBroker` and advertises the stand-in's
port, so that kfan's links to broker 2 (client traffic and control plane)
go through it. The stand-in spoils broker 2's answers one way at a time:
garbage, a wrong correlation id, a 2 GiB size prefix, half a frame, no
answer, a closed connection, unknown tagged fields, and, for kfan's own
topology refreshes, undecodable Metadata or Metadata that lists no broker.

What must hold each time: partitions on brokers 1 and 3 are served as if
nothing happened; partitions on broker 2 get retriable per-partition errors
(NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, NETWORK_EXCEPTION), or "no data
yet" for a Fetch, never a closed client connection when the response can
carry an error; legal oddities (unknown tagged fields) change nothing; once
the stand-in passes answers through again everything recovers, on the
client's same connection, and nothing acknowledged is lost; kfan never exits
and logs no traceback.
"""

from __future__ import annotations

import datetime
import struct
import subprocess
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from backends.link import CLIENT_ID as KFAN_CLIENT_ID
from proxy.kafka import apis, errors, schema
from proxy.kafka.headers import response_body_offset
from proxy.tools.mock_cluster import MockCluster
from tests.support.badbroker import BadBroker
from tests.support.flows import Flow, Reports, check_in_order
from tests.support.kfan import Kfan, shown_ids, start_kfan
from tests.support.rawclient import RawClient
from tests.support.records import record_batch
from tests.support.waiting import wait_for, wait_for_line

PARTITIONS = 6
LEADERS = [1, 2, 3, 1, 2, 3]
BAD = 2  # the broker behind the stand-in
ALL = list(range(PARTITIONS))
ON_BAD = [p for p, b in enumerate(LEADERS) if b == BAD]  # [1, 4]
HEALTHY = [p for p in ALL if p not in ON_BAD]
HEALTHY_BROKERS = sorted(set(LEADERS) - {BAD})
RETRIABLE = {errors.NOT_LEADER_OR_FOLLOWER, errors.REQUEST_TIMED_OUT, errors.NETWORK_EXCEPTION}

# kfan answers a sub-request its broker never answers after the request's own
# timeout plus this; short, so that "no answer" tests take seconds.
REQUEST_TIMEOUT = 1.5
KFAN_ARGS = ("--metadata-refresh", "1", "--request-timeout", str(REQUEST_TIMEOUT))
PRODUCE_TIMEOUT_MS = 500
FETCH_MAX_WAIT_MS = 500
RECOVERY_S = 10.0  # how long a client may keep retrying after the broker behaves again
CHAOS_RATE = 1000  # records per second

ERROR_MODES = ("garbage", "wrong_cid", "huge_prefix", "half_frame", "stall", "close")
DATA_MODES = (*ERROR_MODES, "unknown_tags")


# --- the module's cluster, stand-in and kfan ------------------------------------------------


@pytest.fixture(scope="module")
def cluster3() -> Iterator[MockCluster]:
    """Our own cluster: the stand-ins change what its brokers advertise."""
    with MockCluster(3) as mock:
        yield mock


@pytest.fixture(scope="module")
def bad(cluster3: MockCluster) -> Iterator[BadBroker]:
    """Broker 2, behind the stand-in: the cluster advertises the stand-in's port for it."""
    with BadBroker(cluster3.brokers[BAD], seed=2, lifetime=3600) as stand_in:  # stopped at the end; the lifetime is a safety net
        cluster3.set_broker_address(BAD, "127.0.0.1", stand_in.port)
        try:
            yield stand_in
        finally:
            cluster3.set_broker_address(BAD, *cluster3.brokers[BAD])


class _Kfans:
    """One kfan for the module's tests, started again if a test killed it (so one crash fails one test)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.current: Kfan | None = None

    def get(self) -> Kfan:
        if self.current is None or not self.current.alive():
            self.stop()
            self.current = start_kfan(self.bootstrap, *KFAN_ARGS)
        return self.current

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None

    def settle(self, since: int) -> None:
        """After a test: a kfan that logged a traceback is on its way out (or unwell): the next test gets a new one."""
        k = self.current
        if k is not None and "Traceback" in "".join(k.log[since : _end_of_log(k)]):
            try:
                k.process.wait(5)
            except subprocess.TimeoutExpired:
                pass
            self.stop()


@pytest.fixture(scope="module")
def kfans(cluster3: MockCluster, bad: BadBroker) -> Iterator[_Kfans]:
    holder = _Kfans(cluster3.bootstrap)
    yield holder
    holder.stop()


def mark(k: Kfan) -> int:
    """Where kfan's log stands now: the index just past a line kfan logs on handling a connection of ours,
    made now (a request of a version nobody serves, under a correlation id of our own, that kfan closes on).

    kfan handles one event after another: what it logged for what happened before this connection is
    before that line; a test's slice of the log starts past one mark and ends at another.
    """
    cid = uuid.uuid4().int & 0x7FFFFFFF
    with RawClient(k.address) as client:
        client.send_bytes(struct.pack(">ihhi", 10, apis.METADATA, 999, cid) + b"\xff\xff")
        client.closed_by_peer()
    line = wait_for_line(k.log, rf"closing on request api_key={apis.METADATA} v999 correlation_id={cid}:").string
    return k.log.index(line) + 1


def _end_of_log(k: Kfan) -> int:
    """:func:`mark` while kfan serves; else all it wrote (it is gone or going)."""
    if k.alive():
        try:
            return mark(k)
        except (OSError, AssertionError):
            pass
    return len(k.log)


@dataclass
class Env:
    cluster: MockCluster
    bad: BadBroker
    kfan: Kfan
    since: int  # kfan's log lines before the test: up to a mark made when it began
    extra: list[BadBroker] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"<Env kfan {self.kfan.bootstrap}, stand-in {self.bad!r}>"

    def log(self) -> str:
        return "".join(self.kfan.log[self.since :])

    def check(self) -> None:
        """kfan is still running, logged no traceback during the test, and the stand-ins worked."""
        assert self.kfan.alive(), f"kfan exited (code {self.kfan.process.poll()}):\n{self.log()[-6000:]}"
        # Up to a mark made now: whatever kfan logged for what the test did is there.
        during = "".join(self.kfan.log[self.since : mark(self.kfan)])
        assert "Traceback" not in during, f"kfan logged a traceback:\n{during[-6000:]}"
        for stand_in in (self.bad, *self.extra):
            assert stand_in.errors == [], f"the stand-in itself failed: {stand_in.errors}"


@pytest.fixture
def env(cluster3: MockCluster, bad: BadBroker, kfans: _Kfans) -> Iterator[Env]:
    bad.passthrough()
    k = kfans.get()
    bad.reset_counts()
    # The test's part of the log starts past a mark: the lines of earlier tests' connections are before it.
    e = Env(cluster3, bad, k, mark(k))
    try:
        yield e
    finally:
        bad.passthrough()
        print("kfan's log during the test (tail):\n" + e.log()[-8000:])  # shown by pytest with a failure
        kfans.settle(e.since)


def dispose(producer: Producer) -> None:
    """Drop what a producer still holds and close it: a failed test must not leave it reconnecting for the session."""
    producer.purge()
    producer.flush(1)
    producer.close()


def new_topic(cluster: MockCluster) -> str:
    name = f"bf-{uuid.uuid4().hex[:10]}"
    cluster.create_topic(name, PARTITIONS, leaders=LEADERS)
    return name


# --- a raw client's Produce and Fetch, with what was acknowledged ---------------------------------


class KfanClient(RawClient):
    """A raw client of one kfan process, to tell "kfan closed my connection" from "kfan exited"."""

    def __init__(self, kfan: Kfan) -> None:
        super().__init__(kfan.address)
        self.kfan = kfan


def _receive_or_fail(client: RawClient, what: str, timeout: float = 15.0) -> bytes:
    try:
        payload = client.receive(timeout)
    except (ConnectionResetError, BrokenPipeError):
        payload = None
    if payload is None and isinstance(client, KfanClient):
        try:
            client.kfan.process.wait(2)
        except subprocess.TimeoutExpired:
            pass
        assert client.kfan.alive(), f"kfan exited (code {client.kfan.process.poll()}) instead of answering {what}:\n" + "".join(
            client.kfan.log[-60:]
        )
    assert payload is not None, f"kfan closed the client connection instead of answering {what}"
    return payload


def decode(api_key: int, version: int, payload: bytes) -> dict[str, Any]:
    """A response as a client sees it. kfan's codec, not kio: kio refuses unknown tagged fields, which
    Kafka's clients skip (and ``unknown_tags`` puts there on purpose)."""
    spec = schema.response_spec(api_key, version)
    return schema.decode_body(spec, payload, response_body_offset(payload, api_key, version))


@dataclass
class Acked:
    """Records kfan said were written: partition -> values (one single-record batch each)."""

    values: dict[int, list[bytes]] = field(default_factory=lambda: {p: [] for p in ALL})
    attempts: dict[int, int] = field(default_factory=lambda: dict.fromkeys(ALL, 0))


def produce(client: RawClient, topic: str, partitions: list[int], tag: str, acked: Acked) -> dict[int, int]:
    """One Produce v9 (flexible) of a record per partition; partition -> error code, in the client's order."""
    request = ProduceRequest(
        transactional_id=None,
        acks=-1,  # type: ignore[arg-type]
        timeout=datetime.timedelta(milliseconds=PRODUCE_TIMEOUT_MS),
        topic_data=(
            TopicProduceData(
                name=topic,  # type: ignore[arg-type]
                partition_data=tuple(PartitionProduceData(index=p, records=record_batch(f"{tag}-{p}".encode())) for p in partitions),  # type: ignore[arg-type]
            ),
        ),
    )
    cid = client.send(request)
    payload = _receive_or_fail(client, "a Produce")
    assert struct.unpack_from(">i", payload)[0] == cid
    resp = decode(apis.PRODUCE, 9, payload)
    assert [t["name"] for t in resp["responses"]] == [topic]
    codes = {p["index"]: p["error_code"] for p in resp["responses"][0]["partition_responses"]}
    assert list(codes) == partitions, f"every partition once, in the client's order: {list(codes)}"
    for p, code in codes.items():
        acked.attempts[p] += 1
        if code == 0:
            acked.values[p].append(f"{tag}-{p}".encode())
    return codes


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def records_in(data: bytes | None) -> list[tuple[int, bytes]]:
    """(offset, value) of each record in uncompressed v2 record batches; a partial batch at the end is left out, as clients do."""
    out: list[tuple[int, bytes]] = []
    data = data or b""
    pos = 0
    while pos + 12 <= len(data):
        base_offset, length = struct.unpack_from(">qi", data, pos)
        end = pos + 12 + length
        if end > len(data):
            break
        (count,) = struct.unpack_from(">i", data, pos + 57)
        p = pos + 61
        for _ in range(count):
            size, p = _varint(data, p)
            record_end = p + size
            p += 1  # attributes
            _, p = _varint(data, p)  # timestamp delta
            offset_delta, p = _varint(data, p)
            key_len, p = _varint(data, p)
            p += max(key_len, 0)
            value_len, p = _varint(data, p)
            out.append((base_offset + offset_delta, data[p : p + value_len] if value_len >= 0 else b""))
            p = record_end
        pos = end
    return out


@dataclass
class Part:
    """One partition of a Fetch answer."""

    code: int
    records: list[tuple[int, bytes]]  # (offset, value)
    high_watermark: int

    @property
    def values(self) -> list[bytes]:
        return [v for _, v in self.records]


def fetch(client: RawClient, topic: str, offsets: Mapping[int, int] | None = None) -> dict[int, Part]:
    """One Fetch v12 (flexible): ``offsets`` (partition -> offset; default every partition from 0)."""
    offsets = dict.fromkeys(ALL, 0) if offsets is None else offsets
    request = FetchRequest(
        max_wait=datetime.timedelta(milliseconds=FETCH_MAX_WAIT_MS),
        min_bytes=1,  # type: ignore[arg-type]
        topics=(
            FetchTopic(
                topic=topic,  # type: ignore[arg-type]
                partitions=tuple(FetchPartition(partition=p, fetch_offset=o, partition_max_bytes=1 << 20) for p, o in offsets.items()),  # type: ignore[arg-type]
            ),
        ),
        forgotten_topics_data=(),
    )
    cid = client.send(request)
    payload = _receive_or_fail(client, "a Fetch")
    assert struct.unpack_from(">i", payload)[0] == cid
    resp = decode(apis.FETCH, 12, payload)
    assert resp["error_code"] == 0, resp["error_code"]
    got = {
        p["partition_index"]: Part(p["error_code"], records_in(None if p["records"] is None else bytes(p["records"])), p["high_watermark"])
        for t in resp["responses"]
        for p in t["partitions"]
    }
    assert sorted(got) == sorted(offsets), f"every partition once: {sorted(got)}"
    return got


def read_log(client: RawClient, topic: str, partitions: list[int] = ALL, timeout: float = 15.0) -> dict[int, list[tuple[int, bytes]]]:
    """Each partition's (offset, value) pairs, read up to its high watermark (through kfan, or straight from a broker)."""
    offsets = dict.fromkeys(partitions, 0)  # partition -> next offset, until read up to its high watermark
    log: dict[int, list[tuple[int, bytes]]] = {p: [] for p in partitions}

    def read_to_the_end() -> bool:
        if offsets:
            for p, part in fetch(client, topic, offsets).items():
                assert part.code == 0, f"partition {p}: error {part.code} reading back"
                for offset, value in part.records:
                    if offset >= offsets[p]:
                        log[p].append((offset, value))
                        offsets[p] = offset + 1
                if offsets[p] >= part.high_watermark:
                    del offsets[p]
        return not offsets

    wait_for("every partition read back to its high watermark", read_to_the_end, timeout, seen=lambda: f"stalled at {offsets}")
    return log


def read_back(k: Kfan, topic: str) -> dict[int, list[bytes]]:
    """Every partition's values, read through kfan on a new connection."""
    with KfanClient(k) as reader:
        return {p: [v for _, v in rows] for p, rows in read_log(reader, topic).items()}


def check_acknowledged_are_there(k: Kfan, topic: str, acked: Acked) -> None:
    """Nothing acknowledged is missing from the log; the healthy brokers' partitions hold exactly that."""
    log = read_back(k, topic)
    for p in ALL:
        missing = [v for v in acked.values[p] if v not in log[p]]
        assert not missing, f"partition {p}: acknowledged but not in the log: {missing}"
        if p in HEALTHY:
            assert log[p] == acked.values[p], f"partition {p} (healthy broker): {log[p]} != acknowledged {acked.values[p]}"
        else:
            assert len(log[p]) <= acked.attempts[p], f"partition {p}: more records than were ever sent"


# --- 1. Produce through every kind of bad answer ----------------------------------------------------


@pytest.mark.parametrize("mode", DATA_MODES)
def test_produce_through_a_bad_answer(env: Env, mode: str) -> None:
    topic = new_topic(env.cluster)
    acked = Acked()
    with KfanClient(env.kfan) as client:
        assert produce(client, topic, ALL, "before", acked) == dict.fromkeys(ALL, 0)
        env.bad.set_mode(mode, api_keys={apis.PRODUCE})
        codes = produce(client, topic, ALL, "during", acked)
        # Counted before the spoiled answer leaves the stand-in's thread; waited for all the same, in case
        # kfan gave up on broker 2 (a timeout: a retriable error too) before its answer even came.
        wait_for("the stand-in to spoil a Produce answer", lambda: env.bad.injected(mode, apis.PRODUCE) >= 1)
        assert {p: codes[p] for p in HEALTHY} == dict.fromkeys(HEALTHY, 0), f"healthy brokers' partitions failed: {codes}"
        if mode == "unknown_tags":
            assert {p: codes[p] for p in ON_BAD} == dict.fromkeys(ON_BAD, 0), f"a legal answer turned into errors: {codes}"
        else:
            assert all(codes[p] in RETRIABLE for p in ON_BAD), f"broker {BAD}'s partitions: {codes}, expected codes in {RETRIABLE}"
        # The broker behaves again: the client retries on its same connection and gets through.
        env.bad.passthrough()
        retries: list[dict[int, int]] = []

        def retried() -> bool:
            retries.append(produce(client, topic, ON_BAD, f"retry{len(retries)}", acked))
            return retries[-1] == dict.fromkeys(ON_BAD, 0)

        try:
            wait_for(f"a retry of broker {BAD}'s partitions to succeed on the same connection", retried, timeout=RECOVERY_S, every=0.1)
        except AssertionError as e:
            raise AssertionError(f"{e}; the retries got {retries}") from None
        assert produce(client, topic, ALL, "after", acked) == dict.fromkeys(ALL, 0)
    check_acknowledged_are_there(env.kfan, topic, acked)
    env.check()


# --- 2. Fetch through every kind of bad answer -------------------------------------------------------


@pytest.mark.parametrize("mode", DATA_MODES)
def test_fetch_through_a_bad_answer(env: Env, mode: str) -> None:
    topic = new_topic(env.cluster)
    acked = Acked()
    with KfanClient(env.kfan) as writer:
        assert produce(writer, topic, ALL, "v", acked) == dict.fromkeys(ALL, 0)
    expected = {p: [f"v-{p}".encode()] for p in ALL}
    env.bad.set_mode(mode, api_keys={apis.FETCH})
    with KfanClient(env.kfan) as client:
        # A fresh connection, so kfan knows no marks yet and waits for broker 2's answer in this very
        # Fetch; the healthy brokers answer a little later, so that the bad answer is in kfan's hands
        # while the others are still out (the harder case).
        for b in HEALTHY_BROKERS:
            env.cluster.set_rtt(b, 150)
        try:
            got = fetch(client, topic)
        finally:
            for b in HEALTHY_BROKERS:
                env.cluster.set_rtt(b, 0)
        wait_for("the stand-in to spoil a Fetch answer", lambda: env.bad.injected(mode, apis.FETCH) >= 1)
        assert {p: (got[p].code, got[p].values) for p in HEALTHY} == {p: (0, expected[p]) for p in HEALTHY}, f"healthy partitions: {got}"
        for p in ON_BAD:
            if mode == "unknown_tags":
                assert (got[p].code, got[p].values) == (0, expected[p]), f"a legal answer changed partition {p}: {got[p]}"
            else:
                # A retriable error, or "no data yet" as from an idle broker; never records that were not sent.
                assert got[p].code in RETRIABLE or (got[p].code == 0 and got[p].values == []), f"partition {p} (broker {BAD}): {got[p]}"
        env.bad.passthrough()

        def recovered() -> bool:
            again = fetch(client, topic)
            return all((again[p].code, again[p].values) == (0, expected[p]) for p in ON_BAD)

        wait_for(f"broker {BAD}'s records to arrive on the same client connection", recovered, timeout=RECOVERY_S, every=0.1)
    env.check()


# --- 3. Real clients while broker 2 misbehaves at random -------------------------------------------


def test_real_clients_ride_out_a_broker_that_misbehaves_at_random(env: Env) -> None:
    """An idempotent librdkafka producer and a consumer, while a share of broker 2's Produce and Fetch
    answers is spoiled, one kind after another; then it behaves: every record delivered, in order, none lost."""
    topic = new_topic(env.cluster)
    k = env.kfan
    reports = Reports()
    producer_errors: list[KafkaError] = []
    consumer_errors: list[KafkaError] = []
    producer = Producer(
        {
            "bootstrap.servers": k.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            # One Produce in flight. With several, a request pipelined behind one whose link failed
            # ("maybe written", yet never forwarded) goes out on a fresh link and is written; the
            # embedded broker checks no sequence numbers for a non-transactional producer (Kafka
            # would refuse the gap, OUT_OF_ORDER_SEQUENCE_NUMBER), and librdkafka, seeing the later
            # batch acknowledged, takes the earlier one as written: acknowledged, yet not in the log.
            "max.in.flight.requests.per.connection": 1,
            "message.timeout.ms": 60_000,
            "retry.backoff.ms": 50,
            "retry.backoff.max.ms": 500,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
            "error_cb": producer_errors.append,
        }
    )
    consumed: list[tuple[int, int, bytes | None, bytes]] = []
    message_errors: list[KafkaError] = []
    stop = threading.Event()
    failures: list[BaseException] = []

    def consume() -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": k.bootstrap,
                "group.id": f"bf-{uuid.uuid4()}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500,
                "error_cb": consumer_errors.append,
            }
        )
        try:
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ALL])
            while not stop.is_set():
                for m in consumer.consume(500, timeout=0.2):
                    if m.error() is not None:
                        message_errors.append(m.error())
                    else:
                        consumed.append((m.partition(), m.offset(), m.key(), m.value()))
        except BaseException as e:
            failures.append(e)
        finally:
            consumer.close()

    reader = threading.Thread(target=consume)
    reader.start()
    sent = 0
    timeline = [("garbage", 0.3), ("wrong_cid", 0.3), ("close", 0.2), ("huge_prefix", 0.2)]
    try:
        # Both clients up and flowing through kfan first (the idempotent producer has its id).
        for _ in range(60):
            producer.produce(topic, value=str(sent).encode(), partition=sent % PARTITIONS, on_delivery=reports)
            sent += 1
        wait_for(
            "the first records to be delivered and consumed",
            lambda: producer.poll(0.05) >= 0 and (bool(failures) or not k.alive() or len(consumed) >= 60),
            timeout=20,
        )
        started = time.monotonic() - sent / CHAOS_RATE

        def produce_while(mode: str, until: float) -> bool:
            """Records at CHAOS_RATE a second; True once ``until`` has passed and ``mode`` has been injected."""
            nonlocal sent
            due = int((time.monotonic() - started) * CHAOS_RATE)
            while sent < due:
                producer.produce(topic, value=str(sent).encode(), partition=sent % PARTITIONS, on_delivery=reports)
                sent += 1
            producer.poll(0.01)
            return not k.alive() or (time.monotonic() >= until and env.bad.injected(mode) >= 1)

        for seed, (mode, probability) in enumerate(timeline):
            env.bad.set_mode(mode, api_keys={apis.PRODUCE, apis.FETCH}, probability=probability, seed=seed)
            # Each kind for a second at least, and until it was injected at least once (a loaded machine
            # sends fewer answers a second, and each is spoiled by chance).
            until = time.monotonic() + 1.0
            wait_for(f"{mode} to be injected", lambda mode=mode, until=until: produce_while(mode, until), timeout=60, every=0)
        env.bad.passthrough()
        wait_for(
            "every record to be delivered after the broker behaved again",
            lambda: producer.poll(0.05) >= 0 and (len(producer) == 0 or not k.alive()),
            timeout=45,
        )
        try:
            wait_for(
                "the consumer to read every delivered record",
                lambda: bool(failures) or not k.alive() or len({v for _, _, _, v in list(consumed)}) >= len(reports.ok),
                timeout=30,
            )
        except AssertionError as e:
            got = {int(v) for _, _, _, v in list(consumed)}
            missing = sorted(i for i in reports.ok if i not in got)
            last = {p: max((o for q, o, _, _ in consumed if q == p), default=-1) for p in ALL}
            with RawClient(env.cluster.brokers[BAD]) as direct:  # broker 2's own log, past the stand-in and kfan
                log = read_log(direct, topic, ON_BAD)
            where = {i: [(p, o) for p in ON_BAD for o, v in log[p] if v == str(i).encode()] for i in missing[:10]}
            ends = {p: log[p][-1][0] if log[p] else -1 for p in ON_BAD}
            raise AssertionError(
                f"{e}: {len(missing)} delivered records not consumed; (partition, offset) in broker {BAD}'s log: {where}; "
                f"last offset consumed per partition {last}; broker {BAD}'s last offsets {ends}"
            ) from None
    finally:
        stop.set()
        reader.join(30)
        dispose(producer)
    assert not reader.is_alive(), "the consumer did not stop"  # what it consumed no longer changes
    print(f"injected: { {m: env.bad.injected(m) for m, _ in timeline} }; client errors: {producer_errors[:5]} {consumer_errors[:5]}")
    env.check()
    assert not failures, failures
    assert len(producer) == 0, f"{len(producer)} records still undelivered after the broker behaved again"
    for mode, _ in timeline:
        assert env.bad.injected(mode) >= 1, f"{mode} was never injected"
    assert reports.failed == {}, f"{len(reports.failed)} records failed, e.g. {list(reports.failed.items())[:3]}"
    assert sorted(reports.ok) == list(range(sent))
    assert message_errors == [], f"the consumer was handed errors: {message_errors[:5]}"
    offsets_twice = [po for po, n in Counter((p, o) for p, o, _, _ in consumed).items() if n > 1]
    assert not offsets_twice, f"the consumer was handed {len(offsets_twice)} offsets twice, e.g. {offsets_twice[:5]}"
    values = {int(v) for _, _, _, v in consumed}
    assert values == set(range(sent)), f"{sent} delivered, {len(values)} consumed: missing {sorted(set(range(sent)) - values)[:10]}"
    # The log may hold a record twice where kfan answered "maybe written" (REQUEST_TIMED_OUT) and the
    # producer wrote it again: the embedded broker does not deduplicate an idempotent producer's retries
    # (librdkafka straight to it through the same stand-in writes duplicates too). Only there, though:
    # the healthy brokers' partitions hold each record once, and every partition keeps the produce order.
    first_seen: dict[int, list[int]] = defaultdict(list)
    seen: set[int] = set()
    twice: Counter[int] = Counter()
    for p, _, _, v in sorted(consumed, key=lambda row: (row[0], row[1])):
        if int(v) in seen:
            twice[p] += 1
        else:
            seen.add(int(v))
            first_seen[p].append(int(v))
    print(f"records written twice after a 'maybe written' answer, by partition: {dict(twice)}")
    assert not set(twice) - set(ON_BAD), f"records written twice on healthy brokers' partitions: {dict(twice)}"
    for p, order in first_seen.items():
        assert order == sorted(order), f"partition {p}: produce order lost"


# --- 4. Unknown tagged fields in every answer of broker 2, coordinator included -----------------------


def test_unknown_tagged_fields_from_the_coordinator_change_nothing(env: Env) -> None:
    """Legal Kafka: a newer broker's tagged fields. Broker 2 coordinates the group and adds one to every
    flexible answer (to clients and to kfan's control plane): a group consumes and commits as usual."""
    topic = new_topic(env.cluster)
    group = f"bf-group-{uuid.uuid4()}"
    env.cluster.set_coordinator("group", group, BAD)
    env.bad.set_mode("unknown_tags")
    flow = Flow(topic, produce_via=env.kfan, consume_via=env.kfan, rate=400, group=group).start()
    try:
        wait_for(
            "the group to consume and commit",
            lambda: bool(flow.failures) or not env.kfan.alive() or (len(flow.consumed) >= 400 and len(flow.commits) >= 3),
            timeout=30,
        )
        # Before the member leaves (leaving revokes): one assignment, never revoked.
        rebalanced = (flow.assignments, flow.revocations)
    finally:
        if env.kfan.alive():
            flow.finish(30)
        else:  # nothing to wait for: let the clients go at once
            flow.producer.purge()
            flow.stop_producing.set()
            flow.stop_consuming.set()
            for t in flow.threads:
                t.join(15)
        dispose(flow.producer)
    injected = {api: env.bad.injected("unknown_tags", api) for api in (0, 1, 2, 3, 8, 9, 10)}
    print(f"answers given an unknown tag, by api key: {injected}")
    env.check()
    assert injected[apis.OFFSET_COMMIT] >= 1 or injected[apis.OFFSET_FETCH] >= 1, "no coordinator answer was given an unknown tag"
    assert injected[apis.PRODUCE] >= 1 and injected[apis.FETCH] >= 1, injected
    assert flow.reports.failed == {}
    assert sorted(flow.reports.ok) == list(range(flow.sent))
    assert sorted(int(v) for _, _, _, v in flow.consumed) == list(range(flow.sent)), "records lost or consumed twice"
    check_in_order(flow.consumed)
    assert flow.consumer_errors == [] and flow.producer_errors == [], (flow.consumer_errors, flow.producer_errors)
    assert flow.commit_errors == [], flow.commit_errors[:3]
    assert rebalanced == ([ALL], 0), f"the group rebalanced (assignments, revocations): {rebalanced}"


# --- 5. kfan's own topology refresh gets bad Metadata -----------------------------------------------


@pytest.fixture
def plane(cluster3: MockCluster, bad: BadBroker, kfans: _Kfans) -> Iterator[Env]:
    """Brokers 1 and 3 behind stand-ins too, so that every refresh kfan makes meets a bad answer,
    and a kfan of the test's own (started after the stand-ins, stopped at the end).

    The module's kfan is stopped first: the stand-ins then see one kfan's control plane only."""
    kfans.stop()
    bad.passthrough()
    extra = {b: BadBroker(cluster3.brokers[b], seed=b, lifetime=300).start() for b in (1, 3)}
    for b, stand_in in extra.items():
        cluster3.set_broker_address(b, "127.0.0.1", stand_in.port)
    k: Kfan | None = None
    try:
        # kfan bootstraps from the brokers' own ports: its first topology is good.
        k = start_kfan(cluster3.bootstrap, *KFAN_ARGS)
        e = Env(cluster3, bad, k, 0, list(extra.values()))
        yield e
    finally:
        if k is not None:
            k.stop()
            print("kfan's log (tail):\n" + "".join(k.log)[-8000:])
        bad.passthrough()
        for b, stand_in in extra.items():
            cluster3.set_broker_address(b, *cluster3.brokers[b])
            stand_in.stop()


GOOD_METADATA_SEEN_TIMEOUT = 30.0  # kfan refreshes every second: a generous deadline


@pytest.mark.parametrize("mode", ["undecodable_metadata", "metadata_no_brokers"])
def test_refresh_through_bad_metadata_keeps_the_last_good_topology(plane: Env, mode: str) -> None:
    env, k = plane, plane.kfan
    stand_ins = [env.bad, *env.extra]
    topic = new_topic(env.cluster)
    acked = Acked()
    with KfanClient(k) as client:
        assert produce(client, topic, ALL, "before", acked) == dict.fromkeys(ALL, 0)
    for s in stand_ins:
        s.reset_counts()
        s.set_mode(mode, client_ids={KFAN_CLIENT_ID})

    def spoiled() -> int:
        return sum(s.injected(mode, apis.METADATA) for s in stand_ins)

    wait_for(
        "kfan to refresh its topology through a bad broker", lambda: spoiled() >= 1 or not k.alive(), timeout=GOOD_METADATA_SEEN_TIMEOUT
    )
    # Two more refreshes at least, all through bad brokers: each asks every broker (all behind stand-ins) first.
    first = spoiled()
    wait_for(
        "two more refreshes through bad brokers",
        lambda: spoiled() >= first + 2 * len(stand_ins) or not k.alive(),
        timeout=GOOD_METADATA_SEEN_TIMEOUT,
        seen=lambda: f"{spoiled()} Metadata answers spoiled",
    )
    assert k.alive(), f"kfan exited on a bad Metadata answer to its own refresh:\n{env.log()[-6000:]}"
    # Still serving with the last good topology: a new connection (new links) reaches every leader.
    with KfanClient(k) as client:
        assert produce(client, topic, ALL, "during", acked) == dict.fromkeys(ALL, 0)
    # And a real client that learns the cluster through kfan (its own Metadata is answered well).
    producer = Producer({"bootstrap.servers": k.bootstrap, "acks": "all", "linger.ms": 5, "message.timeout.ms": 15_000})
    reports = Reports()
    try:
        for i in range(60):
            producer.produce(topic, value=str(i).encode(), partition=i % PARTITIONS, on_delivery=reports)
        left = producer.flush(20)
    finally:
        dispose(producer)
    assert left == 0 and reports.failed == {} and len(reports.ok) == 60, (left, reports.failed)
    for i in sorted(reports.ok):
        acked.values[i % PARTITIONS].append(str(i).encode())
        acked.attempts[i % PARTITIONS] += 1
    # The clients' own Metadata spoiled as well: an answer that reads, or a closed connection; never a crash,
    # and what a client was told does not poison what kfan serves others.
    for s in stand_ins:
        s.set_mode(mode)
    metadata = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=uuid.UUID(int=0), name=topic),),  # type: ignore[arg-type]
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    with KfanClient(k) as asker:
        asker.send(metadata)
        try:
            answer = asker.receive(15)
        except (ConnectionResetError, BrokenPipeError):
            answer = None
        if answer is not None:
            body = decode(apis.METADATA, 12, answer)
            # kfan, or with the cluster's ids the brokers kfan knows (the answer listed none), at kfan's address.
            shown = [(b["node_id"], b["host"], b["port"]) for b in body["brokers"]]
            assert shown == [(i, *k.address) for i in shown_ids(env.cluster.brokers)], body["brokers"]
    with KfanClient(k) as client:
        assert produce(client, topic, ALL, "clients-spoiled", acked) == dict.fromkeys(ALL, 0)
    assert k.alive(), env.log()[-6000:]
    # Good answers again: kfan refreshes from them and keeps serving.
    for s in stand_ins:
        s.passthrough()
    passed_before = sum(s.passed(apis.METADATA, KFAN_CLIENT_ID) for s in stand_ins)
    wait_for(
        "a good refresh",
        lambda: sum(s.passed(apis.METADATA, KFAN_CLIENT_ID) for s in stand_ins) > passed_before or not k.alive(),
        timeout=GOOD_METADATA_SEEN_TIMEOUT,
    )
    with KfanClient(k) as client:
        assert produce(client, topic, ALL, "after", acked) == dict.fromkeys(ALL, 0)
    check_acknowledged_are_there(k, topic, acked)
    env.check()
