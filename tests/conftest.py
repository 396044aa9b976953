"""Fixtures: the embedded multi-broker cluster, the real kfan process in front of it, kcat.

And hypothesis's settings for the whole suite: no property test may fail because the
machine is slow (no deadline, no too-slow health check) or replay what an earlier run
saved (no example database); a test's own ``@settings`` still sets its example count.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from backends.mock import MockCluster
from tests.support.kcat import Kcat, KcatUnavailable, ensure_kcat
from tests.support.kfan import Kfan, kfan_for_session
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
