"""kcat for the tests: find it (or install it with apt) and drive it.

kcat is the command-line Kafka client most people reach for; Debian's 1.7.1
links librdkafka 2.0.2, an older protocol stack than the Python clients of
the suite. :func:`ensure_kcat` returns its path: the one on PATH, or else the
one ``apt-get install -y kcat`` installs (``apt-get update`` is run first only
when that install fails). When neither works it raises
:class:`KcatUnavailable` with every attempt's output, for the caller to fail
on: a missing kcat must never silently skip a test.

:class:`Kcat` runs it: metadata (``-L -J``), produce (``-P -K``), consume
(``-C -e``) and balanced-group consume (``-G -e``), parsing what it prints.
Every run has a timeout; a run that fails or times out raises
:class:`KcatFailed` (an AssertionError, so a test reports it as a failure)
carrying the end of kcat's stderr.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.support.apt import Unavailable, ensure_command

# One consumed record: partition, offset, key, value.
Row = tuple[int, int, bytes, bytes]

# -f format: tab-separated fields, one record per line (keys/values must not contain tabs or newlines).
_FORMAT = r"%p\t%o\t%k\t%s\n"
_EOF = re.compile(r"Reached end of topic (\S+) \[(\d+)\] at offset (-?\d+)")
_ASSIGNED = re.compile(r"rebalanced \(memberid [^)]*\): assigned: (.*)")
_PARTITION = re.compile(r"(\S+) \[(\d+)\]")
# librdkafka's `-d msg` line for every partition of every Fetch answer it handles.
_FETCHED = re.compile(r'Topic (\S+) \[(\d+)\] MessageSet size (\d+), error "([^"]*)", MaxOffset (-?\d+), LSO (-?\d+)')


class KcatUnavailable(RuntimeError):
    """kcat is not on PATH and apt could not install it."""


class KcatFailed(AssertionError):
    """A kcat run exited non-zero or did not finish in time."""


def ensure_kcat() -> str:
    """The path of a working kcat: on PATH, or installed now with apt. Raises KcatUnavailable."""
    try:
        return ensure_command("kcat", "kcat")
    except Unavailable as e:
        raise KcatUnavailable(str(e)) from None


@dataclass
class Consumed:
    """What one consuming kcat run printed."""

    rows: list[Row] = field(repr=False)
    stderr: str = field(repr=False)
    seconds: float
    # partition -> offset of every "Reached end of topic" kcat reported.
    eof: dict[int, int] = field(default_factory=dict)
    # Partitions of the topic assigned to this member (balanced-group mode only).
    assigned: set[int] = field(default_factory=set)

    def fetched(self, topic: str) -> list[tuple[int, int, str, int, int]]:
        """(partition, message set size, error, high watermark, LSO) of every Fetch answer
        partition librdkafka handled (needs ``-d msg``)."""
        return [(int(p), int(size), err, int(hw), int(lso)) for t, p, size, err, hw, lso in _FETCHED.findall(self.stderr) if t == topic]


@dataclass(frozen=True)
class Kcat:
    path: str

    def run(self, *args: str, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
        cmd = [self.path, *args]
        try:
            done = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            err = (e.stderr or b"").decode(errors="replace")
            raise KcatFailed(f"{' '.join(cmd)} did not finish in {timeout:.0f} s; stderr ends:\n{err[-4000:]}") from None
        if done.returncode != 0:
            raise KcatFailed(f"{' '.join(cmd)} exited {done.returncode}; stderr ends:\n{done.stderr.decode(errors='replace')[-4000:]}")
        return done

    def metadata(self, bootstrap: str, topic: str, *extra: str) -> dict[str, Any]:
        """``kcat -L -J -t topic``: the Metadata answer as kcat's JSON."""
        return json.loads(self.run("-b", bootstrap, "-L", "-J", "-t", topic, *extra, timeout=30).stdout)

    def produce(self, bootstrap: str, topic: str, records: Iterable[tuple[bytes, bytes]], *extra: str, timeout: float = 60) -> None:
        """``kcat -P -K:``: one keyed record per input line; kcat exits once all are delivered."""
        lines = []
        for key, value in records:
            assert b":" not in key and not any(c in key + value for c in b"\t\n"), (key, value)
            lines.append(key + b":" + value + b"\n")
        self.run("-b", bootstrap, "-P", "-t", topic, "-K", ":", *extra, stdin=b"".join(lines), timeout=timeout)

    def consume(self, bootstrap: str, topic: str, *extra: str, timeout: float = 60) -> Consumed:
        """``kcat -C -o beginning -e``: every partition from its start until kcat reaches its end."""
        return self._consume(bootstrap, topic, ["-C", "-t", topic, "-o", "beginning", *extra], timeout)

    def group_consume(self, bootstrap: str, group: str, topic: str, *extra: str, session_ms: int = 6000, timeout: float = 90) -> Consumed:
        """``kcat -G group topic -e``: one balanced-group member reading from the earliest offsets until
        every assigned partition is at its end; with auto-commit on (the default) it commits as it leaves."""
        settings = {"session.timeout.ms": session_ms, "heartbeat.interval.ms": 500, "auto.offset.reset": "earliest"}
        options = [a for k, v in settings.items() for a in ("-X", f"{k}={v}")]
        # In -G mode the topics are the trailing arguments.
        return self._consume(bootstrap, topic, ["-G", group, *options, *extra, topic], timeout)

    def _consume(self, bootstrap: str, topic: str, args: list[str], timeout: float) -> Consumed:
        # -f and -e go before the mode's own arguments (in -G mode those end with the topic).
        started = time.monotonic()
        done = self.run("-b", bootstrap, "-e", "-f", _FORMAT, *args, timeout=timeout)
        seconds = time.monotonic() - started
        rows: list[Row] = []
        for line in done.stdout.split(b"\n"):
            if line:
                p, o, k, v = line.split(b"\t")
                rows.append((int(p), int(o), k, v))
        stderr = done.stderr.decode(errors="replace")
        eof = {int(p): int(o) for t, p, o in _EOF.findall(stderr) if t == topic}
        assigned: set[int] = set()
        for m in _ASSIGNED.finditer(stderr):
            assigned |= {int(p) for t, p in _PARTITION.findall(m.group(1)) if t == topic}
        return Consumed(rows, stderr, seconds, eof, assigned)
