"""Child processes of the tests: a free port for them, their output as it comes, stopping them."""

from __future__ import annotations

import re
import socket
import subprocess
import threading


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
