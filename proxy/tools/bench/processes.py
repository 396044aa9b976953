"""`kfan serve` as a child process, and the little process plumbing around it.

Shared by ``kfan bench`` (which measures a kfan it starts itself) and the
integration tests (``tests/support/kfan.py``): start ``kfan serve`` on a free
port, wait for the line it prints once it accepts clients, keep its output
flowing into a list, stop it (SIGTERM, then SIGKILL), and read its CPU time.
It knows nothing of what is measured.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# The tree this kfan was imported from. The child imports the same code, so a
# bench copied into another checkout measures that checkout's kfan.
ROOT = Path(__file__).resolve().parents[3]

SERVING = r"kfan: serving on (\S+):(\d+)"  # the line kfan prints once it accepts clients
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


def follow_output(process: subprocess.Popen[str], ready: str, timeout: float) -> tuple[list[str], re.Match[str] | None]:
    """Copy ``process``'s stdout, line by line, into a list from a daemon thread, and
    wait up to ``timeout`` s for the first line matching the regular expression ``ready``.

    Returns the list (it keeps growing while the process writes) and that match, or
    None when the output ended or the time ran out first.
    """
    log: list[str] = []
    found: list[re.Match[str]] = []
    done = threading.Event()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            log.append(line)
            if not found and (m := re.search(ready, line)):
                found.append(m)
                done.set()
        done.set()

    threading.Thread(target=pump, daemon=True).start()
    done.wait(timeout)
    return log, (found[0] if found else None)


def stop_process(process: subprocess.Popen[str] | subprocess.Popen[bytes], timeout: float) -> int:
    """SIGTERM, up to ``timeout`` s to exit, then SIGKILL; the exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    return process.returncode


@dataclass
class Kfan:
    """A running `kfan serve` process; ``log`` is its output (stdout and stderr), growing as it writes."""

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

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int:
        return stop_process(self.process, STOP_TIMEOUT_S)


def start_kfan(
    bootstrap: str,
    *extra: str,
    env: Mapping[str, str] | None = None,
    wait: bool = True,
    log_level: str | None = "INFO",
    timeout: float = START_TIMEOUT_S,
    cwd: Path | None = None,
) -> Kfan:
    """``kfan serve`` on a free port of 127.0.0.1; ``env``: KFAN_* variables for it. ``wait=False``: do not wait
    for it to serve (a kfan that cannot reach its brokers); its port is then unknown (0). ``log_level`` None:
    no flag (the config file's, or kfan's default).

    ``cwd``: its working directory (default: this process's). Raises RuntimeError, with its output,
    when it does not serve within ``timeout`` s.
    """
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy",
            "serve",
            "--bootstrap",
            bootstrap,
            "--listen",
            "127.0.0.1:0",
            *(["--log-level", log_level] if log_level else []),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=cwd,
    )
    log, serving = follow_output(proc, SERVING, timeout if wait else 0)
    if not wait:
        return Kfan(proc, "127.0.0.1", 0, log)
    if serving is None:
        proc.kill()
        proc.wait(5)
        raise RuntimeError("kfan did not start:\n" + "".join(log))
    return Kfan(proc, serving.group(1), int(serving.group(2)), log)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` has used so far, its threads included, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # The command name (field 2) is in parentheses and may hold spaces: count fields after its closing one.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")
