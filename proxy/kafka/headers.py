"""Request and response headers.

Request header v0: api_key, api_version, correlation_id; v1 adds client_id (a
nullable legacy string, even in flexible versions); v2 adds tagged fields.
Response header v0: correlation_id; v1 adds tagged fields. The header version
follows from whether the API version is flexible, with one exception:
ApiVersions responses always use response header v0 (a client must be able to
read them before it knows what the broker speaks).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from . import schema
from .apis import API_VERSIONS
from .wire import Malformed, Reader, Writer

_CID = struct.Struct(">i")
_KEY_VERSION = struct.Struct(">hh")
_HEAD_V0 = struct.Struct(">hhi")


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int  # where the message body starts in the frame
    known: bool  # kio has a schema for this api_key/api_version


def parse_request_header(payload: bytes | memoryview) -> RequestHeader:
    """Parse a request header; unknown APIs/versions parse as far as v1."""
    r = Reader(payload)
    api_key, api_version, correlation_id = _HEAD_V0.unpack_from(r.buf, r.skip(8))
    versions = schema.known_versions(api_key)
    known = versions is not None and api_version in versions
    client_id = r.string()
    if known and schema.is_flexible(api_key, api_version) and not r.empty_tags():
        n = r.uvarint()
        if n > r.remaining():
            raise Malformed("request header tagged fields cannot fit")
        for _ in range(n):
            r.uvarint()
            r.raw(r.uvarint())
    return RequestHeader(api_key, api_version, correlation_id, client_id, r.pos, known)


def request_header_tail(api_key: int, api_version: int, client_id: str | None) -> bytes:
    """The request header after the correlation id: client_id, then tags if flexible."""
    w = Writer()
    w.string(client_id)
    if schema.is_flexible(api_key, api_version):
        w.uvarint(0)
    return b"".join(w.finish())


def encode_request_header(api_key: int, api_version: int, correlation_id: int, client_id: str | None) -> bytes:
    return _KEY_VERSION.pack(api_key, api_version) + _CID.pack(correlation_id) + request_header_tail(api_key, api_version, client_id)


def peek_request(payload: bytes | memoryview) -> tuple[int, int, int]:
    """api_key, api_version and correlation_id: what even a bad header has."""
    if len(payload) < 8:
        raise Malformed("request shorter than a v0 header")
    key, version = _KEY_VERSION.unpack_from(payload, 0)
    return key, version, _CID.unpack_from(payload, 4)[0]


def response_header_flexible(api_key: int, api_version: int) -> bool:
    return api_key != API_VERSIONS and schema.is_flexible(api_key, api_version)


def response_header(api_key: int, api_version: int, correlation_id: int) -> bytes:
    cid = _CID.pack(correlation_id)
    return cid + b"\x00" if response_header_flexible(api_key, api_version) else cid


def response_body_offset(payload: bytes | memoryview, api_key: int, api_version: int) -> int:
    """Offset of the body in a broker's response payload."""
    flexible = response_header_flexible(api_key, api_version)
    # The usual cases, without a reader: a header without tagged fields, or with none present.
    if not flexible and len(payload) >= 4:
        return 4
    if flexible and len(payload) >= 5 and payload[4] == 0:
        return 5
    r = Reader(payload)
    r.int32()
    if flexible:
        n = r.uvarint()
        for _ in range(n):
            r.uvarint()
            r.raw(r.uvarint())
    return r.pos


def decode_request(payload: bytes | memoryview) -> tuple[RequestHeader, schema.Struct]:
    """A whole request frame payload: its header and decoded body (trailing bytes allowed, as Kafka does)."""
    hdr = parse_request_header(payload)
    return hdr, schema.decode_body(schema.request_spec(hdr.api_key, hdr.api_version), payload, hdr.body_offset, allow_trailing=True)


def decode_response(payload: bytes | memoryview, api_key: int, api_version: int) -> schema.Struct:
    """A whole response frame payload's decoded body (trailing bytes allowed, as Kafka does)."""
    spec = schema.response_spec(api_key, api_version)
    return schema.decode_body(spec, payload, response_body_offset(payload, api_key, api_version), allow_trailing=True)


def correlation_id_of(payload: bytes | memoryview) -> int:
    if len(payload) < 4:
        raise Malformed("response shorter than its correlation id")
    return _CID.unpack_from(payload, 0)[0]


def request_head(api_key: int, api_version: int) -> bytes:
    """A request header's first 4 bytes, before the correlation id: api_key, api_version."""
    return _KEY_VERSION.pack(api_key, api_version)
