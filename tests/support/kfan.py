"""The real kfan process, as the integration tests start it: ``kfan serve`` on a free port."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from tests.support import ROOT
from tests.support.processes import follow_output, stop_process

SERVING = r"kfan: serving on (\S+):(\d+)"  # the line kfan prints once it accepts clients


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
        return stop_process(self.process, 15)


def start_kfan(bootstrap: str, *extra: str, env: Mapping[str, str] | None = None, wait: bool = True) -> Kfan:
    """``kfan serve`` on a free port; ``env``: KFAN_* variables for it. ``wait=False``: do not wait
    for it to serve (a kfan that cannot reach its brokers); its port is then unknown (0)."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--bootstrap", bootstrap, "--listen", "127.0.0.1:0", "--log-level", "INFO", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    log, serving = follow_output(proc, SERVING, 30 if wait else 0)
    if not wait:
        return Kfan(proc, "127.0.0.1", 0, log)
    if serving is None:
        proc.kill()
        raise RuntimeError("kfan did not start:\n" + "".join(log))
    return Kfan(proc, serving.group(1), int(serving.group(2)), log)


def kfan_for_session(bootstrap: str, name: str) -> Iterator[Kfan]:
    """A kfan process that must live through the session and stop cleanly at its end."""
    k = start_kfan(bootstrap, "--metadata-refresh", "2")
    yield k
    alive = k.alive()
    code = k.stop()
    assert alive, f"{name} died during the session:\n" + "".join(k.log[-50:])
    assert code == 0, f"{name} did not stop cleanly (exit {code}):\n" + "".join(k.log[-50:])
