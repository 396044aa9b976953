"""The reference Java client (``kafka-clients``) as a round trip of the suite: ``RoundTrip.java`` beside this file.

Compiled once per machine with ``javac`` against the Kafka jars (the classes
are kept beside the jars, under the source's hash), run with ``java``, and
its output read back into a :class:`tests.support.round_trip.Trip`, so the
same checks apply to it as to the Python clients and kcat.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.apache_kafka.distribution import CLIENT_JVM, KAFKA_4, cache_root, classpath, shared_classes
from tests.support.round_trip import Records, Trip

SOURCE = Path(__file__).with_name("RoundTrip.java")
RUN_TIMEOUT_S = 240.0


def compiled(version: str, source: Path = SOURCE) -> Path:
    """The directory of ``source``'s classes, compiled against Kafka ``version`` (now, if this source was not yet)."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    out = cache_root() / f"{source.stem}-{version}-{digest}"
    if (out / f"{source.stem}.class").exists():
        return out
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / "java-sources.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / f"{source.stem}.class").exists():
            partial = out.with_name(out.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            javac = shutil.which("javac") or "javac"
            done = subprocess.run([javac, "-cp", classpath(version), "-d", str(partial), str(source)], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"javac {source.name} failed (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
            partial.rename(out)
    return out


def run_main(source: Path, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run the main class of ``source`` (a Java file beside this one) with ``args``, on Kafka 4's jars; fails
    with its output unless it exits 0."""
    java = shutil.which("java") or "java"
    cp = f"{classpath(KAFKA_4)}:{compiled(KAFKA_4, source)}"
    argv = [java, *CLIENT_JVM, *shared_classes(KAFKA_4), "-cp", cp, source.stem, *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{source.stem} failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return done


def java_round_trip(
    bootstrap: str, topic: str, group: str, records: Records, *, protocol: str = "classic", aborted: int = 0, version: str = KAFKA_4
) -> JavaTrip:
    """The Java client's round trip of ``len(records)`` records (its own: key-<i % 500>, value <i>; the
    records given only set the count), consumed read_committed by a member of ``group`` using ``protocol``;
    ``aborted``: that many more records written in an aborted transaction after a committed one."""
    java = shutil.which("java") or "java"
    argv = [
        java,
        *CLIENT_JVM,
        *shared_classes(version),  # its class path extends the archive's: allowed
        "-cp",
        f"{classpath(version)}:{compiled(version)}",
        "RoundTrip",
        bootstrap,
        topic,
        group,
        str(len(records)),
        protocol,
        str(aborted),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"the Java round trip failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    consumed, extra, brokers, assigned = [], [], [], set()
    committed: dict[int, int | None] = {}
    partitions = 0
    for line in done.stdout.splitlines():
        kind, *fields = line.split(" ")
        if kind in ("record", "extra"):
            row = (int(fields[0]), int(fields[1]), fields[2].encode(), fields[3].encode())
            (consumed if kind == "record" else extra).append(row)
        elif kind == "broker":
            brokers.append((int(fields[0]), fields[1], int(fields[2])))
        elif kind == "partitions":
            partitions = int(fields[0])
        elif kind == "assigned":
            assigned.add(int(fields[0]))
        elif kind == "committed":
            committed[int(fields[0])] = int(fields[1])
    trip = JavaTrip(consumed, sorted(brokers), set(range(partitions)), assigned, extra, committed=committed, log=done.stderr[-3000:])
    for line in done.stdout.splitlines():
        kind, *fields = line.split(" ")
        if kind == "admin-committed":
            trip.group_offsets[int(fields[0])] = int(fields[1])
        elif kind == "admin-end":
            trip.end_offsets[int(fields[0])] = int(fields[1])
        elif kind == "admin-group":
            trip.group_state, trip.group_members, trip.group_type = fields[0], int(fields[1]), fields[2]
    return trip


@dataclass
class JavaTrip(Trip):
    """A round trip, and what the Java admin client said afterwards of the group and the topic."""

    group_offsets: dict[int, int] = field(default_factory=dict)  # listConsumerGroupOffsets
    end_offsets: dict[int, int] = field(default_factory=dict)  # listOffsets(latest)
    group_state: str = ""  # describeConsumerGroups: state, members, type (CLASSIC or CONSUMER)
    group_members: int = -1
    group_type: str = ""
