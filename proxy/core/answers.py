"""What every policy does the same way: build sub-requests from the client's
bytes, and read the brokers' answers back (decoded, failed, or not yet in).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..kafka import skim
from ..kafka.headers import RequestHeader, response_body_offset
from ..kafka.schema import Struct, StructSpec, decode_body, encode_body, request_spec, response_spec
from ..kafka.wire import Malformed, Parts, Reader
from . import undecodable
from .plan import Answers, BrokerUnavailable, Destination, Failed, NotYet, Response, SubRequest


def whole(hdr: RequestHeader, payload: memoryview, expect_response: bool = True) -> SubRequest:
    """The client's own bytes; only the correlation id will change."""
    return SubRequest(hdr.api_key, hdr.api_version, [payload[8:]], expect_response)


def reencoded(hdr: RequestHeader, payload: memoryview, request: Struct, expect_response: bool = True) -> SubRequest:
    """The client's header with a body of our making."""
    tail: Parts = [payload[8 : hdr.body_offset]]
    tail.extend(encode_body(request_spec(hdr.api_key, hdr.api_version), request))
    return SubRequest(hdr.api_key, hdr.api_version, tail, expect_response)


def decode_answer(hdr: RequestHeader, payload: memoryview | bytes) -> Struct:
    spec = response_spec(hdr.api_key, hdr.api_version)
    return decode_body(spec, payload, response_body_offset(payload, hdr.api_key, hdr.api_version), allow_trailing=True)


def split_answer(hdr: RequestHeader, payload: memoryview | bytes, array: str, key: str) -> Struct:
    """An answer decoded but for ``array``, whose entries stay bytes (:class:`skim.Entry`) to be moved as they are."""
    spec = response_spec(hdr.api_key, hdr.api_version)
    return skim.split(spec, Reader(payload, response_body_offset(payload, hdr.api_key, hdr.api_version)), array, key)


def passthrough_body(hdr: RequestHeader, payload: memoryview | bytes) -> Parts:
    """A broker's response body as it sent it (only the header is ours)."""
    return [memoryview(payload)[response_body_offset(payload, hdr.api_key, hdr.api_version) :]]


@dataclass(slots=True)
class Decoded:
    """The brokers' answers sorted: decoded bodies, failure codes, and those not in yet."""

    bodies: dict[Destination, Struct] = field(default_factory=dict)
    failed: dict[Destination, int] = field(default_factory=dict)
    waiting: set[Destination] = field(default_factory=set)
    names_brokers: bool = False  # a body named a broker (before its identity was hidden)


def decode_answers(
    hdr: RequestHeader, answers: Answers, failure_code: int, decode: Callable[[RequestHeader, memoryview | bytes], Struct] = decode_answer
) -> Decoded:
    """Each broker's answer decoded (by ``decode``), or its failure code.

    An answer that does not decode is that broker's failure (``failure_code``),
    not the request's: the other brokers' parts are answered as usual.
    """
    out = Decoded()
    for destination, answer in answers.items():
        if isinstance(answer, Response):
            try:
                out.bodies[destination] = decode(hdr, answer.payload)
            except Malformed as e:
                undecodable.note(answer.payload, e)
                out.failed[destination] = failure_code
        elif isinstance(answer, Failed):
            out.failed[destination] = answer.code
        else:
            assert isinstance(answer, NotYet)
            out.waiting.add(destination)
    return out


def error_codes(value: Any) -> list[int]:
    """Every error code anywhere in a decoded message, in the order they appear."""
    out: list[int] = []
    _error_codes_into(value, out)
    return out


def _error_codes_into(value: Any, out: list[int]) -> None:
    # One list for the whole walk, and exact type checks: this runs over every
    # entry of batched answers (16,000 groups make 100,000 structs).
    if type(value) is dict:
        for k, v in value.items():
            kind = type(v)
            # Unknown tagged fields sit under int keys (schema.TAGS): not error codes.
            if kind is int:
                if type(k) is str and k.endswith("error_code"):
                    out.append(v)
            elif kind is dict or kind is list:
                _error_codes_into(v, out)
    elif type(value) is list:
        for v in value:
            kind = type(v)
            if kind is dict or kind is list:
                _error_codes_into(v, out)


def error_body(hdr: RequestHeader, code: int) -> Parts:
    """A response carrying ``code`` at top level, for APIs that have one."""
    spec = response_spec(hdr.api_key, hdr.api_version)
    if not spec.has("error_code"):
        raise BrokerUnavailable(f"api_key {hdr.api_key} has no top-level error code to report {code}")
    body = spec.blank()
    body["error_code"] = code
    return encode_body(spec, body)


def mirrored_error_body(hdr: RequestHeader, request: Struct, code: int) -> Parts:
    """A response naming what the request named, every error code ``code``: for APIs whose errors are per entry.

    Arrays of structs and single values the response shares by name with the request (OffsetCommit's
    ``topics``, ``name``, ``partitions``, ``partition_index``) are copied; everything else is blank. Raises
    :class:`BrokerUnavailable` when no error code would carry ``code`` (nothing named, or nothing to name it in).
    """
    spec = response_spec(hdr.api_key, hdr.api_version)
    body = mirrored_entry(spec, request, code)
    if code not in error_codes(body):
        raise BrokerUnavailable(f"api_key {hdr.api_key} has no error code in which to report {code}")
    return encode_body(spec, body)


def mirrored_entry(spec: StructSpec, request: Struct, code: int) -> Struct:
    out = spec.blank()
    for f in spec.fields:
        if f.struct is None and not f.array and f.name.endswith("error_code"):
            out[f.name] = code
        elif f.name not in request:
            continue
        elif f.array and f.struct is not None and isinstance(entries := request[f.name], list):
            out[f.name] = [mirrored_entry(f.struct, e, code) for e in entries if isinstance(e, dict)]
        elif f.struct is None and not f.array and not isinstance(request[f.name], (dict, list)):
            out[f.name] = request[f.name]
    return out


def fold_top_level(bodies: Iterable[Struct], error: int = 0) -> tuple[int, int]:
    """The merged throttle (the longest) and top-level error (the first) of several answers."""
    throttle = 0
    for d in bodies:
        throttle = max(throttle, d.get("throttle_time", 0))
        error = error or d.get("error_code", 0)
    return throttle, error
