"""Commands the suite needs from Debian packages, installed with apt when missing.

A fresh machine of the CI kind has Python and apt only; kcat, tcpdump and a
Java runtime (for Spark) come from apt. ``apt-get update`` runs only when a
plain install fails. Other test runs on the machine may be running apt at
the same time: apt-get waits for their lock (:data:`LOCK_TIMEOUT_S`) instead
of failing at once, and a command another run installed meanwhile is taken
as found. When neither gives the command, :class:`Unavailable`
carries every attempt's output, for the caller to fail on: a missing tool
never silently skips a test.
"""

from __future__ import annotations

import os
import shutil
import subprocess

# How long apt-get waits for the dpkg lock another apt holds, rather than failing at once.
LOCK_TIMEOUT_S = 600


class Unavailable(RuntimeError):
    """The command is not on PATH and apt could not install it."""


def _apt(*args: str, timeout: float) -> tuple[bool, str]:
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        lock = ("-o", f"DPkg::Lock::Timeout={LOCK_TIMEOUT_S}")
        done = subprocess.run(["apt-get", *lock, *args], capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"apt-get {' '.join(args)}: {e!r}"
    return done.returncode == 0, f"apt-get {' '.join(args)} (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"


def ensure_command(command: str, package: str) -> str:
    """The path of ``command``: on PATH, or installed now with ``apt-get install -y package``."""
    if found := shutil.which(command):
        return found
    attempts: list[str] = []
    ok, out = _apt("install", "-y", "--no-install-recommends", package, timeout=900)
    attempts.append(out)
    if not ok:
        ok, out = _apt("update", timeout=600)
        attempts.append(out)
        ok, out = _apt("install", "-y", "--no-install-recommends", package, timeout=900)
        attempts.append(out)
    if found := shutil.which(command):  # installed now, by us or by another run meanwhile
        return found
    raise Unavailable(f"{command} is not on PATH and `apt-get install -y {package}` did not provide it:\n\n" + "\n\n".join(attempts))
