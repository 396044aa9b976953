"""Issue 31's attacks replayed against a real kfan, with figures: ``python -m tests.attacks [--only NAME ...]``.

Each attack runs against one ``kfan serve`` (SASL PLAIN and SCRAM for clients)
in front of librdkafka's mock cluster, while a logged-in bystander keeps
asking for metadata. For each, the table gives the bystander's round trips
before and during the attack (p50 and p99, and how much longer its p99 got),
kfan's resident memory at rest, at its peak during the attack and after it,
the peak of ``kfan_buffered_bytes``, the connections kfan closed and why
(``kfan_client_closes_total``), and the log lines the attack cost.

The suite's tests check each limit's behaviour (tests/test_prelogin.py and
the tests named in the README's Robustness section); this prints the figures
the acceptance asks for, which a timed test could not check reliably.
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kio.schema.metadata.v4 import MetadataRequest
from kio.schema.metadata.v4.request import MetadataRequestTopic
from kio.schema.sasl_authenticate.v1 import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1 import SaslHandshakeRequest
from kio.schema.types import TopicName

from proxy.kafka import apis
from proxy.tools.bench.clients import record_batch
from proxy.tools.mock_cluster import MockCluster
from tests.support.kfan import Kfan, start_kfan
from tests.support.messages import request_bytes
from tests.support.metrics import http_get, metrics_port_in, parse_samples
from tests.support.rawclient import RawClient
from tests.support.secure_kfan import KfanSecrets, kfan_secrets
from tests.support.waiting import wait_for

CLOSES = "kfan_client_connections_closed_total"
KiB = 1024
MiB = 1024 * KiB
BASELINE_S = 2.0
SETTLE_S = 20.0  # the longest an attack's memory may take to be given back
# The mock answers a Fetch with about 1 MiB per partition: a topic of 12 such partitions, all led by
# broker 1, makes each Fetch of it a 12 MiB answer.
BIG_PARTITIONS = 12


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def rss(pid: int) -> int:
    """Resident bytes of ``pid`` (0 once it has ended)."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * KiB
    except OSError:
        pass
    return 0


@dataclass
class World:
    kfan: Kfan
    cluster: MockCluster
    secrets: KfanSecrets
    topic: str
    big_topic: str
    metrics_port: int

    def metric(self, family: str) -> dict[str, float]:
        """Each sample of ``family`` by its label text."""
        _, text = http_get(f"http://127.0.0.1:{self.metrics_port}/metrics")
        return dict(parse_samples(text).get(family, []))

    def logged_in(self, user: str = "alice") -> RawClient:
        return _log_in(self.kfan.address, user, self.secrets.passwords[user])


def _log_in(address: tuple[str, int], user: str, password: str) -> RawClient:
    rc = RawClient(address)
    assert rc.call(SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
    assert rc.call(SaslAuthenticateRequest(auth_bytes=f"\0{user}\0{password}".encode())).error_code == 0
    return rc


def _ask_again_and_again(address: tuple[str, int], password: str | None, topic: str, out: Any, stop: Any) -> None:
    """The bystander's process: (sent at, round trip) of each call, or (when, None) when it had to connect again.

    ``password``: bob's, to log in to kfan; None: straight to a broker, which asks for no login.
    """
    request = MetadataRequest(topics=(MetadataRequestTopic(name=TopicName(topic)),), allow_auto_topic_creation=False)
    while not stop.is_set():
        try:
            with RawClient(address) if password is None else _log_in(address, "bob", password) as rc:
                while not stop.is_set():
                    t0 = time.monotonic()
                    rc.call(request)
                    out.put((t0, time.monotonic() - t0))
                    time.sleep(0.01)
        except (OSError, AssertionError):
            # kfan closed it: a Metadata answer has no error code to say every broker is down.
            out.put((time.monotonic(), None))
            time.sleep(0.1)


class Bystander:
    """A client asking for one topic's metadata, again and again, in a process of its own (the
    attackers' threads must not slow its measurements down): (sent at, round trip) of each call.

    Logged in to kfan; or, ``direct``, asking the brokers themselves the same, beside kfan: how much of
    the slowdown through kfan is the brokers' own (the attacks load them too).
    """

    def __init__(self, world: World, direct: bool = False) -> None:
        context = multiprocessing.get_context("spawn")
        self._out = context.Queue()
        self._stop = context.Event()
        self._process = context.Process(
            target=_ask_again_and_again,
            args=(
                _address_of(world.cluster.bootstrap) if direct else world.kfan.address,
                None if direct else world.secrets.passwords["bob"],
                world.topic,
                self._out,
                self._stop,
            ),
            daemon=True,
        )
        self.samples: list[tuple[float, float]] = []
        self.failures: list[float] = []  # when the bystander had to connect again
        self._collector = threading.Thread(target=self._collect, daemon=True)

    def start(self) -> None:
        self._process.start()
        self._collector.start()

    def stop(self) -> None:
        self._stop.set()
        self._process.join(30)

    def _collect(self) -> None:
        while True:
            t0, rtt = self._out.get()
            if rtt is None:
                self.failures.append(t0)
            else:
                self.samples.append((t0, rtt))

    def between(self, start: float, end: float) -> list[float]:
        return [rtt for t0, rtt in list(self.samples) if start <= t0 < end]

    def failed_between(self, start: float, end: float) -> int:
        return sum(start <= t < end for t in list(self.failures))


def _address_of(bootstrap: str) -> tuple[str, int]:
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    return host, int(port)


@dataclass
class Row:
    name: str
    base: list[float]
    during: list[float]
    direct_base: list[float]
    direct_during: list[float]
    rss_base: int
    rss_peak: int
    rss_after: int
    buffered_peak: float
    closes: dict[str, float]
    log_lines: int
    log_bytes: int
    note: str = ""


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def replay(world: World, bystander: Bystander, direct: Bystander, name: str, attack: Callable[[World], str]) -> Row:
    k = world.kfan
    closes_before = world.metric(CLOSES)
    base_start = time.monotonic()
    time.sleep(BASELINE_S)  # the bystander's round trips without an attack
    rss_base = rss(k.pid)
    log_mark = len(k.log)
    peak = [rss_base, 0.0]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            peak[0] = max(peak[0], rss(k.pid))
            try:
                peak[1] = max(peak[1], sum(world.metric("kfan_buffered_bytes").values()))
            except OSError:
                pass
            time.sleep(0.25)  # not oftener: each scrape costs kfan's event loop a few milliseconds

    sampler = threading.Thread(target=sample, daemon=True)
    attack_start = time.monotonic()
    sampler.start()
    note = attack(world)
    attack_end = time.monotonic()
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline and rss(k.pid) > rss_base + 8 * MiB:
        time.sleep(0.2)
    sampling.set()
    sampler.join()
    closes_after = world.metric(CLOSES)
    new_lines = k.log[log_mark:]
    return Row(
        name,
        bystander.between(base_start, attack_start),
        bystander.between(attack_start, attack_end),
        direct.between(base_start, attack_start),
        direct.between(attack_start, attack_end),
        rss_base,
        peak[0],
        rss(k.pid),
        peak[1],
        {labels: n - closes_before.get(labels, 0.0) for labels, n in closes_after.items() if n > closes_before.get(labels, 0.0)},
        len(new_lines),
        sum(len(line) for line in new_lines),
        note + (f"; bystander reconnected {n}x" if (n := bystander.failed_between(attack_start, attack_end)) else ""),
    )


def in_threads(n: int, fn: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=fn, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)


# --- the attacks ---------------------------------------------------------------------------------


def huge_scram_names(world: World) -> str:
    """Finding 1: a 20 MB SCRAM client-first (refused at its size prefix), then 8 clients x 10 of 500 KiB names."""
    with RawClient(world.kfan.address) as rc:
        rc.call(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"))
        rc.send_bytes(struct.pack(">i", 20 * MiB) + b"n,,n=" + b"a" * MiB)
        rc.closed_by_peer(20)

    def one(i: int) -> None:
        for _ in range(10):
            with RawClient(world.kfan.address) as rc:
                rc.call(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"))
                rc.send(SaslAuthenticateRequest(auth_bytes=b"n,,n=" + b"a" * (500 * KiB) + b",r=abcdefgh"))
                rc.closed_by_peer(20)

    in_threads(8, one)
    return "20 MB frame, then 80 x 500 KiB user names"


def _fetch(topic: str, partition_max: int, max_wait_ms: int, correlation_id: int) -> bytes:
    """A Fetch of every partition of the big topic from its start, with ``partition_max`` as every limit."""
    partitions = [{"partition": p, "fetch_offset": 0, "partition_max_bytes": partition_max, "current_leader_epoch": -1}
                  for p in range(BIG_PARTITIONS)]  # fmt: skip
    body = {"replica_id": -1, "max_wait": max_wait_ms, "min_bytes": 1, "max_bytes": partition_max,
            "topics": [{"topic": topic, "partitions": partitions}], "isolation_level": 0, "session_id": 0,
            "session_epoch": -1, "forgotten_topics_data": [], "rack_id": ""}  # fmt: skip
    return framed(request_bytes(apis.FETCH, 12, body, correlation_id=correlation_id))


def _drain_frame(sock: socket.socket) -> None:
    """Read one whole frame and throw it away, in place (the attacker's own CPU must not slow the others)."""
    head = bytearray(4)
    view = memoryview(head)
    while view:
        n = sock.recv_into(view)
        if not n:
            return
        view = view[n:]
    left = struct.unpack(">i", head)[0]
    buffer = bytearray(min(left, MiB))
    while left > 0:
        n = sock.recv_into(buffer, min(left, len(buffer)))
        if not n:
            return
        left -= n


def late_fetch_answers(world: World) -> str:
    """Finding 2: 30 connections each send one Fetch (max_wait 0, 50 MB limits) of 12 MiB, then idle."""
    clients = [world.logged_in() for _ in range(30)]
    try:
        for rc in clients:
            rc.send_bytes(_fetch(world.big_topic, 50 * MiB, 0, 1))
        for rc in clients:
            _drain_frame(rc.sock)
        time.sleep(3)  # idle: what kfan holds for them now is what the brokers' late answers cost
    finally:
        for rc in clients:
            rc.close()
    return "30 x one Fetch, then idle 3 s"


def unread_fetch_pipelines(world: World) -> str:
    """Finding 2: 20 connections pipeline 20 Fetches each and never read."""
    clients = [world.logged_in() for _ in range(20)]
    try:
        for rc in clients:
            rc.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            rc.sock.setblocking(False)
            for cid in range(20):
                try:
                    rc.sock.send(_fetch(world.big_topic, 50 * MiB, 100, cid))
                except BlockingIOError:
                    break
        time.sleep(5)
    finally:
        for rc in clients:
            rc.close()
    return "20 x 20 pipelined Fetches, unread 5 s"


def prelogin_partial_frames(world: World) -> str:
    """Finding 3: six connections not logged in send 90 MB of a 100 MB frame (refused) and 450 KiB of a 500 KiB one."""
    held: list[socket.socket] = []

    def one(i: int) -> None:
        s = socket.create_connection(world.kfan.address)
        held.append(s)
        s.settimeout(2)
        size = 100 * MiB if i % 2 else 500 * KiB
        try:
            s.sendall(struct.pack(">i", size))
            for _ in range(90 if i % 2 else 450):
                s.sendall(b"\x07" * (MiB if i % 2 else KiB))
        except OSError:
            pass

    in_threads(6, one)
    time.sleep(2)
    for s in held:
        s.close()
    return "6 partial frames"


def long_group_ids(world: World) -> str:
    """Finding 4: 200 FindCoordinator requests for 2 MB group ids, from one logged-in client, which then leaves."""
    with world.logged_in() as rc:
        for i in range(200):
            group = f"{i:04d}" + "g" * (2 * MiB)
            rc.send_bytes(framed(request_bytes(apis.FIND_COORDINATOR, 3, {"key": group, "key_type": 0}, correlation_id=i)))
            rc.receive()
    return "200 x 2 MB group ids"


def wrong_plain_logins(world: World) -> str:
    """Finding 5: 48 clients log in with wrong PLAIN passwords as fast as kfan answers, for 5 s."""
    end = time.monotonic() + 5
    counts = [0] * 48

    def one(i: int) -> None:
        while time.monotonic() < end:
            try:
                with RawClient(world.kfan.address) as rc:
                    rc.call(SaslHandshakeRequest(mechanism="PLAIN"))
                    rc.send(SaslAuthenticateRequest(auth_bytes=b"\0alice\0wrong-" + str(counts[i]).encode()))
                    rc.receive(10)
                counts[i] += 1
            except OSError:
                pass

    in_threads(48, one)
    return f"{sum(counts) / 5:.0f} wrong logins/s"


def cluster_down(world: World) -> str:
    """Finding 7: every broker down for 5 s under 20 producing clients."""
    stop = threading.Event()
    batch = record_batch([b"x" * 100], int(time.time() * 1000))
    body = {"transactional_id": None, "acks": 1, "timeout": 1000,
            "topic_data": [{"name": world.topic, "partition_data": [{"index": 1, "records": batch}]}]}  # fmt: skip
    produce = framed(request_bytes(apis.PRODUCE, 9, body))

    def one(i: int) -> None:
        with world.logged_in() as rc:
            while not stop.is_set():
                try:
                    rc.send_bytes(produce)
                    rc.receive(30)
                except OSError:
                    return
                time.sleep(0.01)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(20)]
    for t in threads:
        t.start()
    time.sleep(1)
    for b in (1, 2, 3):
        world.cluster.broker_down(b)
    time.sleep(5)
    for b in (1, 2, 3):
        world.cluster.broker_up(b)
    time.sleep(2)
    stop.set()
    for t in threads:
        t.join(60)
    return "3 of 3 brokers down 5 s"


def unknown_mechanisms(world: World) -> str:
    """Finding 8: 200 SaslHandshakes naming a 30,000-character mechanism (the longest an int16 string holds)."""
    for _ in range(200):
        with RawClient(world.kfan.address) as rc:
            rc.send_bytes(framed(request_bytes(apis.SASL_HANDSHAKE, 1, {"mechanism": "M" * 30_000})))
            rc.closed_by_peer(20)
    return "200 x 30,000-character mechanism names (6 MB in)"


def idle_unauthenticated(world: World) -> str:
    """Finding 8: 1,000 connections that never log in, from another address (127.0.0.2) than the clients'."""
    held = []
    for _ in range(1000):
        try:
            held.append(socket.create_connection(world.kfan.address, source_address=("127.0.0.2", 0)))
        except OSError:
            break
    time.sleep(1)
    with world.logged_in() as rc:  # a new client still gets in
        rc.call(MetadataRequest(topics=None, allow_auto_topic_creation=False))
    open_ = 0
    for s in held:
        s.setblocking(False)
        try:
            open_ += s.recv(1) != b""
        except BlockingIOError:
            open_ += 1
        except OSError:
            pass
        s.close()
    return f"1000 opened, {open_} still open after 1 s"


ATTACKS: dict[str, Callable[[World], str]] = {
    "huge-scram-names": huge_scram_names,
    "late-fetch-answers": late_fetch_answers,
    "unread-fetch-pipelines": unread_fetch_pipelines,
    "prelogin-partial-frames": prelogin_partial_frames,
    "long-group-ids": long_group_ids,
    "wrong-plain-logins": wrong_plain_logins,
    "cluster-down": cluster_down,
    "unknown-mechanisms": unknown_mechanisms,
    "idle-unauthenticated": idle_unauthenticated,
}


def fill_partitions(cluster: MockCluster, topic: str, partitions: int, size: int) -> None:
    """``size`` bytes of records in each partition."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 20, "batch.size": MiB})
    value = b"v" * (64 * KiB)
    for p in range(partitions):
        for _ in range(size // len(value)):
            producer.produce(topic, value, partition=p)
            producer.poll(0)
    if producer.flush(60):
        raise RuntimeError("the big topic was not written")


def header() -> str:
    head = (f"{'attack':<24} {'p50 ms base/att':>16} {'p99 ms base/att':>16} {'+p99 ms':>8} {'+p99 direct':>11} {'RSS MiB rest/peak/after':>24} "
            f"{'buffered MiB':>12} {'log lines/KiB':>14}  closes; note")  # fmt: skip
    return head + "\n" + "-" * len(head)


def line(r: Row) -> str:
    p50 = f"{_quantile(r.base, 0.5) * 1e3:.1f}/{_quantile(r.during, 0.5) * 1e3:.1f}"
    p99 = f"{_quantile(r.base, 0.99) * 1e3:.1f}/{_quantile(r.during, 0.99) * 1e3:.1f}"
    worse = (_quantile(r.during, 0.99) - _quantile(r.base, 0.99)) * 1e3
    worse_direct = (_quantile(r.direct_during, 0.99) - _quantile(r.direct_base, 0.99)) * 1e3
    mem = f"{r.rss_base / MiB:.0f}/{r.rss_peak / MiB:.0f}/{r.rss_after / MiB:.0f}"
    closes = ", ".join(f"{labels.split('=')[-1].strip(chr(34))} {n:.0f}" for labels, n in sorted(r.closes.items())) or "-"
    return (
        f"{r.name:<24} {p50:>16} {p99:>16} {worse:>8.1f} {worse_direct:>11.1f} {mem:>24} {r.buffered_peak / MiB:>12.1f} "
        f"{r.log_lines:>6}/{r.log_bytes / KiB:<7.0f}  {closes}; {r.note} ({len(r.during)} bystander calls)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.attacks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(ATTACKS), help="run only this attack (repeatable)")
    args = parser.parse_args(argv)
    chosen = args.only or list(ATTACKS)
    with MockCluster(3) as cluster, tempfile.TemporaryDirectory() as tmp:
        topic = f"attacks-{uuid.uuid4().hex[:6]}"
        cluster.create_topic(topic, 3)
        big_topic = f"{topic}-big"
        cluster.create_topic(big_topic, BIG_PARTITIONS, leaders=[1] * BIG_PARTITIONS)
        if {"late-fetch-answers", "unread-fetch-pipelines"} & set(chosen):
            fill_partitions(cluster, big_topic, BIG_PARTITIONS, MiB)
        secrets = kfan_secrets(Path(tmp))
        k = start_kfan(cluster.bootstrap, *secrets.sasl_args(), "--metrics-listen", "127.0.0.1:0", "--metadata-refresh", "5")
        try:
            world = World(k, cluster, secrets, topic, big_topic, metrics_port_in(k.log))
            bystander, direct = Bystander(world), Bystander(world, direct=True)
            bystander.start()
            direct.start()
            wait_for("the bystanders' first answers", lambda: len(bystander.samples) > 10 and len(direct.samples) > 10, 60)
            print(f"kfan pid {k.pid} (for py-spy)", flush=True)
            print(header(), flush=True)
            for name in chosen:
                try:
                    print(line(replay(world, bystander, direct, name, ATTACKS[name])), flush=True)
                except Exception as e:  # one attack's failure is reported; the others still run
                    print(f"{name:<24} failed: {e!r}", flush=True)
            bystander.stop()
            direct.stop()
            print(
                f"kfan {'alive' if k.alive() else 'DEAD'}; bystander p50 overall {statistics.median(r for _, r in bystander.samples) * 1e3:.1f} ms"
            )
        finally:
            k.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
