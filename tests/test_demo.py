"""The README's first command, from a fresh copy of the repository.

It must set everything up by itself and serve a produce/consume round trip
on 127.0.0.1:9092; the example `kfan demo` prints must work as printed.

The demo's brokers run in a child process (`kfan cluster`): kfan outlives
them, and they do not outlive kfan, however it stops.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, Producer
from kio.schema.api_versions.v2.request import ApiVersionsRequest as ApiVersionsRequestV2
from kio.schema.metadata.v12.request import MetadataRequest

from tests.support.metrics import http_get
from tests.support.processes import follow_output
from tests.support.rawclient import RawClient
from tests.support.sockets import LISTEN, tcp_sockets
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


DEMO_PORT = 9092  # where the README's demo serves, as it says
BIND_ATTEMPTS = 5


def accepts(port: int) -> bool:
    """Something listens on 127.0.0.1:``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


def stop_group(proc: subprocess.Popen[str]) -> int:
    """Ctrl-C to the command's process group (as a terminal sends it), then SIGKILL after 30 s; its exit status."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        pass  # it ended already
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def start_quickstart(directory: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], list[str], bool]:
    """The README's first command, run in ``directory`` until kfan demo says how to connect (True) or ends.

    Its port is the README's: another process on the machine (another run of this test) may hold it.
    kfan demo then fails to bind it, and the command is run again once the port is free.
    """
    for _ in range(BIND_ATTEMPTS):
        proc = subprocess.Popen(
            ["bash", "-c", quickstart_blocks()[0]],
            cwd=directory,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        out, said = follow_output(proc, r"Ctrl-C stops it|Address already in use", 600)
        if said is None or said.group(0) != "Address already in use":
            return proc, out, said is not None
        stop_group(proc)
        wait_for(f"127.0.0.1:{DEMO_PORT}, taken by another process, to be free", lambda: not accepts(DEMO_PORT), 600)
    raise AssertionError(f"127.0.0.1:{DEMO_PORT} was taken at each of {BIND_ATTEMPTS} attempts:\n" + "".join(out[-40:]))


def test_demo_from_fresh_copy(tmp_path: Path) -> None:
    fresh_copy(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    proc, out, printed = start_quickstart(tmp_path, env)
    try:
        assert printed and proc.poll() is None, "kfan demo did not start:\n" + "".join(out[-40:])
        text = "".join(out)
        assert f"127.0.0.1:{DEMO_PORT}" in text
        leaders = [int(b) for b in re.findall(r"partition \d -> broker (\d)", text)]
        assert leaders == [1, 2, 3, 1, 2, 3]
        example = re.search(r"^(\.venv/bin/python - <<'PY'\n.*?\nPY)\n", text, re.S | re.M)
        assert example, "no copy-paste example printed"
        started = time.monotonic()
        # The deadline only bounds a hang: how long the example took is reported, never judged.
        run = subprocess.run(["bash", "-c", example.group(1)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        got = re.findall(r"^partition (\d) b'(\d+)' b'hello (\d+)'$", run.stdout, re.M)
        assert sorted(int(v) for _, _, v in got) == list(range(12)), run.stdout
        assert len({p for p, _, _ in got}) > 1, "records spread over partitions led by different brokers"
        print(f"the printed example ran in {time.monotonic() - started:.1f} s")
    finally:
        code = stop_group(proc)
    assert code == 0, "Ctrl-C must stop kfan demo cleanly:\n" + "".join(out[-20:])


# --- the demo's brokers live in a child process ----------------------------------------


@dataclass
class Demo:
    """A running `kfan demo` (on a free port) and what it printed.

    Its output (its brokers' stderr included) goes to a file, not a pipe: once the
    process has exited the file holds all of it, where a thread copying a pipe
    may still be behind by the last lines.
    """

    process: subprocess.Popen[str]
    output: Path
    address: tuple[str, int]
    brokers_pid: int
    brokers_started: str  # their start time: tells them from a later process given the same pid
    broker_ports: list[int]

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    @property
    def log(self) -> list[str]:
        return self.text().splitlines(keepends=True)

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


def start_demo(directory: Path, *extra: str, env: dict[str, str] | None = None) -> Demo:
    output = directory / "kfan-demo.out"
    with output.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "demo", "--listen", "127.0.0.1:0", *extra],
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def read() -> str:
        return output.read_text(errors="replace")

    started = False
    try:
        wait_for("kfan demo to say how to connect", lambda: "Ctrl-C stops it" in read() or proc.poll() is not None, 60, seen=read)
        started = proc.poll() is None
    finally:
        if not started:
            proc.kill()
            proc.wait()
    text = read()
    assert started, "kfan demo did not start:\n" + text
    host, port = re.search(r"Connect any Kafka client to:\s+(\S+):(\d+)", text).groups()  # type: ignore[union-attr]
    pid, bootstrap = re.search(r"embedded brokers: process (\d+) \(kfan cluster [^)]*\) at (\S+)", text).groups()  # type: ignore[union-attr]
    return Demo(proc, output, (host, int(port)), int(pid), start_time(int(pid)), [int(a.rpartition(":")[2]) for a in bootstrap.split(",")])


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for f in Path(f"/proc/{pid}/task").glob("*/children"):
        found |= {int(c) for c in f.read_text().split()}
    return found


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (the first is the state), or None: no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def start_time(pid: int) -> str:
    """When process ``pid`` started (field 22 of /proc/PID/stat, in clock ticks since boot)."""
    fields = _stat(pid)
    assert fields is not None, f"no process {pid}"
    return fields[19]


def process_state(pid: int, started: str) -> str | None:
    """The state (R, S, Z...) of the process ``pid`` that started at ``started``, or None when it is
    no more (reaped; a later process given the same pid is another one)."""
    fields = _stat(pid)
    if fields is None or fields[19] != started:
        return None
    return fields[0]


def gone(pid: int, started: str) -> bool:
    """The process has exited (a zombie counts: it runs nothing, only waits to be reaped)."""
    return process_state(pid, started) in (None, "Z", "X")


def listening_ports(pid: int) -> set[int]:
    """The TCP ports the sockets of process ``pid`` listen on."""
    return {s.local_port for s in tcp_sockets(pid) if s.state == LISTEN}


def round_trip(bootstrap: str, n: int = 12) -> list[tuple[int, bytes]]:
    """Produce n records to the topic demo through kfan and consume them back: (partition, value) pairs."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        producer.produce("demo", key=str(i), value=f"hello {i}")
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"demo-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"})
    got: list[tuple[int, bytes]] = []

    def all_back() -> bool:
        m = consumer.poll(1)
        if m is not None and m.error() is None:
            got.append((m.partition(), m.value()))
        return len(got) >= n

    try:
        consumer.subscribe(["demo"])
        wait_for(f"the {n} records consumed back", all_back, 60, seen=lambda: got)
    finally:
        consumer.close()
    return got


def test_demo_outlives_its_brokers(tmp_path: Path) -> None:
    """The brokers run in a child process: when it dies (as a crash would kill it), kfan says so once and keeps serving."""
    demo = start_demo(tmp_path, "--metrics-listen", "127.0.0.1:0", "--metadata-refresh", "1")
    try:
        assert demo.brokers_pid in children(demo.process.pid), "the brokers are a child process of kfan"
        leaders = [int(b) for b in re.findall(r"partition \d -> broker (\d)", demo.text())]
        assert leaders == [1, 2, 3, 1, 2, 3]
        metrics = int(demo.wait_for_log(r"metrics and health on http://127\.0\.0\.1:(\d+)/metrics").group(1))
        bootstrap = f"{demo.address[0]}:{demo.address[1]}"
        got = round_trip(bootstrap)
        assert sorted(v for _, v in got) == sorted(f"hello {i}".encode() for i in range(12))
        assert len({p for p, _ in got}) > 1
        assert http_get(f"http://127.0.0.1:{metrics}/readyz")[0] == 200
        # The brokers listen in the child, not in kfan: they go with it. (Asked of the processes'
        # own sockets, not by connecting after the kill: another process may bind a port freed then.)
        ports = set(demo.broker_ports)
        assert ports <= listening_ports(demo.brokers_pid), "the brokers listen in the child process"
        assert not ports & listening_ports(demo.process.pid), "kfan itself listens on no broker port"

        os.kill(demo.brokers_pid, signal.SIGKILL)
        demo.wait_for_log(rf"embedded brokers: process {demo.brokers_pid} was killed by SIGKILL")
        assert gone(demo.brokers_pid, demo.brokers_started)
        wait_for(
            "/readyz to say not ready, every broker gone",
            lambda: http_get(f"http://127.0.0.1:{metrics}/readyz")[0] == 503,
            30,
            seen=lambda: "".join(demo.log[-20:]),
        )
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
        # A few more failed refreshes (--metadata-refresh 1): the death is still logged once.
        seen = len(demo.log)
        wait_for(
            "two more failed topology refreshes",
            lambda: sum("topology refresh failed" in line for line in demo.log[seen:]) >= 2,
            30,
            seen=lambda: "".join(demo.log[seen:][-20:]),
        )
        assert demo.text().count("embedded brokers: process") == 2, "kfan logs the start and the end of its brokers, once each"
        assert demo.process.poll() is None
    finally:
        code = demo.stop()
    assert code == 0, "kfan demo must stop cleanly on SIGTERM:\n" + "".join(demo.log[-40:])


def test_demo_stops_its_brokers_with_it(tmp_path: Path) -> None:
    demo = start_demo(tmp_path)
    assert demo.brokers_pid in children(demo.process.pid)
    assert not gone(demo.brokers_pid, demo.brokers_started)
    assert demo.stop(signal.SIGTERM) == 0, "".join(demo.log[-40:])
    assert gone(demo.brokers_pid, demo.brokers_started), "SIGTERM to kfan demo left its brokers running"
    assert process_state(demo.brokers_pid, demo.brokers_started) is None, "kfan demo did not reap its brokers"
    # Complete: kfan demo has exited, after its brokers, and its output is a file.
    text = demo.text()
    assert "was killed by" not in text and "exited with status" not in text, "stopping them is not reported as a death"
    assert "killing it" not in text, "the brokers stop on SIGTERM, SIGKILL is only the fallback"


def test_demo_brokers_die_with_a_killed_kfan(tmp_path: Path) -> None:
    """SIGKILL leaves kfan no chance to clean up: the child notices its pipe to kfan closing and stops."""
    demo = start_demo(tmp_path)
    assert not gone(demo.brokers_pid, demo.brokers_started)
    demo.stop(signal.SIGKILL)
    wait_for(
        "the brokers of a SIGKILLed kfan demo to stop (they must not outlive it)",
        lambda: gone(demo.brokers_pid, demo.brokers_started),
        30,
        seen=lambda: "".join(demo.log[-20:]),
    )


def test_demo_reports_brokers_that_fail_to_start(tmp_path: Path) -> None:
    """The child cannot load librdkafka: kfan demo says so and exits, instead of waiting for brokers."""
    fake = tmp_path / "confluent_kafka"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no librdkafka in this test')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    started = time.monotonic()
    # Waiting for brokers would end in "did not report their address within 60 s": the message
    # tells exiting at once from waiting; how long it took is reported, never judged.
    run = subprocess.run(
        [sys.executable, "-m", "proxy", "demo", "--listen", "127.0.0.1:0"], env=env, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert re.search(r"kfan demo: the embedded brokers \(process \d+: kfan cluster .*\) exited with status 1", run.stderr), run.stderr
    assert "no librdkafka in this test" in run.stderr, "the child's own error reaches kfan's stderr"
    assert "Connect any Kafka client" not in run.stdout
    print(f"kfan demo gave up on its brokers after {time.monotonic() - started:.1f} s")


def test_demo_with_log_json_logs_json_from_its_brokers_too(tmp_path: Path) -> None:
    """The brokers' process writes to kfan's stderr: with --log-json, its lines are JSON objects as kfan's are."""
    out, err = tmp_path / "demo.out", tmp_path / "demo.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "demo", "--listen", "127.0.0.1:0", "--log-json", "true"],
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
            stdout=stdout,
            stderr=stderr,
            text=True,
        )
    try:
        wait_for("kfan demo to say how to connect", lambda: "Ctrl-C stops it" in out.read_text() or proc.poll() is not None, 60)
        pid = int(re.search(r"embedded brokers: process (\d+)", err.read_text()).group(1))  # type: ignore[union-attr]
        started = start_time(pid)
    finally:
        proc.kill()  # SIGKILL: the brokers then log, as they stop, that kfan is gone
        proc.wait()
    wait_for("the brokers of the killed kfan demo to stop", lambda: gone(pid, started), 30, seen=err.read_text)
    events = []
    for line in err.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"a log line that is not JSON: {line!r}") from None
    assert any(e["message"].startswith("the kfan that started this process is gone") for e in events), "no line of the brokers' process"
