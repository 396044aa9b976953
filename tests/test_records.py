"""Produced record batches checked before any broker sees them (proxy/kafka/records.py).

The batches under test are built by kafka-python's own record builders
(magic 2 batches and magic 0/1 message sets), not by kfan's code: every
valid one passes, and a flipped bit anywhere a broker's checks cover is
caught. Then end to end: one request, two partitions on two brokers, one of
them corrupt.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from proxy.kafka import errors
from proxy.kafka import records as kafka_records
from proxy.kafka.records import Invalid, check_records
from proxy.tools.mock_cluster import MockCluster
from tests.support.kfan import Kfan, start_kfan
from tests.support.metrics import http_get, metrics_port_in, parse_samples
from tests.support.rawclient import RawClient
from tests.support.records import legacy_set, produce_request, record_batch

# Bytes of a magic-2 batch header that no checksum or framing rule covers, in Kafka as here:
# baseOffset (0-7) and partitionLeaderEpoch (12-15), which the broker assigns itself.
UNCHECKED = set(range(0, 8)) | set(range(12, 16))

records_st = st.lists(
    st.tuples(st.binary(max_size=40) | st.none(), st.binary(max_size=200) | st.none(), st.integers(0, 2**40)), min_size=1, max_size=20
)


def v2_batch(
    records: list[tuple[bytes | None, bytes | None, int]], compression: int, producer: tuple[int, int, int] = (-1, -1, -1)
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=producer[0],
        producer_epoch=producer[1],
        base_sequence=producer[2],
        batch_size=1 << 22,
    )
    for offset, (key, value, timestamp) in enumerate(records):
        builder.append(offset, timestamp=timestamp, key=key, value=value, headers=[])
    return bytes(builder.build())


@settings(max_examples=150, suppress_health_check=list(HealthCheck), deadline=None)
@given(records=records_st, compression=st.sampled_from([0, 1]), batches=st.integers(1, 3), data=st.data())
def test_valid_batches_pass_and_any_checked_bit_flipped_is_caught(
    records: list[tuple[bytes | None, bytes | None, int]], compression: int, batches: int, data: st.DataObject
) -> None:
    batch = v2_batch(records, compression)
    assert check_records(batch) is None
    assert check_records(batch * batches) is None, "several batches in one partition's records"
    bit = data.draw(st.integers(0, len(batch) * 8 - 1).filter(lambda b: b // 8 not in UNCHECKED), label="bit")
    flipped = bytearray(batch)
    flipped[bit // 8] ^= 1 << (bit % 8)
    found = check_records(bytes(flipped))
    assert isinstance(found, Invalid), f"bit {bit} (byte {bit // 8}) flipped and not caught"
    assert found.code in (errors.CORRUPT_MESSAGE, errors.INVALID_RECORD)


@settings(max_examples=50, suppress_health_check=list(HealthCheck), deadline=None)
@given(values=st.lists(st.binary(max_size=300), min_size=1, max_size=30), timestamp=st.integers(0, 2**41))
def test_the_batches_kfans_tools_build_are_read_by_kafka_python(values: list[bytes], timestamp: int) -> None:
    batch = kafka_records.record_batch(values, timestamp)
    assert check_records(batch) is None
    read = DefaultRecordBatch(batch)
    assert read.validate_crc() and read.producer_id == -1 and read.compression_type == 0
    got = list(read)
    assert [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in got] == [(i, None, v, timestamp, []) for i, v in enumerate(values)]


def _message_offsets(message_set: bytes) -> set[int]:
    """The bytes of each message's offset: the broker's to assign, covered by no checksum."""
    out, at = set(), 0
    while at < len(message_set):
        out |= set(range(at, at + 8))
        at += 12 + int.from_bytes(message_set[at + 8 : at + 12], "big")
    return out


@settings(max_examples=100, suppress_health_check=list(HealthCheck), deadline=None)
@given(records=records_st, magic=st.sampled_from([0, 1]), compression=st.sampled_from([0, 1]), data=st.data())
def test_valid_message_sets_pass_and_any_checked_bit_flipped_is_caught(
    records: list[tuple[bytes | None, bytes | None, int]], magic: int, compression: int, data: st.DataObject
) -> None:
    message_set = legacy_set(records, magic, compression)
    assert check_records(message_set) is None
    unchecked = _message_offsets(message_set)
    bit = data.draw(st.integers(0, len(message_set) * 8 - 1).filter(lambda b: b // 8 not in unchecked), label="bit")
    flipped = bytearray(message_set)
    flipped[bit // 8] ^= 1 << (bit % 8)
    assert isinstance(check_records(bytes(flipped)), Invalid), f"bit {bit} (byte {bit // 8}) flipped and not caught"


def _recrc(batch: bytes, last_offset_delta: int) -> bytes:
    """A batch with another last offset delta and a CRC that matches again: only the framing is wrong."""
    import crc32c

    body = bytearray(batch)
    body[23:27] = last_offset_delta.to_bytes(4, "big")
    body[17:21] = crc32c.crc32c(bytes(body[21:])).to_bytes(4, "big")
    return bytes(body)


@pytest.mark.parametrize(
    ("mangle", "code", "reason"),
    [
        (lambda b: b[:-1], errors.INVALID_RECORD, "length"),  # the declared length runs past the bytes present
        (lambda b: b + b"\x00" * 7, errors.INVALID_RECORD, "length"),  # trailing bytes that are no batch
        (lambda b: b[:16] + b"\x07" + b[17:], errors.INVALID_RECORD, "magic"),
        (lambda b: b[:20] + bytes([b[20] ^ 0x01]) + b[21:], errors.CORRUPT_MESSAGE, "crc"),
        (lambda b: _recrc(b[:57] + (1000).to_bytes(4, "big") + b[61:], last_offset_delta=999), errors.INVALID_RECORD, "count"),
        (lambda b: _recrc(b, last_offset_delta=3), errors.INVALID_RECORD, "offset_delta"),
    ],
)
def test_each_kind_of_damage_has_the_code_a_broker_answers(mangle: object, code: int, reason: str) -> None:
    found = check_records(mangle(record_batch(b"value")))  # type: ignore[operator]
    assert found == Invalid(code, reason)


def _produce(kfan: Kfan, topic: str, records: dict[int, bytes]) -> dict[int, int]:
    request = produce_request(topic, list(records), acks=-1)
    partitions = tuple(dataclasses.replace(p, records=records[p.index]) for p in request.topic_data[0].partition_data)
    request = dataclasses.replace(request, topic_data=(dataclasses.replace(request.topic_data[0], partition_data=partitions),))
    with RawClient(kfan.address) as client:
        answer = client.call(request)
    return {p.index: p.error_code for t in answer.responses for p in t.partition_responses}


def _held(cluster: MockCluster, topic: str, partition: int) -> list[bytes]:
    """The values a broker holds for the partition, read from the broker directly."""
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"check-{uuid.uuid4()}", "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, partition, 0)])
    values: list[bytes] = []
    try:
        while True:
            m = consumer.poll(10)
            assert m is not None, "the broker did not answer"
            if m.error():
                break  # end of partition
            values.append(m.value())
    finally:
        consumer.close()
    return values


def test_a_corrupt_batch_is_refused_and_its_neighbour_written(cluster: MockCluster) -> None:
    """Two partitions led by two brokers in one Produce: the corrupt one is answered by kfan, the other written."""
    topic = f"records-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 2, leaders=[1, 2])
    good, bad = record_batch(b"good"), bytearray(record_batch(b"bad"))
    bad[-3] ^= 0x10  # in the record's value: the CRC no longer matches
    kfan = start_kfan(cluster.bootstrap, "--metrics-listen", "127.0.0.1:0")
    try:
        _refused_by_kfan(cluster, kfan, topic, good, bytes(bad))
    finally:
        assert kfan.alive()
        assert kfan.stop() == 0


def _refused_by_kfan(cluster: MockCluster, kfan: Kfan, topic: str, good: bytes, bad: bytes) -> None:
    before = _invalid_batches(kfan)
    assert _produce(kfan, topic, {0: good, 1: bad}) == {0: errors.NONE, 1: errors.CORRUPT_MESSAGE}
    assert _held(cluster, topic, 0) == [b"good"]
    assert _held(cluster, topic, 1) == [], "the corrupt batch never reached its broker"

    longer = bytearray(record_batch(b"longer"))
    longer[8:12] = (int.from_bytes(longer[8:12], "big") + 100).to_bytes(4, "big")  # declares more than is there
    assert _produce(kfan, topic, {0: good, 1: bytes(longer)}) == {0: errors.NONE, 1: errors.INVALID_RECORD}
    assert _held(cluster, topic, 1) == []
    assert kfan.alive()
    assert any("refused produced records that no broker would take" in line and f"{topic}-1 (crc)" in line for line in kfan.log)
    after = _invalid_batches(kfan)
    assert after.get("crc", 0) - before.get("crc", 0) == 1 and after.get("length", 0) - before.get("length", 0) == 1


def _invalid_batches(kfan: Kfan) -> dict[str, float]:
    _, text = http_get(f"http://127.0.0.1:{metrics_port_in(kfan.log)}/metrics")
    return {labels.split('"')[1]: v for labels, v in parse_samples(text).get("kfan_invalid_batches_total", [])}


@settings(max_examples=50, suppress_health_check=list(HealthCheck), deadline=None)
@given(
    records=records_st,
    compression=st.sampled_from([0, 1]),
    producer=st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**15 - 1), st.integers(0, 2**31 - 1)),
)
def test_the_producer_is_read_from_the_first_batch(
    records: list[tuple[bytes | None, bytes | None, int]], compression: int, producer: tuple[int, int, int]
) -> None:
    batch = v2_batch(records, compression, producer)
    assert kafka_records.producer(batch) == producer
    assert kafka_records.producer(batch + v2_batch(records, 0)) == producer, "one producer's batches per partition: the first says"
    assert kafka_records.producer(v2_batch(records, compression)) == kafka_records.NO_PRODUCER
    assert kafka_records.producer(batch[:60]) == kafka_records.NO_PRODUCER, "shorter than a batch header"
    assert kafka_records.producer(None) == kafka_records.NO_PRODUCER
    built = kafka_records.record_batch([b"v"], of_producer=producer)
    read = DefaultRecordBatch(built)
    assert read.validate_crc() and (read.producer_id, read.producer_epoch, read.base_sequence) == producer
    assert kafka_records.producer(built) == producer


def test_a_message_set_has_no_producer() -> None:
    for magic in (0, 1):
        assert kafka_records.producer(legacy_set([(None, b"x" * 80, 0)], magic)) == kafka_records.NO_PRODUCER
