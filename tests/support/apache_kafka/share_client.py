"""Kafka's share consumer (``KafkaShareConsumer``, KIP-932) as members of one share group: ``ShareConsume.java``
beside this file, compiled and run as the Java round trip is (:mod:`.java_client`), its output read back into a
:class:`ShareRun`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.apache_kafka.java_client import run_main

SOURCE = Path(__file__).with_name("ShareConsume.java")


@dataclass(frozen=True)
class Delivery:
    member: int
    partition: int
    offset: int
    value: int
    delivery_count: int
    action: str  # ACCEPT, RELEASE or REJECT


@dataclass
class ShareRun:
    deliveries: list[Delivery] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # acknowledgements a commit reported failed
    accepted: int = 0
    log: str = ""

    def by_value(self) -> dict[int, list[Delivery]]:
        out: dict[int, list[Delivery]] = {}
        for d in self.deliveries:
            out.setdefault(d.value, []).append(d)
        return out

    def actions(self) -> Counter[str]:
        return Counter(d.action for d in self.deliveries)


def share_consume(bootstrap: str, topic: str, group: str, *, members: int, accepts: int, timeout_s: int = 90) -> ShareRun:
    """``members`` share consumers in ``group`` acknowledging by ShareConsume.java's rule until ``accepts``
    records were accepted (or ``timeout_s``)."""
    done = run_main(SOURCE, bootstrap, topic, group, str(members), str(accepts), str(timeout_s), timeout_s=timeout_s + 90)
    run = ShareRun(log=done.stderr[-3000:])
    for line in done.stdout.splitlines():
        kind, *fields = line.split(" ")
        if kind == "got":
            member, partition, offset, value, count = (int(f) for f in fields[:5])
            run.deliveries.append(Delivery(member, partition, offset, value, count, fields[5]))
        elif kind == "failed":
            run.failed.append(" ".join(fields))
        elif kind == "done":
            run.accepted = int(fields[0])
    return run
