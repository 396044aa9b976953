"""Kafka records and Produce requests built by hand, byte for byte, for tests that send raw frames."""

from __future__ import annotations

import datetime

from kio.schema.produce.v8.request import PartitionProduceData, ProduceRequest, TopicProduceData

from proxy.kafka import records


def record_batch(value: bytes) -> bytes:
    """One record batch (magic 2) holding one record, CRC32C as Kafka requires."""
    return records.record_batch([value])


def legacy_set(records: list[tuple[bytes | None, bytes | None, int]], magic: int, compression: int = 0) -> bytes:
    """A message set (magic 0 or 1) of (key, value, timestamp) records, built by kafka-python."""
    from kafka.record.legacy_records import LegacyRecordBatchBuilder

    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=compression, batch_size=1 << 22)
    for offset, (key, value, timestamp) in enumerate(records):
        builder.append(offset, timestamp=timestamp if magic else None, key=key, value=value)
    return bytes(builder.build())


def produce_request(topic: str, partitions: list[int], acks: int) -> ProduceRequest:
    """A Produce v8 request: one record (value ``p<partition>``) for each partition given, in that order."""
    return ProduceRequest(
        transactional_id=None,
        acks=acks,  # type: ignore[arg-type]
        timeout=datetime.timedelta(seconds=5),
        topic_data=(
            TopicProduceData(
                name=topic, partition_data=tuple(PartitionProduceData(index=p, records=record_batch(f"p{p}".encode())) for p in partitions)
            ),
        ),  # type: ignore[arg-type]
    )
