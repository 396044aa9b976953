"""A response's ``throttle_time_ms``: which clients throttle themselves (KIP-219), and setting it in an encoded answer.

Since KIP-219 a broker over a client's quota answers at once with the
throttle time and stops reading that connection for as long; a client of a
version that knows this waits too. An older version does not wait on its own,
so the broker holds the answer back for the throttle time instead. Which
versions know is Kafka's own table (each response's ``shouldClientThrottle``);
an API not in it is answered late, as Kafka does.

Pure: bytes in, bytes out.
"""

from __future__ import annotations

from ..kafka import apis
from ..kafka.schema import decode_body, encode_body, response_spec
from ..kafka.wire import Malformed, Parts

# The first version of each API whose clients throttle themselves (Kafka's shouldClientThrottle).
_CLIENT_THROTTLES_FROM: dict[int, int] = {
    apis.PRODUCE: 6,
    apis.FETCH: 8,
    apis.LIST_OFFSETS: 3,
    apis.METADATA: 6,
    apis.OFFSET_COMMIT: 4,
    apis.OFFSET_FETCH: 4,
    apis.FIND_COORDINATOR: 2,
    apis.JOIN_GROUP: 3,
    apis.HEARTBEAT: 2,
    apis.LEAVE_GROUP: 2,
    apis.SYNC_GROUP: 2,
    apis.DESCRIBE_GROUPS: 2,
    apis.LIST_GROUPS: 2,
    apis.API_VERSIONS: 2,
    apis.CREATE_TOPICS: 3,
    apis.DELETE_TOPICS: 2,
    apis.DELETE_RECORDS: 1,
    apis.INIT_PRODUCER_ID: 1,
    apis.ADD_PARTITIONS_TO_TXN: 1,
    apis.ADD_OFFSETS_TO_TXN: 1,
    apis.END_TXN: 1,
    apis.TXN_OFFSET_COMMIT: 1,
    apis.DESCRIBE_ACLS: 1,
    apis.CREATE_ACLS: 1,
    apis.DELETE_ACLS: 1,
    apis.DESCRIBE_CONFIGS: 2,
    apis.ALTER_CONFIGS: 1,
    apis.DESCRIBE_LOG_DIRS: 1,
    apis.CREATE_PARTITIONS: 1,
    apis.CREATE_DELEGATION_TOKEN: 1,
    apis.RENEW_DELEGATION_TOKEN: 1,
    apis.EXPIRE_DELEGATION_TOKEN: 1,
    apis.DESCRIBE_DELEGATION_TOKEN: 1,
    apis.DELETE_GROUPS: 1,
    apis.ELECT_LEADERS: 0,
    apis.INCREMENTAL_ALTER_CONFIGS: 0,
    apis.ALTER_PARTITION_REASSIGNMENTS: 0,
    apis.LIST_PARTITION_REASSIGNMENTS: 0,
    apis.OFFSET_DELETE: 0,
    apis.DESCRIBE_USER_SCRAM_CREDENTIALS: 0,
    apis.ALTER_USER_SCRAM_CREDENTIALS: 0,
    apis.DESCRIBE_TOPIC_PARTITIONS: 0,
}
_ALTER_REPLICA_LOG_DIRS = 34
_CLIENT_THROTTLES_FROM[_ALTER_REPLICA_LOG_DIRS] = 1

# Where the field sits when it is not the body's first: after fixed fields (an offset), or after an array (decode).
_AT_OFFSET = {apis.OFFSET_DELETE: 2}  # after error_code
_DECODED = frozenset({apis.PRODUCE, apis.API_VERSIONS, *range(apis.CREATE_DELEGATION_TOKEN, apis.DESCRIBE_DELEGATION_TOKEN + 1)})
FIELD = "throttle_time"  # kio's name of throttle_time_ms


def client_throttles(api_key: int, version: int) -> bool:
    """The client waits out a throttle time it is told (else the answer itself must wait)."""
    first = _CLIENT_THROTTLES_FROM.get(api_key)
    return first is not None and version >= first


def has_throttle_field(api_key: int, version: int) -> bool:
    try:
        return response_spec(api_key, version).has(FIELD)
    except KeyError:
        return False


def with_throttle(api_key: int, version: int, body: Parts, throttle_ms: int) -> Parts:
    """``body`` (an encoded response body, no header) saying at least ``throttle_ms``; as it was without the field."""
    if throttle_ms <= 0 or not has_throttle_field(api_key, version):
        return body
    if api_key in _DECODED:
        spec = response_spec(api_key, version)
        try:
            decoded = decode_body(spec, b"".join(body))
        except Malformed:
            return body  # a broker's answer kfan cannot read goes as it came (its own throttle, if any)
        if decoded[FIELD] >= throttle_ms:
            return body
        decoded[FIELD] = throttle_ms
        return list(encode_body(spec, decoded))
    at = _AT_OFFSET.get(api_key, 0)
    head = _prefix(body, at + 4)
    if len(head) < at + 4:
        return body  # too short to hold it: not an answer of this version (left as the brokers gave it)
    if int.from_bytes(head[at:], "big", signed=True) >= throttle_ms:
        return body
    return [head[:at] + throttle_ms.to_bytes(4, "big", signed=True), *_without_prefix(body, at + 4)]


def _prefix(body: Parts, n: int) -> bytes:
    """The first ``n`` bytes of ``body`` (fewer when it is shorter), copying no more than those."""
    out = bytearray()
    for p in body:
        out += p[: n - len(out)]
        if len(out) >= n:
            break
    return bytes(out)


def _without_prefix(body: Parts, n: int) -> Parts:
    """``body`` less its first ``n`` bytes; large parts are sliced, not copied."""
    out: Parts = []
    for p in body:
        if n >= len(p):
            n -= len(p)
            continue
        out.append(memoryview(p)[n:] if n else p)
        n = 0
    return out
