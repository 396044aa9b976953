"""Test helpers: an independent codec for every version kfan serves, as bytes.

kio (Kafka 4's schemas) for the versions it has; kafka-python's hand-written
structs (:mod:`tests.support.old_protocol`) for those Kafka 4 removed. Tests
that cover every version draw message bodies here and read kfan's output back
here, so that neither side is kfan's own codec.
"""

from __future__ import annotations

from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema

from proxy.kafka import schema
from proxy.kafka.headers import encode_request_header
from tests.support import old_protocol
from tests.support.kio_oracle import kio_decode, kio_encode


def _in_kio(api_key: int, version: int) -> bool:
    versions = schema.kio_versions(api_key)
    return versions is not None and version in versions


def _kio_class(api_key: int, version: int, kind: str) -> type:
    return (load_request_schema if kind == "request" else load_response_schema)(api_key, version)


def _kio_reads(cls: type, body: bytes) -> bool:
    try:
        kio_decode(cls, body)
    except ValueError:  # kio's strategies can draw values its own decoder refuses (e.g. timedelta overflow)
        return False
    return True


def bodies(api_key: int, version: int, kind: str) -> st.SearchStrategy[bytes]:
    """Random message bodies ("request" or "response") of one API version."""
    if not _in_kio(api_key, version):
        return old_protocol.bodies(api_key, version, kind)
    cls = _kio_class(api_key, version, kind)
    return st.from_type(cls).map(kio_encode).filter(lambda b: _kio_reads(cls, b))


def read_back(api_key: int, version: int, kind: str, body: bytes | memoryview, offset: int = 0) -> bytes:
    """The oracle decodes ``body[offset:]`` and encodes it again; raises unless it is one whole message."""
    if not _in_kio(api_key, version):
        return old_protocol.oracle_round_trip(api_key, version, kind, bytes(body)[offset:])
    return kio_encode(kio_decode(_kio_class(api_key, version, kind), body, offset))


def payload(api_key: int, version: int, body: bytes, correlation_id: int = 7, client_id: str | None = "test") -> bytes:
    """A client's request frame payload (no size prefix) carrying ``body``."""
    return encode_request_header(api_key, version, correlation_id, client_id) + body
