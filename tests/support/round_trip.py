"""The 10,000-record round trip every client library makes through kfan, and its exactly-once check."""

from __future__ import annotations

from collections import defaultdict

N = 10_000
# The mock coordinator holds a rejoin for session timeout - 1 s even when the
# only member is back (a broker would finish at once); clients that join
# before they know the topic rejoin, so a short session keeps the test short.
SESSION_MS = 6000


def round_trip_records() -> list[tuple[bytes, bytes]]:
    """N (key, value) records: values 0..N-1 in produce order, over 500 keys."""
    return [(f"key-{i % 500}".encode(), f"{i}".encode()) for i in range(N)]


def check_exactly_once_in_order(consumed: list[tuple[int, int, bytes, bytes]]) -> None:
    """consumed: (partition, offset, key, value) in consumption order."""
    values = [int(v) for _, _, _, v in consumed]
    assert len(values) == N, f"got {len(values)} records, wanted {N}"
    assert sorted(values) == list(range(N)), "records lost or duplicated"
    by_partition: dict[int, list[tuple[int, int]]] = defaultdict(list)
    key_partition: dict[bytes, int] = {}
    for partition, offset, key, value in consumed:
        by_partition[partition].append((offset, int(value)))
        assert key_partition.setdefault(key, partition) == partition, "one key, one partition"
    assert len(by_partition) == 6, f"records landed on {sorted(by_partition)}"
    for partition, rows in by_partition.items():
        offsets = [o for o, _ in rows]
        assert offsets == sorted(offsets), f"partition {partition} consumed out of offset order"
        seq = [v for _, v in rows]
        assert seq == sorted(seq), f"partition {partition} lost produce order"
