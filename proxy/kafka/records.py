"""Record batches checked without being decoded: what a broker checks first
(and built, for kfan's tools: :func:`record_batch`).

A Produce partition's ``records`` are one or more record batches (magic 2:
CRC-32C over attributes to the end) or, before Produce v3, message sets of
magic 0 and 1 messages (CRC-32 over magic to the end). :func:`check_records`
walks them over the bytes present, never copying, and says what is wrong:
a framing error (a length past the bytes present, a count the records do not
fill, an unknown magic) is INVALID_RECORD, a checksum that does not match is
CORRUPT_MESSAGE, as a broker answers them.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from crc32c import crc32c

from . import errors

# Record batch (magic 2) header: baseOffset 8, batchLength 4, partitionLeaderEpoch 4,
# magic 1, crc 4, attributes 2, lastOffsetDelta 4, baseTimestamp 8, maxTimestamp 8,
# producerId 8, producerEpoch 2, baseSequence 4, records count 4.
_BATCH_HEAD = 61
_LENGTH = struct.Struct(">i")
_CRC = struct.Struct(">I")
_MAGIC_AT = 16
_CRC_AT = 17
_ATTRIBUTES_AT = 21
_LAST_OFFSET_DELTA_AT = 23
_COUNT_AT = 57
_COMPRESSION = 0x07
# The smallest record: length, attributes, timestamp delta, offset delta, key length,
# value length and header count, one byte each. Walking every record's varints would
# cost more than the CRC itself (0.5 ms per MB of 1 KiB records in Python); the CRC
# already vouches for the bytes, this for the count.
_RECORD_MIN = 7
# Message (magic 0, 1): offset 8, size 4, then (size bytes) crc 4, magic 1, attributes 1,
# [timestamp 8, magic 1 only], key length 4 and key, value length 4 and value.
_MESSAGE_HEAD = 12
_MESSAGE_MIN = {0: 14, 1: 22}  # the smallest size: empty key and value


@dataclass(frozen=True, slots=True)
class Invalid:
    """Why a partition's records are refused, and the error code a broker would answer."""

    code: int
    reason: str  # a short label: crc, length, magic, count, offset_delta


_TRANSACTIONAL = 0x10


def first_batch_transactional(data: bytes | memoryview | None) -> bool:
    """Whether the first record batch of ``data`` is transactional (Kafka's ``hasTransactionalRecords`` reads only
    the first batch of each partition); message sets (magic 0, 1) never are."""
    if data is None or len(data) < _BATCH_HEAD or data[_MAGIC_AT] < 2:
        return False
    (attributes,) = struct.unpack_from(">h", data, _ATTRIBUTES_AT)
    return bool(attributes & _TRANSACTIONAL)


_PRODUCER = struct.Struct(">qhi")  # producerId, producerEpoch, baseSequence
_PRODUCER_AT = 43
NO_PRODUCER = (-1, -1, -1)


def producer(data: bytes | memoryview | None) -> tuple[int, int, int]:
    """The producer id, epoch and base sequence of the first record batch of ``data`` (a Produce partition's
    batches are one producer's), :data:`NO_PRODUCER` when it has none: no idempotent or transactional
    producer, or a message set (magic 0, 1)."""
    if data is None or len(data) < _BATCH_HEAD or data[_MAGIC_AT] < 2:
        return NO_PRODUCER
    found: tuple[int, int, int] = _PRODUCER.unpack_from(data, _PRODUCER_AT)
    return found


def check_records(data: bytes | memoryview | None, *, partial_tail: bool = False) -> Invalid | None:
    """None when every batch or message in ``data`` is whole and its checksum matches.

    ``partial_tail``: ``data`` is a Fetch answer's, whose last batch a broker may cut short
    at the request's byte budget; a cut batch at the end is not a fault there.
    """
    if data is None or len(data) == 0:
        return None  # nothing to check; the broker answers an empty produce as it sees fit
    view = memoryview(data)
    at = 0
    end = len(view)
    while at < end:
        if end - at < _MESSAGE_HEAD + 5:
            return None if partial_tail else Invalid(errors.INVALID_RECORD, "length")
        (size,) = _LENGTH.unpack_from(view, at + 8)
        if size < 5:  # 5: up to and with the magic byte
            return Invalid(errors.INVALID_RECORD, "length")
        if at + _MESSAGE_HEAD + size > end:
            return None if partial_tail else Invalid(errors.INVALID_RECORD, "length")
        entry = view[at : at + _MESSAGE_HEAD + size]
        magic = entry[_MAGIC_AT]
        if magic == 2:
            problem = _check_batch(entry)
        elif magic in (0, 1):
            problem = _check_message(entry, magic)
        else:
            problem = Invalid(errors.INVALID_RECORD, "magic")
        if problem is not None:
            return problem
        at += _MESSAGE_HEAD + size
    return None


def _check_batch(batch: memoryview) -> Invalid | None:
    if len(batch) < _BATCH_HEAD:
        return Invalid(errors.INVALID_RECORD, "length")
    (crc,) = _CRC.unpack_from(batch, _CRC_AT)
    if crc32c(batch[_ATTRIBUTES_AT:]) != crc:
        return Invalid(errors.CORRUPT_MESSAGE, "crc")
    (count,) = _LENGTH.unpack_from(batch, _COUNT_AT)
    (last_offset_delta,) = _LENGTH.unpack_from(batch, _LAST_OFFSET_DELTA_AT)
    if count < 0:
        return Invalid(errors.INVALID_RECORD, "count")
    if count and last_offset_delta != count - 1:
        return Invalid(errors.INVALID_RECORD, "offset_delta")
    (attributes,) = struct.unpack_from(">h", batch, _ATTRIBUTES_AT)
    if attributes & _COMPRESSION == 0 and count * _RECORD_MIN > len(batch) - _BATCH_HEAD:
        return Invalid(errors.INVALID_RECORD, "count")  # more records declared than the bytes could hold
    return None


def _check_message(message: memoryview, magic: int) -> Invalid | None:
    if len(message) - _MESSAGE_HEAD < _MESSAGE_MIN[magic]:
        return Invalid(errors.INVALID_RECORD, "length")
    (crc,) = _CRC.unpack_from(message, _MESSAGE_HEAD)
    if zlib.crc32(message[_MESSAGE_HEAD + 4 :]) != crc:
        return Invalid(errors.CORRUPT_MESSAGE, "crc")
    return None


_BATCH_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. records count


def _varint(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)  # zigzag
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def record_batch(values: list[bytes], timestamp_ms: int = 0, *, of_producer: tuple[int, int, int] = NO_PRODUCER) -> bytes:
    """One record batch (magic 2, uncompressed) of keyless records, CRC-32C as brokers check it.

    ``of_producer``: its producer id, epoch and base sequence (an idempotent producer's); none by default."""
    records = bytearray()
    for delta, value in enumerate(values):
        body = b"\x00" + _varint(0) + _varint(delta) + _varint(-1) + _varint(len(value)) + value + _varint(0)
        records += _varint(len(body)) + body
    n = len(values)
    after_crc = _BATCH_AFTER_CRC.pack(0, n - 1, timestamp_ms, timestamp_ms, *of_producer, n) + records
    # batchLength counts from partitionLeaderEpoch (4) through magic (1) and crc (4) to the end.
    head = struct.pack(">qii", 0, 4 + 1 + 4 + len(after_crc), -1) + b"\x02"
    return head + _CRC.pack(crc32c(after_crc)) + after_crc
