"""What checking produced record batches costs: CPU milliseconds per MB of records.

``python -m tests.bench.bench_records`` builds batches with kafka-python's
record builder (uncompressed; records of 100 B, 1 KiB and 16 KiB; one batch
per partition and sixteen) and times :func:`proxy.kafka.records.check_records`
on them with the process's CPU clock. The issue's target: under 0.2 ms per MB.
A benchmark prints figures; no test asserts a time.
"""

from __future__ import annotations

import time

from kafka.record.default_records import DefaultRecordBatchBuilder

from proxy.kafka.records import check_records

TARGET_MS_PER_MB = 0.2


def batch(records: int, size: int) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 24
    )
    for i in range(records):
        builder.append(i, timestamp=1, key=b"k%d" % i, value=b"v" * size, headers=[])
    return bytes(builder.build())


def ms_per_mb(data: bytes, seconds: float = 0.5) -> float:
    reps, started = 0, time.process_time()
    while time.process_time() - started < seconds:
        check_records(data)
        reps += 1
    return (time.process_time() - started) / reps * 1e3 / (len(data) / 1e6)


def main() -> None:
    print(f"{'record':>8} {'batches':>8} {'MB':>6} {'ms/MB':>7}")
    worst = 0.0
    for size, count in ((100, 9600), (1024, 1024), (16384, 64)):
        for batches in (1, 16):
            data = batch(count // batches, size) * batches
            cost = ms_per_mb(data)
            worst = max(worst, cost)
            print(f"{size:>7}B {batches:>8} {len(data) / 1e6:>6.2f} {cost:>7.3f}")
    print(f"worst {worst:.3f} ms of CPU per MB; target under {TARGET_MS_PER_MB} ms: {'met' if worst < TARGET_MS_PER_MB else 'NOT met'}")


if __name__ == "__main__":
    main()
