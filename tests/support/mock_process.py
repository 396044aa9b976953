"""The embedded mock cluster in a child process, for tests that send it hostile traffic.

librdkafka's mock brokers do not validate what they receive, and some
requests that pass kfan's schema check crash them (SIGSEGV, SIGABRT). A test
that sends mutated frames through kfan keeps the brokers in a child, so that
such a crash fails that test instead of killing pytest.

Run as ``python -m tests.support.mock_process --brokers N --topic NAME:P
[--advertise BROKER=HOST:PORT ...]``: prints one JSON line (``{"brokers":
{"1": [host, port], ...}}``) once the cluster is up, then serves until its
stdin reaches end of file (the test process is gone or done).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class MockProcess:
    process: subprocess.Popen[str]
    brokers: dict[int, tuple[str, int]]  # where each broker listens

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.brokers.values())

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int | None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        return self.process.returncode


def start(brokers: int, topics: list[tuple[str, int]], advertise: dict[int, tuple[str, int]] | None = None) -> MockProcess:
    argv = [sys.executable, "-m", "tests.support.mock_process", "--brokers", str(brokers)]
    argv += [a for name, n in topics for a in ("--topic", f"{name}:{n}")]
    argv += [a for b, (h, p) in (advertise or {}).items() for a in ("--advertise", f"{b}={h}:{p}")]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError(f"the mock cluster process exited with {proc.wait()}")
    return MockProcess(proc, {int(b): (h, p) for b, (h, p) in json.loads(line)["brokers"].items()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--topic", action="append", default=[])
    parser.add_argument("--advertise", action="append", default=[])
    args = parser.parse_args()
    from proxy.tools.mock_cluster import MockCluster

    with MockCluster(args.brokers) as mock:
        for spec in args.topic:
            name, partitions = spec.rsplit(":", 1)
            mock.create_topic(name, int(partitions))
        for spec in args.advertise:
            broker, address = spec.split("=", 1)
            host, port = address.rsplit(":", 1)
            mock.set_broker_address(int(broker), host, int(port))
        print(json.dumps({"brokers": {b: list(a) for b, a in mock.brokers.items()}}), flush=True)
        sys.stdin.read()  # until the test closes our stdin (or goes away)


if __name__ == "__main__":
    main()
