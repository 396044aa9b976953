"""Brokers' answers kfan holds for a client count against its budgets, seen from outside the real process.

Issue 31, finding 2, replayed against kfan in front of librdkafka's mock
cluster (one broker, six partitions of one 900 KiB batch each: a Fetch of
them all is answered with about 5.3 MiB):

- connections that each send one Fetch (max_wait 0, 50 MiB limits) and then
  idle are answered empty before the broker's answers come (the broker is
  slowed down past kfan's grace); those answers are counted in
  ``kfan_buffered_bytes`` (never past ``--max-buffered-bytes``: the rest are
  dropped unread), let go within seconds while the connections stay open,
  and kfan's resident memory stays within the cap plus a fixed overhead;
- a client that pipelines Fetches and never reads them is counted within
  ``--max-connection-bytes`` plus one answer, and is not sent more Fetches.

Figures come from kfan's metrics endpoint and /proc.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from proxy.kafka import apis
from proxy.kafka.headers import decode_response
from proxy.tools.mock_cluster import MockCluster
from tests.support.kfan import Kfan, kfan_on
from tests.support.messages import request_bytes
from tests.support.metrics import http_get, labels_of, metrics_port_in, parse_samples
from tests.support.rawclient import RawClient
from tests.support.records import record_batch
from tests.support.waiting import elapsed_until, wait_for
from tests.test_client_limits import framed, memory_kib

MiB = 1 << 20
TOPIC = "big"
PARTITIONS = 6
BATCH = 900 * 1024  # one batch per partition: the mock answers a Fetch with one batch of each
ANSWER = PARTITIONS * BATCH  # about what the broker answers a Fetch of every partition with
SLOW_BROKER_MS = 300  # the broker's answers come this long after kfan answered a max_wait 0 Fetch


@pytest.fixture
def big_topic() -> Iterator[MockCluster]:
    """A one-broker cluster of its own (it is slowed down) with :data:`TOPIC` filled."""
    with MockCluster(1) as cluster:
        cluster.create_topic(TOPIC, PARTITIONS)
        yield cluster


def fill(k: Kfan) -> None:
    with RawClient(k.address) as c:
        for p in range(PARTITIONS):
            data = [{"name": TOPIC, "partition_data": [{"index": p, "records": record_batch(b"x" * BATCH)}]}]
            body = {"transactional_id": None, "acks": 1, "timeout": 5000, "topic_data": data}
            c.send_bytes(framed(request_bytes(apis.PRODUCE, 9, body, correlation_id=p)))
            assert c.receive() is not None


def fetch_all(max_wait_ms: int, correlation_id: int = 9, max_bytes: int = 50 * MiB) -> bytes:
    """A Fetch of every partition from offset 0, 50 MiB allowed for each (a distinct ``max_bytes``: a distinct Fetch)."""
    partitions = [
        {"partition": p, "fetch_offset": 0, "partition_max_bytes": 50 * MiB, "current_leader_epoch": -1, "last_fetched_epoch": -1,
         "log_start_offset": -1}
        for p in range(PARTITIONS)
    ]  # fmt: skip
    body = {"replica_id": -1, "max_wait": max_wait_ms, "min_bytes": 1, "max_bytes": max_bytes, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "topics": [{"topic": TOPIC, "partitions": partitions}],
            "forgotten_topics_data": [], "rack_id": ""}  # fmt: skip
    return framed(request_bytes(apis.FETCH, 12, body, correlation_id=correlation_id))


def records_in(answer: bytes) -> int:
    body = decode_response(answer, apis.FETCH, 12)
    return sum(len(p["records"] or b"") for t in body["responses"] for p in t["partitions"])


class Metrics:
    """kfan's metrics, scraped; the peak of ``kfan_buffered_bytes`` over every scrape."""

    def __init__(self, k: Kfan) -> None:
        self.url = f"http://127.0.0.1:{metrics_port_in(k.log)}/metrics"
        self.peak = 0.0

    def samples(self) -> dict[str, list[tuple[str, float]]]:
        status, text = http_get(self.url)
        assert status == 200
        return parse_samples(text)

    def buffered(self) -> float:
        value = self.samples()["kfan_buffered_bytes"][0][1]
        self.peak = max(self.peak, value)
        return value

    def broker_in(self) -> float:
        return next(v for labels, v in self.samples()["kfan_bytes_total"] if labels_of(labels)["direction"] == "broker_in")


@contextmanager
def slow(cluster: MockCluster, ms: int) -> Iterator[None]:
    cluster.set_rtt(1, ms)
    try:
        yield
    finally:
        cluster.set_rtt(1, 0)


def test_late_answers_to_idle_connections_are_counted_within_the_cap_and_let_go(big_topic: MockCluster) -> None:
    cap, n = 24 * MiB, 20  # 20 late answers of 5.3 MiB: about 4 fit the cap
    with kfan_on(big_topic, "--max-buffered-bytes", str(cap), "--metrics-listen", "127.0.0.1:0") as k:
        fill(k)
        m = Metrics(k)
        with RawClient(k.address) as warm:  # the baseline: kfan after answering such a Fetch once
            warm.send_bytes(fetch_all(1000))
            assert records_in(warm.receive() or b"") >= ANSWER - 64 * 1024
        wait_for("nothing held at rest", lambda: m.buffered() < 64 * 1024, 20, seen=m.buffered)
        base = memory_kib(k, "VmRSS") * 1024
        clients = [RawClient(k.address) for _ in range(n)]
        try:
            with slow(big_topic, SLOW_BROKER_MS):
                for c in clients:
                    c.send_bytes(fetch_all(0))
                for c in clients:
                    answer = c.receive()
                    assert answer is not None and records_in(answer) == 0, "answered with the broker's records: not a late answer"
                m.peak = 0.0
                wait_for("the late answers counted", lambda: m.buffered() >= ANSWER, 20, seen=m.buffered)
                wait_for("the late answers let go", lambda: m.buffered() < 64 * 1024, 20, seen=m.buffered)
            peak_rss = memory_kib(k, "VmHWM") * 1024
            rss = lambda: memory_kib(k, "VmRSS") * 1024  # noqa: E731
            after = elapsed_until("RSS back near its baseline", lambda: rss() < base + 16 * MiB, 20)
            print(
                f"{n} idle connections with a late {ANSWER / MiB:.1f} MiB answer each: kfan_buffered_bytes peaked at "
                f"{m.peak / MiB:.1f} MiB (cap {cap / MiB:.0f} MiB); RSS {base / MiB:.0f} MiB at rest, peak {peak_rss / MiB:.0f} MiB "
                f"({(peak_rss - base - m.peak) / MiB:+.1f} MiB beside what the metric counted), back to {rss() / MiB:.0f} MiB "
                f"{after:.1f} s later"
            )
            assert m.peak <= cap, "held past the process's cap"
            assert peak_rss <= base + cap + 32 * MiB, "kfan grew past its cap and a fixed overhead"
            # Still open, and served: the answers were let go, not the connections.
            clients[0].send_bytes(framed(request_bytes(apis.METADATA, 12, {"topics": None}, correlation_id=5)))
            assert clients[0].receive() is not None
        finally:
            for c in clients:
                c.close()


def test_a_client_pipelining_fetches_it_never_reads_is_counted_within_its_budget_and_one_answer(big_topic: MockCluster) -> None:
    limit, pipelined = 8 * MiB, 20
    with kfan_on(big_topic, "--max-connection-bytes", str(limit), "--metrics-listen", "127.0.0.1:0") as k:
        fill(k)
        m = Metrics(k)
        before = m.broker_in()
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # it reads nothing: little room on its side
        s.connect(k.address)
        try:
            for cid in range(pipelined):  # each a distinct Fetch (its max_bytes), none answered from another's
                # max_wait 10 s: the broker's answer always comes within the Fetch's own wait. With 100 ms, a
                # loaded machine had it come after kfan answered empty (max_wait + 20 ms grace), kept for reuse,
                # expired after 1 s and fetched again for the next Fetch: 4 answers in the window, not a leak.
                s.sendall(fetch_all(10_000, correlation_id=cid, max_bytes=50 * MiB + cid))
            # kfan answers what it sent until the client's unread answers fill its budget, then stops.
            wait_for("answers held for the client", lambda: m.buffered() >= ANSWER, 20, seen=m.buffered)
            settled = time.monotonic() + 3  # the Fetches it would still send, given time
            while time.monotonic() < settled:
                m.buffered()
                time.sleep(0.05)
            fetched = (m.broker_in() - before) / ANSWER
            print(
                f"{pipelined} pipelined Fetches never read: {fetched:.1f} answers fetched, kfan_buffered_bytes peaked at "
                f"{m.peak / MiB:.1f} MiB (--max-connection-bytes {limit / MiB:.0f} MiB, one answer {ANSWER / MiB:.1f} MiB)"
            )
            assert m.peak <= limit + ANSWER + 64 * 1024, "counted past the connection's budget and one answer"
            assert fetched < 4, f"{fetched:.1f} answers fetched for a client that read none"
        finally:
            s.close()
        wait_for("let go when the client left", lambda: m.buffered() < 64 * 1024, 20, seen=m.buffered)
