"""Fuzz target (a): what a client sends, through the frame reader and the planner.

Each case is a byte stream of one to three frames — mostly mutated valid
requests, sometimes reshaped ones (valid, but with entries duplicated or
dropped, extreme integers, unknown names), valid ones, random bytes, or a
size prefix that lies —
fed to :class:`proxy.kafka.frames.FrameReader` in random chunks, each frame it
yields planned by :func:`proxy.core.plan_request` against a realistic
context (three brokers, topics with ids, a leaderless partition, one led by a
broker that is down, a coordinator cache that knows some groups; every API
version kfan implements advertised), planned again once its coordinators were
looked up when the plan asks for that, as the connection does.

Contract: the only exceptions are :class:`proxy.kafka.wire.Malformed`,
:class:`proxy.core.Unsupported` and :class:`proxy.core.ClosesConnection` (an
acks=0 Produce the ACLs refuse: one request in two is judged by ACLs, as with
``--authorizer acls``; the connection closes). On those, the
connection logs what :func:`proxy.kafka.headers.peek_request` finds, which must not
raise either. A plan's reply joins into bytes, its fetch keys hash, every
sub-request it would send frames into a request a broker can parse, and once
its coordinators were looked up it asks for none again.
"""

from __future__ import annotations

import random
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from proxy.core import ClosesConnection, FetchForward, Forward, LocalReply, NeedCoordinators, Plan, Unsupported
from proxy.kafka import schema
from proxy.kafka.frames import DEFAULT_MAX_FRAME_BYTES, FrameReader, frame
from proxy.kafka.headers import parse_request_header, peek_request, request_head
from proxy.kafka.wire import Malformed
from proxy.server.prelogin import PreLoginLimits

from .harness import HANG_SECONDS, Broken, Tally, api_label, check
from .mutate import mutate, reshape_request, valid_requests
from .mutate import plan as plan_like_connection

ALLOWED: tuple[type[BaseException], ...] = (Malformed, Unsupported, ClosesConnection)
READER = "frame_reader"
PLANNER = "plan_request"


def plan_frame(payload: bytes, judged: bool | None = None) -> Plan:
    """What a client connection does with one frame; raises only what the contract allows (else a finding).

    ``judged``: by ACLs first, as with ``--authorizer acls`` (None: one frame in two, by its bytes)."""
    if judged is None:
        judged = zlib.crc32(payload) % 2 == 1
    try:
        plan = plan_like_connection(payload, judged=judged)
    except ALLOWED:
        peek_request(payload)  # the connection logs api key, version and correlation id
        raise
    check_plan(plan)
    return plan


def check_plan(plan: Plan) -> None:
    """The plan's outputs are usable: a reply joins into bytes, sub-requests frame into requests a broker parses."""
    if isinstance(plan, NeedCoordinators):
        raise Broken(f"still asks for coordinators once they were looked up: {plan.coordinators!r}")
    if isinstance(plan, LocalReply):
        b"".join(bytes(p) for p in plan.body)
        return
    if not isinstance(plan, Forward):
        raise Broken(f"not a plan: {plan!r}")
    if not isinstance(plan.broker_wait_ms, int):
        raise Broken(f"broker_wait_ms {plan.broker_wait_ms!r} is not an int")
    if isinstance(plan, FetchForward):
        for target, key in plan.keys.items():
            try:
                hash(key)  # the connection keys its fetch-ahead table by it
            except TypeError as e:
                raise Broken(f"fetch key for {target!r} is not hashable: {e}") from e
    for target, sub in plan.subs.items():
        wire = frame([request_head(sub.api_key, sub.api_version), struct.pack(">i", 77), *sub.tail])
        payload = wire[4:]
        try:
            hdr = parse_request_header(payload)
            schema.decode_body(schema.request_spec(sub.api_key, sub.api_version), payload, hdr.body_offset, allow_trailing=True)
        except Malformed as e:
            raise Broken(f"sub-request for {target!r} does not parse: {e}") from e
        if (hdr.api_key, hdr.api_version, hdr.correlation_id) != (plan.header.api_key, plan.header.api_version, 77):
            raise Broken(f"sub-request for {target!r} has header {hdr}")


# Before login a client's frames are capped much lower (Kafka's sasl.server.max.receive.size):
# every fourth case is read so, and sizes around that cap and a 20 MB SCRAM user name's are among the lies.
PRELOGIN_CAP = PreLoginLimits().max_receive_bytes
# Size prefixes that lie.
_BAD_SIZES = (-1, -0x80000000, 0, 3, 7, 0x7FFFFFFF, 100 * 1024 * 1024 + 1, PRELOGIN_CAP, PRELOGIN_CAP + 1, 20 * 1024 * 1024)


@dataclass(frozen=True, slots=True)
class ClientCase:
    stream: bytes
    chunks: tuple[int, ...]  # feed sizes; their sum is len(stream)
    payloads: tuple[bytes, ...]  # the frames as meant (before any size lie)


def make_case(rng: random.Random, corpus: list[bytes]) -> ClientCase:
    payloads = []
    stream = bytearray()
    for _ in range(rng.choice((1, 1, 1, 1, 2, 3))):
        roll = rng.random()
        base = rng.choice(corpus)
        if roll < 0.72:
            payload = mutate(base, rng)
        elif roll < 0.84:  # valid but odd: duplicated or dropped entries, extreme values, unknown names
            payload = reshape_request(base, rng)
            if rng.random() < 0.3:
                payload = mutate(payload, rng)
        elif roll < 0.90:
            payload = base
        elif roll < 0.95:
            payload = rng.randbytes(rng.randint(0, 64))
        else:  # a real header, a random body
            payload = base[:8] + rng.randbytes(rng.randint(0, 40))
        payloads.append(payload)
        size = len(payload)
        if rng.random() < 0.08:
            size = rng.choice((*_BAD_SIZES, size - 1, size + 1, size + rng.randint(2, 300), rng.getrandbits(32) - (1 << 31)))
        stream += struct.pack(">i", size) + payload
    chunks: list[int] = []
    left = len(stream)
    whole = rng.random() < 0.5
    while left:
        n = left if whole else min(left, rng.choice((1, 2, 3, 4, 5, 7, 64, 1000)))
        chunks.append(n)
        left -= n
    return ClientCase(bytes(stream), tuple(chunks), tuple(payloads))


def run_case(case: ClientCase, tally: Tally, index: int, hang_seconds: float = HANG_SECONDS) -> None:
    """Feed the stream as a connection would: frames out of the reader as they complete, each planned."""
    reader = FrameReader(PRELOGIN_CAP if index % 4 == 0 else DEFAULT_MAX_FRAME_BYTES)
    tally.count(READER)
    pos = 0
    for i, n in enumerate(case.chunks):
        # Every other chunk is received in place when the reader offers a frame's buffer, as the connection does.
        buffer = None
        if i % 2:
            ok, buffer = check(
                tally, READER, index, lambda: {"stream": case.stream.hex(), "chunks": ",".join(map(str, case.chunks))}, (),
                lambda: _offered_buffer(reader), hang_seconds=hang_seconds, label=lambda: "FrameReader",
            )  # fmt: skip
            if not ok:
                return
        if buffer is not None:
            n = min(n, len(buffer))
            buffer[:n] = case.stream[pos : pos + n]
            reader.received(n)
        else:
            reader.feed(case.stream[pos : pos + n])
        pos += n
        while True:
            ok, payload = check(
                tally,
                READER,
                index,
                lambda: {"stream": case.stream.hex(), "chunks": ",".join(map(str, case.chunks))},
                (Malformed,),
                reader.next_frame,
                hang_seconds=hang_seconds,
                label=lambda: "FrameReader",
            )
            if not ok:
                return  # the connection closes
            if payload is None:
                break
            fuzz_plan(tally, PLANNER, index, payload, hang_seconds)


def _offered_buffer(reader: FrameReader) -> memoryview | None:
    """The buffer the reader offers for the frame begun; never one past its cap (a size prefix must not allocate that)."""
    buffer = reader.receive_buffer(1, 1 << 30)
    if buffer is not None and len(buffer) > 4 + reader.max_frame_bytes:
        raise Broken(f"a {len(buffer)}-byte buffer offered past the cap of {reader.max_frame_bytes}")
    return buffer


def fuzz_plan(tally: Tally, target: str, index: int, request: bytes, hang_seconds: float, input_bytes: int = 0) -> tuple[bool, Any]:
    """Plan one request frame as the connection does, counted and checked under ``target``."""
    tally.count(target)
    return check(
        tally,
        target,
        index,
        lambda: {"request": request.hex()},
        ALLOWED,
        lambda: plan_frame(request),
        hang_seconds=hang_seconds,
        input_bytes=input_bytes,
        label=lambda: api_label(request),
    )


def case_rng(seed: int | str, index: int) -> random.Random:
    return random.Random(f"client {seed} {index}")


def campaign(seed: int | str, indexes: range, tally: Tally, hang_seconds: float = HANG_SECONDS, deadline: float | None = None) -> None:
    """Run the cases ``indexes`` of the campaign ``seed`` (each case reproducible on its own)."""
    import time

    corpus = valid_requests()
    for i in indexes:
        if deadline is not None and time.monotonic() > deadline:
            return
        run_case(make_case(case_rng(seed, i), corpus), tally, i, hang_seconds=hang_seconds)


def replay(request_hex: str) -> Plan:
    """Plan one request (hex of a frame payload, no size prefix) under the contract; raises what it raises."""
    return plan_frame(bytes.fromhex(request_hex))
