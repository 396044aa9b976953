"""The schema-driven codec against kio, for every API and version kio knows."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema

from proxy.kafka import schema
from proxy.kafka.wire import Malformed, Reader
from tests.support.kio_oracle import kio_encode

ALL = [(k, v) for k in sorted(schema.API_NAMES) if (vr := schema.kio_versions(k)) for v in vr]


@pytest.mark.parametrize("api_key", sorted({k for k, _ in ALL}))
@settings(max_examples=10, suppress_health_check=list(HealthCheck), deadline=None)
@given(data=st.data())
def test_decode_then_encode_is_byte_exact(api_key: int, data: st.DataObject) -> None:
    versions = schema.kio_versions(api_key)
    assert versions is not None
    version = data.draw(st.sampled_from(list(versions)))
    for load, spec_of in ((load_request_schema, schema.request_spec), (load_response_schema, schema.response_spec)):
        cls = load(api_key, version)
        entity = data.draw(st.from_type(cls))
        wire = kio_encode(entity)
        decoded = schema.decode_body(spec_of(api_key, version), wire)
        again = b"".join(bytes(p) for p in schema.encode_body(spec_of(api_key, version), decoded))
        assert again == wire


def test_records_are_views_of_the_input_not_copies() -> None:
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

    batch = bytes(range(256)) * 4
    req = ProduceRequest(
        acks=1,
        timeout=datetime.timedelta(seconds=1),
        topic_data=(TopicProduceData(name="t", partition_data=(PartitionProduceData(index=0, records=batch),)),),
    )  # type: ignore[arg-type]
    wire = kio_encode(req)
    decoded = schema.decode_body(schema.request_spec(0, 9), wire)
    records = decoded["topic_data"][0]["partition_data"][0]["records"]
    assert isinstance(records, memoryview) and records.obj is not None and bytes(records) == batch


def test_huge_array_count_is_rejected_before_allocation() -> None:
    # Metadata v1 request: topics array claiming 2^31-1 entries in 4 bytes.
    with pytest.raises(Malformed, match="cannot fit"):
        schema.decode_body(schema.request_spec(3, 1), b"\x7f\xff\xff\xff")
    # Flexible: a compact array length of ~2^35 as a varint.
    with pytest.raises(Malformed):
        schema.decode_body(schema.request_spec(3, 12), b"\xff\xff\xff\xff\x7f" + b"\x00" * 3)


def test_truncated_and_trailing_input_is_malformed() -> None:
    from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

    wire = kio_encode(
        MetadataRequest(
            topics=(MetadataRequestTopic(topic_id=None, name="abc"),),
            allow_auto_topic_creation=True,
            include_topic_authorized_operations=False,
        )
    )  # type: ignore[arg-type]
    for cut in range(len(wire)):
        with pytest.raises(Malformed):
            schema.decode_body(schema.request_spec(3, 12), wire[:cut])
    with pytest.raises(Malformed, match="trailing"):
        schema.decode_body(schema.request_spec(3, 12), wire + b"\x00")


def test_varint_longer_than_ten_bytes_is_malformed() -> None:
    with pytest.raises(Malformed):
        Reader(b"\x80" * 11 + b"\x01").uvarint()


def test_null_in_non_nullable_string_is_malformed() -> None:
    # Metadata v1 request: one topic whose (non-nullable) name is null.
    with pytest.raises(Malformed, match="non-nullable"):
        schema.decode_body(schema.request_spec(3, 1), b"\x00\x00\x00\x01\xff\xff")
