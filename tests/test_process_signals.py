"""The kfan process under an unlucky operator: brokers gone, SIGHUP, a killed parent, a port in use.

Each test runs the real `kfan serve` (tests/support/kfan.py) in front of a
:class:`~proxy.tools.mock_cluster.MockCluster`:

* the whole cluster down while clients produce: kfan backs off reconnecting
  (:mod:`backends.backoff`), so its connection attempts and log lines are
  bounded by the backoff's arithmetic, not by the clients' request rate;
* SIGHUP reloads the configuration (nothing changed: generation 1) and keeps every connection;
* SIGKILL of a ``--workers`` parent: its workers see their lifeline close and exit, and remove
  the metrics directory the parent could not;
* an address in use: one line naming it and the OS error, no traceback, exit 1.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from backends.backoff import JITTER, RECONNECT_BACKOFF_MAX_S, RECONNECT_BACKOFF_S
from proxy.kafka import errors
from proxy.tools.bench.processes import ROOT
from proxy.tools.mock_cluster import MockCluster
from tests.support.kfan import Kfan, kfan_on, start_kfan
from tests.support.metrics import http_get, labels_of, metrics_port_in, parse_samples
from tests.support.rawclient import RawClient
from tests.support.records import produce_request
from tests.support.waiting import wait_for, wait_for_line

PARTITIONS = [0, 1, 2, 3, 4, 5]
CLIENTS = 8
OUTAGE_S = 3.0


def backoff_rounds(seconds: float) -> int:
    """How many attempts, at most, one broker gets in ``seconds`` of failing: each delay its shortest (20% less)."""
    rounds, elapsed = 1, 0.0
    while (elapsed := elapsed + min(RECONNECT_BACKOFF_S * 2 ** (rounds - 1) * (1 - JITTER), RECONNECT_BACKOFF_MAX_S)) <= seconds:
        rounds += 1
    return rounds


def new_topic(cluster: MockCluster) -> str:
    name = f"s-{uuid.uuid4().hex[:10]}"
    cluster.create_topic(name, len(PARTITIONS), leaders=[1, 2, 3, 1, 2, 3])
    return name


def broker_connects(k: Kfan) -> dict[str, float]:
    """kfan_broker_connects_total summed over brokers, by result."""
    _, text = http_get(f"http://127.0.0.1:{metrics_port_in(k.log)}/metrics")
    out: dict[str, float] = {}
    for labels, value in parse_samples(text).get("kfan_broker_connects_total", []):
        result = labels_of(labels)["result"]
        out[result] = out.get(result, 0) + value
    return out


def produce_codes(client: RawClient, topic: str) -> set[int]:
    request = produce_request(topic, PARTITIONS, acks=1)
    return {p.error_code.value for p in client.call(request).responses[0].partition_responses}


class Producers:
    """Clients producing to every partition as fast as kfan answers, each in a thread."""

    def __init__(self, k: Kfan, topic: str, n: int) -> None:
        self.stop = threading.Event()
        self.answers = [0] * n
        self.last_ok = [0.0] * n  # when each last had every partition written
        self.errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._run, args=(k, topic, i), daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    def _run(self, k: Kfan, topic: str, i: int) -> None:
        try:
            with RawClient(k.address) as client:
                while not self.stop.is_set():
                    if produce_codes(client, topic) == {errors.NONE}:
                        self.last_ok[i] = time.monotonic()
                    self.answers[i] += 1
        except BaseException as e:  # a client kfan disconnected: the test fails on it
            self.errors.append(e)

    def close(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(30)


def test_an_outage_of_every_broker_costs_a_bounded_number_of_attempts_and_lines() -> None:
    with MockCluster() as c:
        topic = new_topic(c)
        with kfan_on(c, "--metrics-listen", "127.0.0.1:0") as k:
            producers = Producers(k, topic, CLIENTS)
            try:
                wait_for("every client to produce", lambda: all(producers.last_ok), seen=lambda: producers.errors)
                before = broker_connects(k)
                lines_before = len(k.log)
                down_at = time.monotonic()
                for b in (1, 2, 3):
                    c.broker_down(b)
                answered = list(producers.answers)
                # The outage lasts OUTAGE_S while the clients keep asking.
                wait_for("the outage to have lasted its time", lambda: time.monotonic() - down_at >= OUTAGE_S)
                during = [n - m for n, m in zip(producers.answers, answered, strict=True)]
                after = broker_connects(k)
                outage = time.monotonic() - down_at
                lines = k.log[lines_before:]
                for b in (1, 2, 3):
                    c.broker_up(b)
                up_at = time.monotonic()
                wait_for(
                    "every client to produce again",
                    lambda: all(t > up_at for t in producers.last_ok),
                    seen=lambda: "".join(k.log[-20:]),
                )
            finally:
                producers.close()
            assert producers.errors == [], "kfan answered the clients throughout"
        attempts = {r: after.get(r, 0) - before.get(r, 0) for r in ("ok", "failed", "backed_off")}
        link_lines = [line for line in lines if "link to broker" in line]
        print(f"{outage:.1f} s outage: {sum(during)} answers, attempts {attempts}, {len(lines)} lines ({len(link_lines)} link lines)")
        # A request for a broker kfan backs off from waits for the backoff (at most 1.5 s), as a Kafka
        # client holds a request for a node it reconnects to, then gets its retriable error: every client
        # is answered during the outage, at that pace.
        assert all(n >= 1 for n in during), f"answers per client during the outage: {during}"
        # Per broker, the first failure holds every link off (the links already opening fail with
        # it: 2 lanes per client, plus the control plane's), then one attempt per backoff.
        bound = 3 * (2 * CLIENTS + 4 + backoff_rounds(outage))
        tried = attempts["ok"] + attempts["failed"]
        assert tried <= bound, f"{tried} connection attempts in {outage:.1f} s, backoff allows {bound:.0f}"
        assert attempts["backed_off"] > tried, "most requests were failed without a connection attempt"
        # One line per broker per 10 s about its links; the rest grow with attempts, not requests.
        assert len(link_lines) <= 3 * 2, "".join(link_lines)
        assert len(lines) <= tried + 40, "".join(lines[-40:])


def test_sighup_reloads_the_configuration_and_keeps_every_connection() -> None:
    with MockCluster() as c:
        topic = new_topic(c)
        with kfan_on(c) as k, RawClient(k.address) as client:
            assert produce_codes(client, topic) == {errors.NONE}
            start = len(k.log)
            os.kill(k.pid, signal.SIGHUP)
            wait_for_line(k.log, r"SIGHUP: configuration generation 1 \(nothing changed\)", start=start)
            assert produce_codes(client, topic) == {errors.NONE}, "the connection was kept and is served"
            with RawClient(k.address) as other:
                assert produce_codes(other, topic) == {errors.NONE}, "new connections are served"
            assert k.alive()
            assert sum("SIGHUP" in line for line in k.log[start:]) == 2, "".join(k.log[start:])  # heard, and its result


def _gone(pid: int) -> bool:
    """No such process, or a zombie nobody reaps yet (an orphan's new parent may be slow to)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def test_workers_exit_when_their_parent_is_killed(tmp_path: Path) -> None:
    with MockCluster() as c:
        topic = new_topic(c)
        k = start_kfan(c.bootstrap, "--workers", "2", env={"TMPDIR": str(tmp_path)})
        pids: list[int] = []
        try:
            line = wait_for_line(k.log, r"2 workers \(pids \[(\d+), (\d+)\]\)")
            pids += [int(line.group(1)), int(line.group(2))]
            os.kill(k.pid, signal.SIGHUP)
            wait_for_line(k.log, r"received SIGHUP: passed on to the 2 workers")
            wait_for_line(k.log, r"SIGHUP: configuration generation 1")  # a worker's
            with RawClient(k.address) as client:
                assert produce_codes(client, topic) == {errors.NONE}, "the workers serve after a SIGHUP to their parent"
            assert len(list(tmp_path.glob("kfan-metrics-*"))) == 1, "the workers' metrics directory, in TMPDIR"
            k.process.kill()
            k.process.wait(10)
            wait_for("both workers to exit", lambda: all(_gone(p) for p in pids), timeout=30, seen=lambda: "".join(k.log[-20:]))
            assert sum("its pipe closed" in line for line in k.log) == 2, "".join(k.log[-20:])
            assert not list(tmp_path.glob("kfan-metrics-*")), "the last worker out removes the metrics directory"
        finally:
            k.stop()
            for pid in pids:
                if not _gone(pid):
                    os.kill(pid, signal.SIGKILL)


def _serve_on(bootstrap: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--bootstrap", bootstrap, *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_an_address_in_use_is_one_line_and_exit_1() -> None:
    with MockCluster() as c, kfan_on(c, "--metrics-listen", "127.0.0.1:0") as first:
        taken = f"127.0.0.1:{first.port}"
        metrics_taken = f"127.0.0.1:{metrics_port_in(first.log)}"
        cases = [
            (["--listen", taken], rf"kfan serve: cannot listen on {re.escape(taken)} \(--listen\): \[Errno 98\] Address already in use"),
            (["--listen", taken, "--workers", "2"], rf"kfan serve: cannot listen on {re.escape(taken)} \(--listen\): .*in use"),
            (
                ["--listen", "127.0.0.1:0", "--metrics-listen", metrics_taken],
                rf"kfan serve: cannot serve metrics on {re.escape(metrics_taken)} \(--metrics-listen\): .*in use",
            ),
        ]
        for argv, expected in cases:
            done = _serve_on(c.bootstrap, *argv)
            last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
            assert done.returncode == 1, (argv, done.returncode, done.stderr)
            assert re.fullmatch(expected, last), (argv, done.stderr)
            assert "Traceback" not in done.stderr and "ExceptionGroup" not in done.stderr, done.stderr
            assert "kfan: serving on" not in done.stdout
        assert first.alive()
