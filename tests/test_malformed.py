"""Invariant 6: malformed input closes that connection only; the process keeps serving."""

from __future__ import annotations

import struct

import pytest
from confluent_kafka.admin import AdminClient
from kio.schema.metadata.v12.request import MetadataRequest

from proxy.tools.mock_cluster import MockCluster
from tests.support.kfan import Kfan, shown_ids
from tests.support.rawclient import CLOSED_WITHIN_S, RawClient

GOOD = MetadataRequest(topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False)  # type: ignore[arg-type]


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


BAD_INPUTS = {
    "size below 8": struct.pack(">i", 3) + b"abc",
    "negative size": struct.pack(">i", -1),
    "size over the limit": struct.pack(">i", 200 * 1024 * 1024),
    "garbage header (unknown api key)": _frame(struct.pack(">hhi", 9999, 0, 1) + b"\x00\x00"),
    "unsupported version": _frame(struct.pack(">hhi", 3, 999, 1) + b"\xff\xff"),
    "random bytes": _frame(bytes(range(7, 64))),
    # Metadata v1 whose topics array claims 2^31-1 entries in a few bytes.
    "array count beyond the bytes": _frame(struct.pack(">hhih", 3, 1, 1, -1) + struct.pack(">i", 0x7FFFFFFF) + b"\x00\x01a"),
    # Flexible Metadata v12: a compact array length of ~2^34.
    "compact count beyond the bytes": _frame(struct.pack(">hhih", 3, 12, 1, -1) + b"\x00" + b"\xff\xff\xff\xff\x7f"),
    "truncated client id": _frame(struct.pack(">hhih", 3, 9, 1, 50) + b"abc"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_malformed_frame_closes_only_that_connection(kfan: Kfan, name: str) -> None:
    with RawClient(kfan.address) as bystander, RawClient(kfan.address) as bad:
        assert bystander.call(GOOD).brokers  # served before
        bad.send_bytes(BAD_INPUTS[name])
        assert bad.closed_by_peer(CLOSED_WITHIN_S), f"{name}: connection left open"
        assert bystander.call(GOOD).brokers  # still served, on its own connection
    assert kfan.alive()


def test_truncated_body_then_eof_does_not_hurt_anyone(kfan: Kfan) -> None:
    with RawClient(kfan.address) as bystander:
        bad = RawClient(kfan.address)
        bad.send_bytes(struct.pack(">i", 1000) + b"\x00\x03\x00\x09")  # 1000 promised, 4 sent
        bad.close()
        assert bystander.call(GOOD).brokers
    assert kfan.alive()


def test_a_real_client_is_served_while_garbage_arrives(kfan: Kfan, cluster: MockCluster) -> None:
    admin = AdminClient({"bootstrap.servers": kfan.bootstrap})
    for payload in BAD_INPUTS.values():
        with RawClient(kfan.address) as bad:
            bad.send_bytes(payload)
            md = admin.list_topics(timeout=10)
            assert sorted(md.brokers) == shown_ids(cluster.brokers)
            bad.closed_by_peer(CLOSED_WITHIN_S)
    assert kfan.alive()
