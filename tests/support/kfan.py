"""The real kfan process, as the integration tests start it: ``kfan serve`` on a free port.

The launching itself lives in :mod:`proxy.tools.bench.processes`, shared with ``kfan bench``.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress

from proxy.tools.bench.processes import SERVING, Kfan
from proxy.tools.bench.processes import start_kfan as _start_kfan
from proxy.tools.mock_cluster import MockCluster

__all__ = [
    "KFAN_NODE",
    "SERVING",
    "Kfan",
    "kfan_at",
    "kfan_for_session",
    "kfan_on",
    "scheduled_first",
    "shown_ids",
    "shows_cluster_ids",
    "start_kfan",
    "start_kfan_with_broker_ports",
]

KFAN_NODE = 0  # the one node id a kfan shows with --broker-ids kfan (its default --node-id)


# CFS weight 9,548 against a client thread's 1,024: under a hundred clients' threads on two cores, kfan's event
# loop gets about 40% of a core when it wants it, where at nice 0 it got 7-10%.
LOOP_NICE = -10


@contextmanager
def scheduled_first(kfan: Kfan) -> Iterator[None]:
    """kfan's event loop (its main thread: Linux keeps a nice value per thread) ahead of the test's own clients for
    the CPU, as kfan on cores of its own in a deployment. It needs root; without it, the test runs as it is.

    A test that runs a hundred librdkafka clients (several threads each) beside the brokers on two cores otherwise
    starves kfan: measured in the metadata-storm test, its loop waited for a core 80-100% of the time for 10-30 s,
    so its links' connects passed their 10 s deadline with the brokers answering at once."""
    pid = kfan.process.pid
    try:
        os.setpriority(os.PRIO_PROCESS, pid, LOOP_NICE)
    except PermissionError:
        yield
        return
    try:
        yield
    finally:
        with suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, pid, 0)


def shows_cluster_ids() -> bool:
    """Whether the suite's kfans show clients the brokers' own ids: ``KFAN_BROKER_IDS=cluster`` for the whole run
    (README, "Tested against") reaches every kfan the suite starts; a fixture's own ``--broker-ids`` wins."""
    return os.environ.get("KFAN_BROKER_IDS", "kfan") == "cluster"


def shown_ids(real: Iterable[int]) -> list[int]:
    """The broker ids a client of the suite's kfans sees: the brokers' own, or kfan's one node."""
    return sorted(real) if shows_cluster_ids() else [KFAN_NODE]


def start_kfan(
    bootstrap: str, *extra: str, env: Mapping[str, str] | None = None, wait: bool = True, log_level: str | None = "INFO"
) -> Kfan:
    """``kfan serve`` on a free port, logging at ``log_level`` (None: as its config file says); ``env``: KFAN_*
    variables for it. ``wait=False``: do not wait for it to serve (a kfan that cannot reach its brokers); its port
    is then unknown (0)."""
    return _start_kfan(bootstrap, *extra, env=env, wait=wait, log_level=log_level)


def kfan_for_session(bootstrap: str, name: str, *extra: str) -> Iterator[Kfan]:
    """A kfan process that must live through the session and stop cleanly at its end."""
    k = start_kfan(bootstrap, "--metadata-refresh", "2", *extra)
    yield k
    alive = k.alive()
    code = k.stop()
    assert alive, f"{name} died during the session:\n" + "".join(k.log[-50:])
    assert code == 0, f"{name} did not stop cleanly (exit {code}):\n" + "".join(k.log[-50:])


@contextmanager
def kfan_on(cluster: MockCluster, *extra: str, bootstrap: str | None = None) -> Iterator[Kfan]:
    """kfan in front of ``cluster``, refreshing every second; it must survive and stop cleanly."""
    with kfan_at(bootstrap or cluster.bootstrap, *extra) as k:
        yield k


@contextmanager
def kfan_at(bootstrap: str, *extra: str, log_level: str | None = "INFO") -> Iterator[Kfan]:
    """kfan in front of the brokers at ``bootstrap``, refreshing every second; it must survive and stop cleanly."""
    k = start_kfan(bootstrap, "--metadata-refresh", "1", *extra, log_level=log_level)
    try:
        yield k
    except BaseException:
        k.stop()
        print("kfan's log (tail):\n" + "".join(k.log[-80:]))  # shown by pytest with the failure
        raise
    alive = k.alive()
    code = k.stop()
    assert alive, "kfan died during the test:\n" + "".join(k.log[-60:])
    assert code == 0, f"kfan did not stop cleanly (exit {code}):\n" + "".join(k.log[-60:])


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_kfan_with_broker_ports(bootstrap: str, broker_ids: list[int], *extra: str, attempts: int = 8) -> tuple[Kfan, int]:
    """``kfan serve --broker-ids cluster --broker-port-base BASE`` and BASE: one whose ports for ``broker_ids`` were free
    a moment before; should another process take one first, kfan cannot listen there, and another base is tried."""
    failures = []
    for _ in range(attempts):
        base = random.randrange(20_000, 60_000 - max(broker_ids))
        if not all(_free(base + i) for i in broker_ids):
            continue
        try:
            return start_kfan(bootstrap, "--broker-ids", "cluster", "--broker-port-base", str(base), *extra), base
        except RuntimeError as e:
            if "cannot listen" not in str(e):
                raise
            failures.append(str(e).splitlines()[-1])
    raise RuntimeError(f"no free ports for brokers {broker_ids} in {attempts} tries: {failures}")
