"""Apache Kafka's jars from Maven Central: one version's broker, tools and reference client, resolved once per machine.

Two lines are used: :data:`KAFKA_4` (the backend of record) and :data:`KAFKA_3`
(the last line that serves the request versions Kafka 4 removed, KIP-896, for
old clients). ``pom.xml`` beside this file names them; Maven copies them and everything
they depend on into ``$KFAN_KAFKA_CACHE/<version>-<pom digest>`` (default
``~/.cache/kfan/apache-kafka``), and a marker file says the copy is whole, so
a later session (or another test run on the machine, waiting on a lock)
finds them there and pays nothing. Maven and Java come with the machine
(Maven from apt when it is missing); without them, or without Maven
Central, :class:`Unavailable` says which command failed and what it
printed: the suite fails, it never falls back to a stand-in.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support import apt

POM = Path(__file__).with_name("pom.xml")
KAFKA_4 = "4.4.0"  # the newest 4.x Maven Central serves that resolves with its dependencies (checked 2026-11-25)
KAFKA_3 = "3.9.2"  # the newest 3.9.x likewise (3.9.1 resolves too)
RESOLVE_TIMEOUT_S = 900.0
# Every JVM the suite starts runs C1 only with the serial collector: its work here is a test's few thousand
# records, where C2's compiler threads and G1's concurrent ones cost more CPU than they save, and CPU is the
# suite's limit on two cores. Measured on a controller and three brokers: 22 s of CPU to start instead of 39,
# and 6.5 s a minute idle instead of 11.
_QUICK_JVM = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
CLIENT_JVM = ["-Xmx256m", *_QUICK_JVM]
BROKER_JVM = ["-Xmx384m", *_QUICK_JVM]


class Unavailable(RuntimeError):
    """Maven could not resolve Apache Kafka (no Maven, no Java, or Maven Central refused)."""


def cache_root() -> Path:
    return Path(os.environ.get("KFAN_KAFKA_CACHE") or Path.home() / ".cache" / "kfan" / "apache-kafka")


def logs_through_reload4j(version: str) -> bool:
    """Whether ``version`` logs through SLF4J 1.7 bound to reload4j (Kafka 3.x, configured as log4j 1 is)
    rather than through the log4j2 binding the pom adds (Kafka 4)."""
    return int(version.split(".")[0]) < 4


def _release(version: str) -> str:
    """``version``'s cache name: its jars are what pom.xml names, so another pom is another set of jars."""
    return f"{version}-{hashlib.sha256(POM.read_bytes()).hexdigest()[:8]}"


def kafka_jars(version: str = KAFKA_4) -> Path:
    """The directory holding every jar of Apache Kafka ``version`` (resolved now if not yet on this machine)."""
    root = cache_root()
    lib = root / _release(version)
    whole = lib / ".complete"
    if whole.exists():
        return lib
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{_release(version)}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run resolving the same version: wait, then use its copy
        if whole.exists():
            return lib
        try:
            mvn = apt.ensure_command("mvn", "maven")  # the machines have it; a bare Debian gets it from apt
        except apt.Unavailable as e:
            raise Unavailable(f"Apache Kafka's jars come from Maven Central through Maven: {e}") from e
        partial = root / f"{_release(version)}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        argv = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(POM),
            f"-Dkafka.version={version}",
            # Kafka 3 brings its own binding (reload4j): the pom's log4j2 one would compete with it.
            f"-Dkafka.logging={'reload4j' if logs_through_reload4j(version) else 'log4j2'}",
            "dependency:copy-dependencies",
            f"-DoutputDirectory={partial}",
        ]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise Unavailable(f"{' '.join(argv)}: {e!r}") from e
        if done.returncode != 0 or not any(partial.glob("kafka_2.13-*.jar")):
            raise Unavailable(f"{' '.join(argv)} (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        shutil.rmtree(lib, ignore_errors=True)
        _archive(version).unlink(missing_ok=True)  # made from the jars it replaces
        partial.rename(lib)
        whole.touch()
    return lib


def classpath(version: str = KAFKA_4) -> str:
    """A ``java -cp`` argument with every jar of ``version``."""
    return str(kafka_jars(version) / "*")


# Class data sharing (AppCDS): the classes a Kafka JVM loads, parsed and verified once, into an archive every later
# JVM of that version maps instead. Measured on kafka-topics --describe: 1.0 s of CPU instead of 1.8, and 0.8 s
# of wall time instead of 1.5-2.0. The first tool run (:func:`dumping_classes`) writes it, on its way out; the
# others, brokers and clients on the same class path included, use it. A JVM that cannot use it (another JDK,
# or jars that changed) runs as without it; CDS logging is off, so that tools' output stays theirs alone.
_QUIET_CDS = "-Xlog:cds*=off"


def _archive(version: str) -> Path:
    return cache_root() / f"{_release(version)}.jsa"


def shared_classes(version: str = KAFKA_4) -> list[str]:
    """JVM flags that map ``version``'s class archive, once there is one."""
    archive = _archive(version)
    return [_QUIET_CDS, f"-XX:SharedArchiveFile={archive}"] if archive.exists() else []


@contextmanager
def dumping_classes(version: str = KAFKA_4) -> Iterator[list[str]]:
    """JVM flags for a JVM that exits within the block: it maps the archive, or writes it when there is none yet."""
    archive = _archive(version)
    if archive.exists():
        yield shared_classes(version)
        return
    partial = archive.with_name(f"{archive.name}.{uuid.uuid4().hex[:8]}.partial")  # several may write at once
    try:
        yield [_QUIET_CDS, f"-XX:ArchiveClassesAtExit={partial}"]
        if partial.exists() and not archive.exists():
            partial.replace(archive)
    finally:
        partial.unlink(missing_ok=True)
