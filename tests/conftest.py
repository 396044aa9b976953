"""Fixtures: the embedded multi-broker cluster, Apache Kafka 4 and 3.9, the real kfan process in front of each, kcat.

And hypothesis's settings for the whole suite: no property test may fail because the
machine is slow (no deadline, no too-slow health check) or replay what an earlier run
saved (no example database); a test's own ``@settings`` still sets its example count.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from proxy.tools.mock_cluster import MockCluster
from tests.support import scheduling
from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.apache_kafka.distribution import KAFKA_3, KAFKA_4
from tests.support.kcat import Kcat, KcatUnavailable, ensure_kcat
from tests.support.kfan import Kfan, kfan_for_session, shows_cluster_ids, start_kfan_with_broker_ports
from tests.support.tansu import Tansu

settings.register_profile("kfan", deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kfan")


@pytest.fixture(scope="session")
def cluster() -> Iterator[MockCluster]:
    """A 3-broker cluster for the whole session; tests create their own topics."""
    with MockCluster(3) as mock:
        yield mock


@pytest.fixture(scope="session")
def kfan(cluster: MockCluster) -> Iterator[Kfan]:
    yield from kfan_for_session(cluster.bootstrap, "kfan")


@pytest.fixture(scope="session")
def tansu() -> Iterator[Tansu]:
    """One Tansu broker (node 111, in memory) for the whole session."""
    with Tansu() as broker:
        yield broker
        assert broker.alive(), "tansu died during the session:\n" + "".join(broker.log[-50:])


@pytest.fixture(scope="session")
def kfan_tansu(tansu: Tansu) -> Iterator[Kfan]:
    """kfan in front of the single Tansu broker."""
    yield from kfan_for_session(tansu.bootstrap, "kfan (tansu)")


def _kafka_for_session(workdir: Path, version: str, name: str) -> Iterator[KafkaCluster]:
    """A KafkaCluster for the session; at its end, every node must still be the process the session started."""
    with KafkaCluster(workdir, version=version) as kafka:
        yield kafka
        dead = [n.node_id for n in kafka.nodes.values() if n.process is not None and n.process.poll() is not None]
        assert not dead, f"{name} nodes {dead} died during the session:\n{kafka.logs_tail()}"


@pytest.fixture(scope="session")
def apache_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Apache Kafka 4 for the whole session: a controller and three brokers (racks a, b, c), RF 3, min ISR 2.

    Its nodes' logs stay in pytest's temporary directory (``apache-kafka*``) for diagnosis."""
    yield from _kafka_for_session(tmp_path_factory.mktemp("apache-kafka"), KAFKA_4, "Apache Kafka")


@pytest.fixture(scope="session")
def kfan_kafka(apache_kafka: KafkaCluster) -> Iterator[Kfan]:
    """kfan in front of Apache Kafka."""
    yield from kfan_for_session(apache_kafka.bootstrap, "kfan (apache kafka)")


@pytest.fixture(scope="session")
def kfan_kafka_one_node(request: pytest.FixtureRequest, apache_kafka: KafkaCluster) -> Iterator[Kfan]:
    """kfan in front of Apache Kafka showing itself as the one broker (``--broker-ids kfan``) whatever the run's
    mode, for tests of what that mode shows: ``kfan_kafka`` itself unless the run shows the brokers' ids."""
    if not shows_cluster_ids():
        yield request.getfixturevalue("kfan_kafka")
        return
    yield from kfan_for_session(apache_kafka.bootstrap, "kfan (apache kafka, one node)", "--broker-ids", "kfan")


@pytest.fixture(scope="session")
def kfan_kafka_ids(apache_kafka: KafkaCluster) -> Iterator[Kfan]:
    """kfan in front of Apache Kafka, showing clients the brokers' own ids (``--broker-ids cluster``)."""
    yield from kfan_for_session(apache_kafka.bootstrap, "kfan (apache kafka, cluster ids)", "--broker-ids", "cluster")


@pytest.fixture(scope="session")
def kfan_kafka_ports(apache_kafka: KafkaCluster) -> Iterator[tuple[Kfan, int]]:
    """kfan in front of Apache Kafka showing the brokers' own ids, each at a port of its own (``--broker-port-base``),
    and that base."""
    k, base = start_kfan_with_broker_ports(apache_kafka.bootstrap, sorted(apache_kafka.brokers), "--metadata-refresh", "2")
    yield k, base
    alive, code = k.alive(), k.stop()
    assert alive and code == 0, "kfan (broker ports) died or did not stop cleanly:\n" + "".join(k.log[-50:])


@pytest.fixture(scope="module")
def quorum_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """The fault suites' own Apache Kafka 4, one per module: a quorum of three controllers (so that the active one
    can be killed) and three brokers, RF 3, min ISR 2. Its nodes are stopped, killed and paused; the session's
    cluster is not."""
    with KafkaCluster(tmp_path_factory.mktemp("kafka-faults"), controllers=3) as kafka:
        yield kafka
        kafka.kill()  # thrown away: its six nodes' shutdown took 27 s


@pytest.fixture(scope="module")
def quorum_kfan(quorum_kafka: KafkaCluster) -> Iterator[Kfan]:
    """kfan in front of it, for the whole module: it must live through every fault."""
    yield from kfan_for_session(quorum_kafka.bootstrap, "kfan (faults)", "--metrics-listen", "127.0.0.1:0")


@pytest.fixture(scope="module")
def apache_kafka_3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Apache Kafka 3.9, the last line serving the request versions Kafka 4 removed (KIP-896), for old
    clients: the same layout as ``apache_kafka``. One per module that asks for it (tests/test_old_clients.py): idle, its four
    JVMs burnt 9% of a core all session long.

    Its nodes' logs stay in pytest's temporary directory (``apache-kafka-3*``)."""
    yield from _kafka_for_session(tmp_path_factory.mktemp("apache-kafka-3"), KAFKA_3, "Apache Kafka 3")


@pytest.fixture(scope="module")
def kfan_kafka_3(apache_kafka_3: KafkaCluster) -> Iterator[Kfan]:
    """kfan in front of Apache Kafka 3.9."""
    yield from kfan_for_session(apache_kafka_3.bootstrap, "kfan (apache kafka 3)")


# The modules that only the long mode runs (README "Kafka's bad days": the fault scenarios one by one).
collect_ignore = [] if os.environ.get("KFAN_LONG_FAULTS") == "1" else ["test_kafka_faults_long.py"]


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        scheduling.name_units_file()


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        scheduling.forget_units_file()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> scheduling.ModuleUnits:
    return scheduling.ModuleUnits(config, log)  # type: ignore[arg-type]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    scheduling.arrange(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """A failed test shows the tail of the log of each kfan it was given as a fixture: a kfan shared by a module or
    the session outlives the failure, so nothing else would show what it did then."""
    report: pytest.TestReport = yield
    if report.failed and call.when == "call":
        for name, value in getattr(item, "funcargs", {}).items():
            if isinstance(value, Kfan):
                report.sections.append((f"{name}'s log (tail)", "".join(value.log[-150:])))
    return report


_topics = iter(range(1, 1_000_000))


@pytest.fixture
def topic(cluster: MockCluster) -> str:
    """A fresh 6-partition topic led by brokers 1,2,3,1,2,3."""
    name = f"t{next(_topics)}-{int(time.time() * 1000) % 100000}"
    cluster.create_topic(name, 6)
    return name


@pytest.fixture(scope="session")
def kcat() -> Kcat:
    """kcat from PATH, or installed with apt; the test fails (never skips) when neither works."""
    try:
        path = ensure_kcat()
    except KcatUnavailable as e:
        pytest.fail(str(e), pytrace=False)
    return Kcat(path)
