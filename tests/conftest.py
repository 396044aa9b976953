"""Fixtures: the embedded multi-broker cluster and the real kfan process in front of it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from backends.mock import MockCluster
from backends.tansu import Tansu

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def cluster() -> Iterator[MockCluster]:
    """A 3-broker cluster for the whole session; tests create their own topics."""
    with MockCluster(3) as mock:
        yield mock


@dataclass
class Kfan:
    """A running `kfan serve` process."""

    process: subprocess.Popen[str]
    host: str
    port: int
    log: list[str]

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return self.process.returncode


def start_kfan(bootstrap: str, *extra: str, env: Mapping[str, str] | None = None) -> Kfan:
    """``kfan serve`` on a free port; ``env``: KFAN_* variables for it."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--bootstrap", bootstrap, "--listen", "127.0.0.1:0", "--log-level", "INFO", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    log: list[str] = []
    ready = threading.Event()
    found: dict[str, str] = {}

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            m = re.search(r"kfan: serving on (\S+):(\d+)", line)
            if m and not ready.is_set():
                found["host"], found["port"] = m.group(1), m.group(2)
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(30) or "port" not in found:
        proc.kill()
        raise RuntimeError("kfan did not start:\n" + "".join(log))
    return Kfan(proc, found["host"], int(found["port"]), log)


def kfan_for_session(bootstrap: str, name: str) -> Iterator[Kfan]:
    """A kfan process that must live through the session and stop cleanly at its end."""
    k = start_kfan(bootstrap, "--metadata-refresh", "2")
    yield k
    alive = k.alive()
    code = k.stop()
    assert alive, f"{name} died during the session:\n" + "".join(k.log[-50:])
    assert code == 0, f"{name} did not stop cleanly (exit {code}):\n" + "".join(k.log[-50:])


@pytest.fixture(scope="session")
def kfan(cluster: MockCluster) -> Iterator[Kfan]:
    yield from kfan_for_session(cluster.bootstrap, "kfan")


@pytest.fixture(scope="session")
def tansu() -> Iterator[Tansu]:
    """One Tansu broker (node 111, in memory) for the whole session."""
    with Tansu() as broker:
        yield broker
        assert broker.alive(), "tansu died during the session"


@pytest.fixture(scope="session")
def kfan_tansu(tansu: Tansu) -> Iterator[Kfan]:
    """kfan in front of the single Tansu broker."""
    yield from kfan_for_session(tansu.bootstrap, "kfan (tansu)")


_topics = iter(range(1, 1_000_000))


@pytest.fixture
def topic(cluster: MockCluster) -> str:
    """A fresh 6-partition topic led by brokers 1,2,3,1,2,3."""
    name = f"t{next(_topics)}-{int(time.time() * 1000) % 100000}"
    cluster.create_topic(name, 6)
    return name
