"""500 client connections at once through the real kfan process, started with a soft fd limit of 1024.

Each connection produces a few records and fetches them back
(:func:`proxy.tools.bench.clients.many_clients`), and all of them are held open
together. kfan then holds more descriptors than 1024 (a client socket plus
a link or more per broker each), so the one run shows both that every client
is served and that ``kfan serve`` raised its own soft limit to the hard one.
Once the clients leave, kfan must let go of what they made it hold: its
client and broker connections fall back to where they were.
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from proxy.server.serve import check_fd_capacity
from proxy.tools.bench.clients import many_clients
from proxy.tools.mock_cluster import MockCluster
from tests.support.kfan import start_kfan
from tests.support.metrics import http_get, metrics_port_in, parse_samples
from tests.support.waiting import wait_for, wait_for_line

BROKERS = 3
PARTITIONS = 12
CLIENTS = 500
LOWERED = 1024  # the soft limit many Linux machines start processes with
# kfan's worst case (its socket and two lanes to each broker per client) and a margin;
# this process needs about as many, holding the brokers' end of every link.
NEEDED = CLIENTS * (2 + 2 * BROKERS) + 200


@contextmanager
def soft_fd_limit(soft: int) -> Iterator[None]:
    """This process's soft descriptor limit set to ``soft`` for the block: what a child started in it inherits."""
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (before, hard))


def kfan_connections(metrics_port: int) -> tuple[int, int]:
    """(client connections, broker connections) as kfan's own metrics count them."""
    status, text = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
    assert status == 200, text
    samples = parse_samples(text)
    clients = sum(v for _, v in samples.get("kfan_client_connections", []))
    brokers = sum(v for _, v in samples.get("kfan_broker_connections", []))
    return int(clients), int(brokers)


def fd_limits(pid: int) -> tuple[str, str]:
    """(soft, hard) limit on open files of process ``pid``, as /proc/<pid>/limits writes them."""
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return soft, hard
    raise AssertionError(f"no open files limit for {pid}")


def test_many_clients_served_and_released() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < NEEDED:
        pytest.fail(f"{CLIENTS} clients need a hard fd limit of at least {NEEDED}, this machine's is {hard}", pytrace=False)
    # The mock brokers run in this process: their end of each of kfan's links is a descriptor here.
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else max(soft, NEEDED), hard))
    progress: list[str] = []
    with MockCluster(BROKERS) as cluster:
        cluster.create_topic("many", PARTITIONS)
        with soft_fd_limit(LOWERED):
            kfan = start_kfan(cluster.bootstrap, "--metrics-listen", "127.0.0.1:0")
        try:
            metrics_port = metrics_port_in(kfan.log)
            kfan_soft, kfan_hard = fd_limits(kfan.process.pid)
            assert kfan_soft == kfan_hard, f"kfan kept a soft fd limit of {kfan_soft} (hard {kfan_hard})"
            assert any(f"soft limit raised from {LOWERED} to" in line for line in kfan.log), "".join(kfan.log)
            idle_clients, idle_brokers = kfan_connections(metrics_port)
            assert idle_clients == 0

            # Generous deadlines (every connection served; kfan letting go once they closed): they bound a
            # hang, on a machine however busy; what the clients were served is what is asserted.
            result = many_clients(
                kfan.host, kfan.port, kfan.process.pid, "many", PARTITIONS, CLIENTS, progress.append, timeout=300, settle_timeout=120
            )
            report = "\n".join([*progress, *(f"{k} = {v}" for k, v in result.items())])
            assert result["served"] == CLIENTS and result["failed"] == 0, report
            assert result["client_connections_peak"] == CLIENTS, report
            # Each client has at most one link per broker on MAIN and FETCH, and one SHARED link (Metadata others
            # share, to its "any broker"); kfan's own control links come on top.
            held = result["broker_connections_peak"] - result["broker_connections_idle"]
            assert CLIENTS <= held <= CLIENTS * (BROKERS * 2 + 1), report
            assert result["kfan_fds_peak"] > LOWERED, report  # the raised limit was needed

            # Every client left: kfan closes their broker links with them.
            wait_for(
                f"kfan to hold no client connection and its {idle_brokers} idle broker connections again",
                lambda: kfan_connections(metrics_port) == (0, idle_brokers),
                60,
                seen=lambda: f"(clients, broker connections) {kfan_connections(metrics_port)}\n{report}",
            )
            assert result["client_connections_after"] == 0 and result["broker_connections_after"] <= result["broker_connections_idle"], (
                report
            )
            assert kfan.alive(), "".join(kfan.log[-50:])
        finally:
            code = kfan.stop()
        assert code == 0, "".join(kfan.log[-50:])
    # Out of descriptors, trio's accept loop logs EMFILE at ERROR: nothing of the kind may have happened.
    # kfan has exited, but the thread copying its output may still be behind: read once it has
    # copied kfan's words on stopping, written after every client came and went.
    wait_for_line(kfan.log, r"stopping: (every connection drained|\d+ connections still busy)")
    errors = [line for line in list(kfan.log) if " ERROR " in line or "Too many open files" in line]
    assert not errors, "".join(errors)


def test_fd_capacity_is_said_at_startup(caplog: pytest.LogCaptureFixture) -> None:
    """A descriptor limit too low for --max-connections clients using every broker is said once, at startup."""
    with caplog.at_level(logging.INFO, logger="kfan.server"):
        fits = check_fd_capacity(20_000, 3, 10_000)
    assert 2_200 < fits < 20_000 // 8  # per client: its socket, two lanes to each of 3 brokers and one SHARED link, less kfan's own
    assert f"holds about {fits} client connections" in caplog.text and "--max-connections 10000" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kfan.server"):
        assert check_fd_capacity(1_048_576, 3, 10_000) > 10_000
    assert not caplog.records
