"""Multi-host: cluster, kfan and client each in a network namespace of their own.

    [cluster ns] 10.231.0.1 --veth-- 10.231.0.2 [kfan ns] 10.231.1.2 --veth-- 10.231.1.3 [client ns]

The client's namespace has no route to the cluster's addresses, so the round
trip only works if every address the client is given is kfan's advertised
one: a leaked backend address would fail to connect. Needs root; `ip`
(iproute2) is installed with apt when missing. Skipped, with the reason, only
where namespaces cannot be created (not root, or the kernel refuses).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from tests.support import ROOT
from tests.support.apt import ensure_command
from tests.support.kfan import shown_ids
from tests.support.processes import follow_output

CLIENT = r"""
import sys, uuid
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
bootstrap = sys.argv[1]
md = AdminClient({"bootstrap.servers": bootstrap}).list_topics("t", timeout=20)
print("BROKERS", sorted(f"{b.host}:{b.port}" for b in md.brokers.values()))
print("PARTITIONS", len(md.topics["t"].partitions))
p = Producer({"bootstrap.servers": bootstrap})
for i in range(300):
    p.produce("t", key=str(i).encode(), value=str(i).encode())
assert p.flush(30) == 0
c = Consumer({"bootstrap.servers": bootstrap, "group.id": str(uuid.uuid4()), "enable.auto.commit": False})
c.assign([TopicPartition("t", i, 0) for i in range(6)])
got = set()
import time
deadline = time.time() + 60
while len(got) < 300 and time.time() < deadline:
    got.update(int(m.value()) for m in c.consume(500, timeout=0.5) if m.error() is None)
c.close()
print("CONSUMED", len(got), sorted(got) == list(range(300)))
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def namespaces() -> Iterator[dict[str, str]]:
    if os.geteuid() != 0:
        pytest.skip(f"creating network namespaces needs root; this test runs as uid {os.geteuid()}")
    ensure_command("ip", "iproute2")  # installed with apt when missing, never a reason to skip
    tag = uuid.uuid4().hex[:6]
    ns = {"cluster": f"kc{tag}", "kfan": f"kk{tag}", "client": f"kl{tag}"}
    try:
        _ip("netns", "add", ns["cluster"])
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot create network namespaces here: {e.stderr.decode().strip()}")
    try:
        _ip("netns", "add", ns["kfan"])
        _ip("netns", "add", ns["client"])
        _ip("link", "add", f"a{tag}", "type", "veth", "peer", "name", f"b{tag}")
        _ip("link", "add", f"c{tag}", "type", "veth", "peer", "name", f"d{tag}")
        for dev, where, addr in (
            (f"a{tag}", ns["cluster"], "10.231.0.1/24"),
            (f"b{tag}", ns["kfan"], "10.231.0.2/24"),
            (f"c{tag}", ns["kfan"], "10.231.1.2/24"),
            (f"d{tag}", ns["client"], "10.231.1.3/24"),
        ):
            _ip("link", "set", dev, "netns", where)
            _ip("-n", where, "addr", "add", addr, "dev", dev)
            _ip("-n", where, "link", "set", dev, "up")
        for where in ns.values():
            _ip("-n", where, "link", "set", "lo", "up")
        yield ns
    finally:
        for where in ns.values():
            subprocess.run(["ip", "netns", "del", where], capture_output=True)


def _start(ns: str, *argv: str, ready: str) -> tuple[subprocess.Popen[str], list[str], re.Match[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "proxy", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    log, started = follow_output(proc, ready, 60)
    if started is None:
        proc.kill()
        raise AssertionError(f"{argv[0]} did not start in {ns}:\n" + "".join(log))
    return proc, log, started


def test_client_reaches_the_cluster_only_through_kfans_advertised_address(namespaces: dict[str, str]) -> None:
    cluster, _, m = _start(
        namespaces["cluster"],
        "cluster",
        "--brokers",
        "3",
        "--topic",
        "t:6",
        "--host",
        "10.231.0.1",
        ready=r"Run: kfan serve --bootstrap (\S+)",
    )
    kfan = None
    try:
        bootstrap = m.group(1)
        assert all(a.startswith("10.231.0.1:") for a in bootstrap.split(","))
        kfan, kfan_log, _ = _start(
            namespaces["kfan"],
            "serve",
            "--bootstrap",
            bootstrap,
            "--listen",
            "10.231.1.2:9092",
            ready=r"kfan: serving on 10\.231\.1\.2:9092",
        )
        # The client namespace cannot reach the cluster at all: no route.
        probe = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                namespaces["client"],
                sys.executable,
                "-c",
                f"import socket; socket.create_connection(('10.231.0.1', {bootstrap.split(',')[0].split(':')[1]}), timeout=2)",
            ],
            capture_output=True,
        )
        assert probe.returncode != 0, "the client must not reach the brokers directly"
        run = subprocess.run(
            ["ip", "netns", "exec", namespaces["client"], sys.executable, "-c", CLIENT, "10.231.1.2:9092"],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert run.returncode == 0, run.stdout + run.stderr + "".join(kfan_log[-30:])
        # Every broker the client is shown (kfan, or the cluster's three) at kfan's address.
        assert f"BROKERS {['10.231.1.2:9092'] * len(shown_ids([1, 2, 3]))}" in run.stdout
        assert "PARTITIONS 6" in run.stdout
        assert "CONSUMED 300 True" in run.stdout
        assert "10.231.0.1" not in run.stdout
    finally:
        for proc in (kfan, cluster):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
