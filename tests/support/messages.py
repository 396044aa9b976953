"""Kafka messages for tests, built with kfan's own codec from plain dicts.

For requests and answers a test needs byte-exact (a reproducer, a scripted
broker's answer); where an independent encoder matters, tests use kio's
entities instead (tests/support/kio_oracle.py).
"""

from __future__ import annotations

import struct
from typing import Any

from proxy.kafka import schema
from proxy.kafka.headers import request_header_tail, response_header


def request_bytes(api_key: int, version: int, body: dict[str, Any], correlation_id: int = 7, client_id: str = "c") -> bytes:
    """A request payload (no size prefix); fields not given take the schema's blanks."""
    spec = schema.request_spec(api_key, version)
    head = struct.pack(">hhi", api_key, version, correlation_id) + request_header_tail(api_key, version, client_id)
    return head + b"".join(schema.encode_body(spec, {**spec.blank(), **body}))


def answer_bytes(api_key: int, version: int, body: dict[str, Any], correlation_id: int = 0) -> bytes:
    """A response payload (no size prefix); fields not given take the schema's blanks."""
    spec = schema.response_spec(api_key, version)
    return response_header(api_key, version, correlation_id) + b"".join(schema.encode_body(spec, {**spec.blank(), **body}))
