"""How the suite's two pytest-xdist workers share the modules (``-n 2``, ``tests/conftest.py``).

A worker takes a module whole, so that module fixtures start once. The modules
that use the session's Apache Kafka cluster are one unit, run by one worker:
only that worker starts the cluster. The longest units go first, so that the
two workers end close together: the fault suite (on a cluster of its own), on
one worker, the Apache Kafka unit on the other, then the longest of the rest
(:data:`LONGEST`, by the durations of a two-worker run), then the others in
their usual order. (With the Apache Kafka unit last, one worker ran it alone
for 200 s at the end; early, its idle JVMs cost 6.5 s of CPU a minute.)

Which modules use the cluster only the workers know, once they have
collected (a fixture may ask for it through another). The controller, which
schedules, collects nothing: each worker writes the module → unit map to a
file the controller named (:data:`UNITS_FILE`, in the environment the
workers inherit), and the scheduler reads it when it splits the collection.
(xdist's own ``--dist loadgroup`` renames node ids to do this, which pytest 9
no longer lets it.)
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

UNITS_FILE = "KFAN_TEST_UNITS"  # environment variable: where the workers write the map
APACHE_KAFKA = "apache-kafka"
LONGEST = (  # more than a minute each in a two-worker run, longest first; a unit not here goes after them
    "tests/test_kafka_faults.py",
    APACHE_KAFKA,
    "tests/test_api_surface.py",
    "tests/test_replay.py",
    "tests/test_security.py",
    "tests/test_replay_cluster.py",
    "tests/test_chart.py",
    "tests/test_old_clients.py",
    "tests/test_security_clients.py",
    "tests/test_demo.py",
    "tests/test_broker_faults.py",
)


def module(nodeid: str) -> str:
    return nodeid.split("::")[0]


def arrange(items: list[pytest.Item]) -> None:
    """Order the collection (every module stays whole and in order) and, in a worker, publish the units."""
    users = {module(item.nodeid) for item in items if "apache_kafka" in getattr(item, "fixturenames", ())}
    units = {module(item.nodeid): APACHE_KAFKA if module(item.nodeid) in users else module(item.nodeid) for item in items}

    def rank(item: pytest.Item) -> int:
        unit = units[module(item.nodeid)]
        return LONGEST.index(unit) if unit in LONGEST else len(LONGEST)

    items.sort(key=rank)
    path = os.environ.get(UNITS_FILE)
    if path and os.environ.get("PYTEST_XDIST_WORKER"):
        fd, partial = tempfile.mkstemp(dir=Path(path).parent)
        with os.fdopen(fd, "w") as f:
            json.dump(units, f)
        os.replace(partial, path)  # both workers write the same map: whichever lands last is whole


def name_units_file() -> None:
    """In the controller, before it starts the workers: the file they are to write."""
    fd, path = tempfile.mkstemp(prefix="kfan-test-units-", suffix=".json")
    os.close(fd)
    os.environ[UNITS_FILE] = path


def forget_units_file() -> None:
    """In the controller, at the end of the run."""
    if path := os.environ.pop(UNITS_FILE, None):
        Path(path).unlink(missing_ok=True)


class ModuleUnits(LoadScopeScheduling):
    """xdist's scheduling by scope, with the scope of a test being its module's unit."""

    _units: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._units is None:
            self._units = json.loads(Path(os.environ[UNITS_FILE]).read_text() or "{}")
        return self._units.get(module(nodeid), module(nodeid))
