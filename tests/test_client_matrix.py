"""Real clients through the real kfan process, every client library against every backend.

The matrix, ``test_round_trip[<client>-<backend>]``: confluent-kafka,
kafka-python, aiokafka and kcat (Debian's 1.7.1, librdkafka 2.0.2: an older
protocol stack) each produce keyed records through kfan, then read them back
as the only member of a fresh consumer group of the same library (one routine
per library, tests/support/round_trip.py), against

- ``mock``: kfan (``kfan``) in front of the 3-broker librdkafka mock, 10,000
  records to a 6-partition topic led by brokers 1,2,3,1,2,3, checked by
  ``check_exactly_once_in_order``;
- ``tansu``: kfan (``kfan_tansu``) in front of Tansu, 500 records to a
  3-partition topic created with CreateTopics through kfan, checked by
  ``check_round_trip``;
- ``kafka``: kfan (``kfan_kafka``) in front of Apache Kafka 4 (a controller and
  three brokers, tests/support/apache_kafka), 10,000 records to a 6-partition
  topic replicated on all three, checked as on the mock; and each client's same
  round trip straight to those brokers (``test_round_trip_directly_against_apache_kafka``),
  with the same checks;
- ``kafka-ids``: the same through kfan showing the brokers' own ids, every
  one at kfan's address (``kfan_kafka_ids``, ``--broker-ids cluster``); not
  kcat, whose librdkafka 2.0.2 keeps one connection for all the brokers at one
  address (it moves it from node id to node id and fetches from one broker
  only: librdkafka issue 4212);
- ``kafka-ports``: the same with a port per broker id (``kfan_kafka_ports``,
  ``--broker-port-base``), kcat included.

With ``KFAN_BROKER_IDS=cluster`` for the whole run, every backend's kfan shows
the brokers' own ids, and kcat runs only where each has an address of its own.

Every record exactly once, per-partition order kept; the client's metadata
shows exactly one broker, kfan (with the brokers' ids: every broker, each at
kfan's address), and the topic's partitions; the member was
assigned every partition; nothing more arrives after the records (kcat: it
reports the end of each partition at the offset after its last record); the
group's offsets are committed through kfan and read back by the member and
by a fresh client.

kcat also checks ``-L`` (one broker, kfan's address, the topic's partitions)
and a ``-C -e`` read with librdkafka's Fetch logging (the high watermarks kfan
answers). kcat is found on PATH or installed with apt (tests/support/kcat.py);
if neither works the kcat tests fail.
"""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.tools.mock_cluster import MockCluster
from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.kcat import Consumed, Kcat, Row
from tests.support.kfan import Kfan, shows_cluster_ids
from tests.support.round_trip import (
    ROUND_TRIPS,
    RoundTrip,
    Trip,
    check_exactly_once_in_order,
    check_round_trip,
    committed_offsets,
    end_offsets,
    kcat_round_trip,
    keyed_records,
    round_trip_records,
)
from tests.support.tansu import Tansu

TANSU_RECORDS = 500
TANSU_PARTITIONS = 3
_names = itertools.count(1)


def _name(prefix: str) -> str:
    return f"{prefix}{next(_names)}-{uuid.uuid4().hex[:8]}"


@dataclass
class Backend:
    """One backend behind its kfan, and what a round trip through it must give."""

    name: str
    kfan: Kfan
    partitions: int
    records: list[tuple[bytes, bytes]] = field(repr=False)
    new_topic: Callable[[], str] = field(repr=False)
    check: Callable[[list[Row]], None] = field(repr=False)
    replicas: int = 1  # each partition's replication factor
    broker_ids: list[int] | None = None  # --broker-ids cluster: the brokers' ids the client sees (else kfan's, 0)
    port_base: int = 0  # --broker-port-base: broker N at port_base + N

    def brokers(self) -> list[tuple[int, str, int]]:
        """The brokers a client's metadata must show: each at kfan's address (or its own port of kfan's)."""
        return [(i, self.kfan.host, self.port_base + i if self.port_base else self.kfan.port) for i in self.broker_ids or [0]]


def _tansu_topic(kfan: Kfan) -> str:
    """A fresh 3-partition topic on Tansu, created with CreateTopics through kfan."""
    name = _name("rt")
    admin = AdminClient({"bootstrap.servers": kfan.bootstrap})  # kept alive until the answer is in
    admin.create_topics([NewTopic(name, TANSU_PARTITIONS, 1)], operation_timeout=10)[name].result(30)
    return name


CLIENTS = ["confluent-kafka", "kafka-python", "aiokafka", "kcat"]
BACKENDS = ["mock", "tansu", "kafka", "kafka-ids", "kafka-ports"]
NEEDS_PORTS = {"kcat"}  # clients that tell brokers apart by address, not by node id
# Backends whose kfan shows several broker ids at its one address (KFAN_BROKER_IDS=cluster: the mock's and Kafka's too).
MANY_IDS_AT_ONE_ADDRESS = {"kafka-ids", *(("mock", "kafka") if shows_cluster_ids() else ())}


def _serves(client: str, backend: str) -> bool:
    return not (client in NEEDS_PORTS and backend in MANY_IDS_AT_ONE_ADDRESS)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every client on every backend it can use (module-scoped, so each kfan and topic setup runs once)."""
    names = metafunc.fixturenames
    if "client" in names and "backend" in names:
        pairs = [(c, b) for b in BACKENDS for c in CLIENTS if _serves(c, b)]
        metafunc.parametrize(("client", "backend"), pairs, indirect=True, scope="module", ids=[f"{c}-{b}" for c, b in pairs])
    elif "backend" in names:
        backends = [b for b in BACKENDS if "kcat" not in names or _serves("kcat", b)]
        metafunc.parametrize("backend", backends, indirect=True, scope="module")
    elif "client" in names:
        metafunc.parametrize("client", CLIENTS, indirect=True, scope="module")


@pytest.fixture(scope="module")
def client(request: pytest.FixtureRequest) -> RoundTrip:
    """The client library's round trip (tests/support/round_trip.py)."""
    if request.param == "kcat":
        return partial(kcat_round_trip, request.getfixturevalue("kcat"))
    return ROUND_TRIPS[request.param]


def _kafka_topic(kafka: KafkaCluster) -> str:
    """A fresh 6-partition topic on Apache Kafka, replicated on all three brokers."""
    name = _name("ak")
    kafka.create_topic(name, 6)
    return name


@pytest.fixture(scope="module")
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param.startswith("kafka"):
        kafka: KafkaCluster = request.getfixturevalue("apache_kafka")
        port_base = 0
        if request.param == "kafka-ports":
            kfan_kafka, port_base = request.getfixturevalue("kfan_kafka_ports")
        else:
            kfan_kafka = request.getfixturevalue("kfan_kafka_ids" if request.param == "kafka-ids" else "kfan_kafka")
        ids = None if request.param == "kafka" and not shows_cluster_ids() else sorted(kafka.brokers)
        new_topic = lambda: _kafka_topic(kafka)  # noqa: E731
        return Backend(request.param, kfan_kafka, 6, round_trip_records(), new_topic, check_exactly_once_in_order, 3, ids, port_base)
    if request.param == "mock":
        kfan: Kfan = request.getfixturevalue("kfan")
        cluster: MockCluster = request.getfixturevalue("cluster")

        def mock_topic() -> str:
            name = _name("kc")
            cluster.create_topic(name, 6)  # led by brokers 1,2,3,1,2,3, as the `topic` fixture's
            return name

        ids = sorted(cluster.brokers) if shows_cluster_ids() else None
        return Backend("mock", kfan, 6, round_trip_records(), mock_topic, check_exactly_once_in_order, broker_ids=ids)
    kfan = request.getfixturevalue("kfan_tansu")
    records = keyed_records(TANSU_RECORDS)
    return Backend(
        "tansu",
        kfan,
        TANSU_PARTITIONS,
        records,
        lambda: _tansu_topic(kfan),
        lambda consumed: check_round_trip(consumed, records, TANSU_PARTITIONS),
        broker_ids=[Tansu.NODE_ID] if shows_cluster_ids() else None,
    )


def test_round_trip(client: RoundTrip, backend: Backend) -> None:
    topic, group = backend.new_topic(), _name("g")
    trip = client(backend.kfan.bootstrap, topic, group, backend.records)
    assert sorted(trip.brokers) == backend.brokers()
    _check_trip(trip, backend.kfan.bootstrap, topic, group, backend.partitions, backend.check)


def test_round_trip_directly_against_apache_kafka(client: RoundTrip, apache_kafka: KafkaCluster) -> None:
    """The same round trip straight to Apache Kafka's brokers, with the same checks: what kfan is held to."""
    topic, group = _kafka_topic(apache_kafka), _name("g")
    trip = client(apache_kafka.bootstrap, topic, group, round_trip_records())
    assert sorted(trip.brokers) == sorted((i, host, port) for i, (host, port) in apache_kafka.brokers.items())
    _check_trip(trip, apache_kafka.bootstrap, topic, group, 6, check_exactly_once_in_order)


def _check_trip(trip: Trip, bootstrap: str, topic: str, group: str, partitions: int, check: Callable[[list[Row]], None]) -> None:
    assert trip.partitions == set(range(partitions))
    assert trip.assigned == set(range(partitions)), trip.log
    check(trip.consumed)
    assert trip.extra == []  # nothing more arrives after the records
    ends = end_offsets(trip.consumed)
    if trip.eof is not None:
        assert trip.eof == ends
    if trip.committed is not None:
        assert trip.committed == ends
    # Read back by a fresh client (OffsetFetch, after the member left).
    assert committed_offsets(bootstrap, group, topic, partitions) == ends


# --- kcat, against both backends: its metadata and its Fetch answers -----------------------


@dataclass
class KcatRun:
    topic: str
    consumed: Consumed


@pytest.fixture(scope="module")
def kcat_round_trip_run(backend: Backend, kcat: Kcat) -> KcatRun:
    """One ``kcat -P`` of the backend's records to a fresh topic, read back once by ``kcat -C -e``
    with librdkafka's per-partition Fetch logging on (``-d msg``)."""
    topic = backend.new_topic()
    kcat.produce(backend.kfan.bootstrap, topic, backend.records)
    return KcatRun(topic, kcat.consume(backend.kfan.bootstrap, topic, "-d", "msg", timeout=90))


def test_kcat_metadata_shows_only_kfan(backend: Backend, kcat: Kcat) -> None:
    topic = backend.new_topic()
    md = kcat.metadata(backend.kfan.bootstrap, topic)
    ids = [i for i, _, _ in backend.brokers()]
    shown = [{"id": i, "name": f"{host}:{port}"} for i, host, port in backend.brokers()]
    assert sorted(md["brokers"], key=lambda b: b["id"]) == shown, md["brokers"]
    # With a port per broker, kcat's bootstrap address is no broker's: it reports the answer as the bootstrap's (-1).
    assert md["controllerid"] in ids and md["originating_broker"]["id"] in ids + ([-1] if backend.port_base else [])
    [t] = md["topics"]
    assert t["topic"] == topic and "error" not in t, t
    assert [p["partition"] for p in t["partitions"]] == list(range(backend.partitions))
    for p in t["partitions"]:
        if backend.broker_ids is None:
            # Every replica is kfan, and there are as many as the real ones: the replication factor tools show.
            kfan_replicas = [{"id": 0}] * backend.replicas
            assert (p["leader"], p["replicas"], p["isrs"]) == (0, kfan_replicas, kfan_replicas), p
        else:  # the brokers' own: every replica of the topic, the leader among them
            assert sorted(r["id"] for r in p["replicas"]) == ids and p["leader"] in ids, p


def test_kcat_produce_then_consume(backend: Backend, kcat_round_trip_run: KcatRun) -> None:
    consumed = kcat_round_trip_run.consumed
    backend.check(consumed.rows)
    # -e: kcat reached the end of every partition, at the offset after its last record.
    assert consumed.eof == end_offsets(consumed.rows)


def test_kcat_fetch_answers_carry_true_high_watermarks(backend: Backend, kcat_round_trip_run: KcatRun) -> None:
    """Every partition of every Fetch answer kcat handled, error-free, reports the partition's
    real high watermark and last stable offset (nothing was produced meanwhile, so: its end
    offset), as the broker itself reports them. librdkafka decides end-of-partition from them."""
    consumed = kcat_round_trip_run.consumed
    ends = end_offsets(consumed.rows)
    fetched = consumed.fetched(kcat_round_trip_run.topic)
    assert {p for p, *_ in fetched} == set(ends), "kcat logged no Fetch answer for some partitions"
    wrong = Counter((p, hw, lso) for p, _, err, hw, lso in fetched if err == "Success" and (hw, lso) != (ends[p], ends[p]))
    assert not wrong, (
        f"Fetch answers with a wrong high watermark / LSO, as (partition, high watermark, LSO): count "
        f"(end offsets {ends}; {len(fetched)} partition answers; kcat took {consumed.seconds:.1f} s to reach the end): {dict(wrong)}"
    )
