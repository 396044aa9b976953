"""Test helpers: kio (Kafka's own schemas, independent encoder/decoder) as the oracle."""

from __future__ import annotations

import io
from typing import Any

from hypothesis import strategies as st
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import Records

from proxy.kafka.headers import encode_request_header

# kio ships no strategy for record batches; opaque bytes are all kfan ever sees.
st.register_type_strategy(Records, st.binary(max_size=700).map(Records))


def kio_encode(entity: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def kio_decode(cls: type, data: bytes | memoryview, offset: int = 0) -> Any:
    value, size = entity_reader(cls)(bytes(data), offset)
    assert offset + size == len(data), "trailing bytes after the message"
    return value


def request_payload(entity: Any, correlation_id: int = 7, client_id: str | None = "test") -> bytes:
    """A client's request frame payload (no size prefix) for a kio request entity."""
    head = encode_request_header(type(entity).__api_key__, type(entity).__version__, correlation_id, client_id)
    return head + kio_encode(entity)
