"""The README's first command, from a fresh copy of the repository.

It must set everything up by itself and serve a produce/consume round trip
on 127.0.0.1:9092; the example `kfan demo` prints must work as printed.

The demo's brokers run in a child process (`kfan cluster`): kfan outlives
them, and they do not outlive kfan, however it stops.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, Producer
from kio.schema.api_versions.v2.request import ApiVersionsRequest as ApiVersionsRequestV2
from kio.schema.metadata.v12.request import MetadataRequest

from tests.support.processes import follow_output
from tests.support.rawclient import RawClient
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent


def quickstart_blocks() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def fresh_copy(dest: Path) -> None:
    """What a clone holds: tracked files plus new, not-ignored ones."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def test_readme_has_exactly_two_quickstart_commands() -> None:
    blocks = quickstart_blocks()
    assert len(blocks) == 2
    assert blocks[0].strip().endswith("kfan demo")
    ci = (ROOT / ".ci" / "run").read_text()
    assert blocks[1].strip() in ci, ".ci/run must run the README's test command"


def test_demo_from_fresh_copy(tmp_path: Path) -> None:
    fresh_copy(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    proc = subprocess.Popen(
        ["bash", "-c", quickstart_blocks()[0]],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out, printed = follow_output(proc, "Ctrl-C stops it", 600)
    try:
        assert printed and proc.poll() is None, "kfan demo did not start:\n" + "".join(out[-40:])
        text = "".join(out)
        assert "127.0.0.1:9092" in text
        leaders = [int(b) for b in re.findall(r"partition \d -> broker (\d)", text)]
        assert leaders == [1, 2, 3, 1, 2, 3]
        example = re.search(r"^(\.venv/bin/python - <<'PY'\n.*?\nPY)\n", text, re.S | re.M)
        assert example, "no copy-paste example printed"
        started = time.monotonic()
        run = subprocess.run(["bash", "-c", example.group(1)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        got = re.findall(r"^partition (\d) b'(\d+)' b'hello (\d+)'$", run.stdout, re.M)
        assert sorted(int(v) for _, _, v in got) == list(range(12)), run.stdout
        assert len({p for p, _, _ in got}) > 1, "records spread over partitions led by different brokers"
        assert time.monotonic() - started < 120
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
    assert code == 0, "Ctrl-C must stop kfan demo cleanly:\n" + "".join(out[-20:])


# --- the demo's brokers live in a child process ----------------------------------------


@dataclass
class Demo:
    """A running `kfan demo` (on a free port) and what it printed."""

    process: subprocess.Popen[str]
    log: list[str]
    address: tuple[str, int]
    brokers_pid: int
    broker_ports: list[int]

    def text(self) -> str:
        return "".join(self.log)

    def wait_for_log(self, pattern: str, timeout: float = 15) -> re.Match[str]:
        return wait_for(
            f"{pattern!r} in kfan demo's output",
            lambda: re.search(pattern, self.text(), re.M),
            timeout,
            seen=lambda: "".join(self.log[-40:]),
        )

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError("kfan demo did not stop within 30 s:\n" + "".join(self.log[-40:])) from None


def start_demo(*extra: str, env: dict[str, str] | None = None) -> Demo:
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "demo", "--listen", "127.0.0.1:0", *extra],
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log, started = follow_output(proc, "Ctrl-C stops it", 60)
    if started is None or proc.poll() is not None:
        proc.kill()
        proc.wait()
        raise AssertionError("kfan demo did not start:\n" + "".join(log))
    text = "".join(log)
    host, port = re.search(r"Connect any Kafka client to:\s+(\S+):(\d+)", text).groups()  # type: ignore[union-attr]
    pid, bootstrap = re.search(r"embedded brokers: process (\d+) \(kfan cluster [^)]*\) at (\S+)", text).groups()  # type: ignore[union-attr]
    return Demo(proc, log, (host, int(port)), int(pid), [int(a.rpartition(":")[2]) for a in bootstrap.split(",")])


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for f in Path(f"/proc/{pid}/task").glob("*/children"):
        found |= {int(c) for c in f.read_text().split()}
    return found


def gone(pid: int, timeout: float) -> bool:
    """The process has exited (a zombie counts: it runs nothing, only waits to be reaped)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def round_trip(bootstrap: str, n: int = 12) -> list[tuple[int, bytes]]:
    """Produce n records to the topic demo through kfan and consume them back: (partition, value) pairs."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        producer.produce("demo", key=str(i), value=f"hello {i}")
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"demo-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"})
    got: list[tuple[int, bytes]] = []
    try:
        consumer.subscribe(["demo"])
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            m = consumer.poll(1)
            if m is not None and m.error() is None:
                got.append((m.partition(), m.value()))
    finally:
        consumer.close()
    return got


def test_demo_outlives_its_brokers() -> None:
    """The brokers run in a child process: when it dies (as a crash would kill it), kfan says so once and keeps serving."""
    demo = start_demo("--metrics-listen", "127.0.0.1:0", "--metadata-refresh", "1")
    try:
        assert demo.brokers_pid in children(demo.process.pid), "the brokers are a child process of kfan"
        leaders = [int(b) for b in re.findall(r"partition \d -> broker (\d)", demo.text())]
        assert leaders == [1, 2, 3, 1, 2, 3]
        metrics = int(demo.wait_for_log(r"metrics and health on http://127\.0\.0\.1:(\d+)/metrics").group(1))
        bootstrap = f"{demo.address[0]}:{demo.address[1]}"
        got = round_trip(bootstrap)
        assert sorted(v for _, v in got) == sorted(f"hello {i}".encode() for i in range(12))
        assert len({p for p, _ in got}) > 1
        assert http_status(f"http://127.0.0.1:{metrics}/readyz") == 200

        os.kill(demo.brokers_pid, signal.SIGKILL)
        demo.wait_for_log(rf"embedded brokers: process {demo.brokers_pid} was killed by SIGKILL")
        assert all(refuses(port) for port in demo.broker_ports), "the brokers lived in the child: they are gone with it"
        deadline = time.monotonic() + 15
        while http_status(f"http://127.0.0.1:{metrics}/readyz") != 503:
            assert time.monotonic() < deadline, "/readyz still says ready with every broker gone"
            time.sleep(0.2)
        assert demo.process.poll() is None, "kfan exited with its brokers:\n" + "".join(demo.log[-40:])

        # Still a Kafka endpoint: it accepts connections and answers ApiVersions itself. Metadata
        # needs a broker: with none reachable kfan closes that connection (Metadata has no
        # top-level error code to answer with), which clients treat as "retry" - and the next
        # connection is served again.
        metadata = MetadataRequest(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        for _ in range(2):
            with RawClient(demo.address) as client:
                versions = client.call(ApiVersionsRequestV2())
                assert versions.error_code == 0
                assert {k.api_key for k in versions.api_keys} >= {0, 1, 3, 18}
                client.send(metadata)
                assert client.closed_by_peer(timeout=20), "a Metadata request with every broker gone"
        time.sleep(1.5)  # a few more failed refreshes: the death is still logged once
        assert demo.text().count("embedded brokers: process") == 2, "kfan logs the start and the end of its brokers, once each"
        assert demo.process.poll() is None
    finally:
        code = demo.stop()
    assert code == 0, "kfan demo must stop cleanly on SIGTERM:\n" + "".join(demo.log[-40:])


def test_demo_stops_its_brokers_with_it() -> None:
    demo = start_demo()
    assert demo.brokers_pid in children(demo.process.pid)
    assert not gone(demo.brokers_pid, 0)
    assert demo.stop(signal.SIGTERM) == 0, "".join(demo.log[-40:])
    assert gone(demo.brokers_pid, 0), "SIGTERM to kfan demo left its brokers running"
    assert not Path(f"/proc/{demo.brokers_pid}").exists(), "kfan demo did not reap its brokers"
    assert "was killed by" not in demo.text() and "exited with status" not in demo.text(), "stopping them is not reported as a death"
    assert "killing it" not in demo.text(), "the brokers stop on SIGTERM, SIGKILL is only the fallback"


def test_demo_brokers_die_with_a_killed_kfan() -> None:
    """SIGKILL leaves kfan no chance to clean up: the child notices its pipe to kfan closing and stops."""
    demo = start_demo()
    assert not gone(demo.brokers_pid, 0)
    demo.stop(signal.SIGKILL)
    assert gone(demo.brokers_pid, 15), "the brokers outlived a SIGKILLed kfan demo"


def test_demo_reports_brokers_that_fail_to_start(tmp_path: Path) -> None:
    """The child cannot load librdkafka: kfan demo says so and exits, instead of waiting for brokers."""
    fake = tmp_path / "confluent_kafka"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no librdkafka in this test')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "proxy", "demo", "--listen", "127.0.0.1:0"], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert re.search(r"kfan demo: the embedded brokers \(process \d+: kfan cluster .*\) exited with status 1", run.stderr), run.stderr
    assert "no librdkafka in this test" in run.stderr, "the child's own error reaches kfan's stderr"
    assert "Connect any Kafka client" not in run.stdout
    assert time.monotonic() - started < 30
