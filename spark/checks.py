"""Replay one captured exchange through a core and report what changed.

Pure functions over one :class:`~proxy.capture.rows.CaptureRow`, so the Spark
job (``spark/replay.py``) can run them on executors. For each exchange:

- every recorded frame decodes with kio (Kafka's schemas, independent of our
  codec; the versions Kafka 4 removed, which kio lacks, by kfan's definitions);
- no frame carries a second size prefix;
- the client's response carries the request's correlation id;
- partition-keyed requests are split again with the recorded topology and
  the sub-requests compared with the recorded ones;
- the recorded broker answers are merged again and compared with the
  recorded client response (payloads ignored when they were scrubbed);
- the merged response lists every requested partition exactly once, in the
  client's order, and names no backend broker;
- every record batch is checked as kfan checks a Produce's: a corrupt one a
  client or a broker sent is a finding of its own (``peer_findings``), never a
  kfan regression.

The core under test is a parameter (:func:`check_exchange`'s ``core``): a
:class:`Core`, whose ``replan`` turns a captured request into the
sub-requests it would send and the merge of their answers. The default,
:data:`DEFAULT_CORE`, is kfan's own (:mod:`proxy.core`), driven by
:func:`_plan_and_merge`, the one function here that calls the core's
planning and merging. The tests inject deliberately broken cores.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.capture.rows import CaptureRow
from proxy.core.layout import Layout, TopicPartition
from proxy.core.plan import Route, Watermarks
from proxy.kafka import schema
from proxy.kafka.frames import frame
from proxy.kafka.headers import decode_request, decode_response, parse_request_header, request_head, response_body_offset
from proxy.kafka.records import check_records
from proxy.kafka.wire import Reader

RecordedAnswers = Mapping[Any, bytes | None]  # broker -> the answer it gave (None: none recorded)


@dataclass(frozen=True)
class Replanned:
    """What a core makes of one captured request."""

    # Destination (a broker id) -> the frame the link would send there: size
    # prefix, request header with correlation id 0, body.
    subrequests: dict[Any, bytes]
    # The brokers' recorded answers -> the client's response body; None when
    # the core answers the request itself.
    merge: Callable[[RecordedAnswers], bytes] | None


@dataclass(frozen=True)
class Core:
    """A core under test, as the checks drive it.

    ``replan(row, watermarks)``: the captured request (``row.request``)
    planned with the recorded topology and kfan identity; ``watermarks`` are
    those the client's connection knew (for a Fetch: what the recorded
    response reported). Instances must pickle (Spark ships them to its
    executors): make ``replan`` a module-level function.
    """

    name: str
    replan: Callable[[CaptureRow, Mapping[TopicPartition, Watermarks]], Replanned]


# --- the core's API: every call the checks make into proxy.core -----------------------------


def _plan_and_merge(row: CaptureRow, watermarks: Mapping[TopicPartition, Watermarks]) -> Replanned:
    """THE ONE PLACE the checks call the core's planning and merging (plan_request,
    the plan's sub-requests, plan.merge and the answers it takes): adapt this
    function, and only it, when that API changes. (Layouts: :func:`layouts`.)"""
    from proxy.core import NOT_YET, Context, Forward, Identity, Response, advertised_versions, plan_request

    ctx = Context(Identity(*row.kfan_identity), row.cluster(), advertised_versions([]), watermarks=watermarks)
    plan = plan_request(ctx, row.request)
    if not isinstance(plan, Forward):
        return Replanned({}, None)
    subrequests = {d: frame([request_head(s.api_key, s.api_version), b"\0\0\0\0", *s.tail]) for d, s in plan.subs.items()}

    def merge(recorded: RecordedAnswers) -> bytes:
        answers: dict[Any, Any] = {d: NOT_YET if a is None else Response(a) for d, a in recorded.items()}
        for d in plan.subs:
            answers.setdefault(d, NOT_YET)
        return b"".join(bytes(p) for p in plan.merge(plan, answers).body)

    return Replanned(subrequests, merge)


def route_of(api_key: int) -> Route[Any] | None:
    """What the core's route table says of an API (None: kfan does not route it)."""
    from proxy.core import ROUTES

    return ROUTES.get(api_key)


def layouts(api_key: int, api_version: int) -> tuple[Layout, Layout] | None:
    """The request's and the response's partition layouts, for an API the core splits by leader (else None)."""
    from proxy.core.leader import layouts_of

    route = route_of(api_key)
    return None if route is None or route.layout is None else layouts_of(route, api_version)


DEFAULT_CORE = Core("proxy.core", _plan_and_merge)


# --- the checks ----------------------------------------------------------------------------


@dataclass
class Finding:
    check: str
    detail: str


@dataclass
class Result:
    api_key: int
    api_version: int
    latency_ms: float
    fanout: int
    findings: list[Finding] = field(default_factory=list)
    # What a client or a broker sent wrong (a corrupt record batch): reported on its own, never a kfan regression.
    peer_findings: list[Finding] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return bool(self.findings)


def _decodes(payload: bytes, api_key: int, api_version: int, response: bool, strict: bool) -> str | None:
    """Does the message decode, by kio's schemas (an implementation other than kfan's)?

    kio lacks the versions Kafka 4 removed; those are read with kfan's
    definitions of them (tests/test_removed_versions.py pins those to
    kafka-python's independent ones).
    """
    from kio.index import load_request_schema, load_response_schema
    from kio.serial import entity_reader

    from proxy.kafka import schema

    try:
        offset = response_body_offset(payload, api_key, api_version) if response else parse_request_header(payload).body_offset
        kio = schema.kio_versions(api_key)
        if kio is not None and api_version < kio.start:
            spec = (schema.response_spec if response else schema.request_spec)(api_key, api_version)
            r = Reader(payload, offset)
            spec.decode(r)
            size = r.pos - offset
        else:
            cls = (load_response_schema if response else load_request_schema)(api_key, api_version)
            _, size = entity_reader(cls)(bytes(payload), offset)
    except Exception as e:  # any failure to decode is the finding
        return f"{type(e).__name__}: {e}"
    if strict and offset + size != len(payload):
        return f"{len(payload) - offset - size} bytes after the message"
    return None


def double_prefix(payload: bytes, api_key: int, api_version: int, response_to: int | None = None) -> bool:
    """A frame payload that starts with its own length and then a whole frame: a size prefix added twice.

    The length alone is not proof (a 10-byte Heartbeat answer to correlation id
    6 starts with 6): what follows must be this request's header, or for a
    response (``response_to``: the correlation id it answers) that id.
    """
    if len(payload) < 8 or struct.unpack_from(">i", payload)[0] != len(payload) - 4:
        return False
    if response_to is not None:
        return struct.unpack_from(">i", payload, 4)[0] == response_to
    return struct.unpack_from(">hh", payload, 4) == (api_key, api_version)


def _cid_of(request: bytes) -> int | None:
    """The correlation id of a request payload (None when it is too short to hold one)."""
    return struct.unpack_from(">i", request, 4)[0] if request and len(request) >= 8 else None


def hexdiff(a: bytes, b: bytes, width: int = 16) -> str:
    """The first differing line of two byte strings, as hex."""
    for i in range(0, max(len(a), len(b)), width):
        x, y = a[i : i + width], b[i : i + width]
        if x != y:
            return f"@{i}: recorded {x.hex(' ')} | replayed {y.hex(' ')} (lengths {len(a)} vs {len(b)})"
    return "equal"


def _without_cid(request: bytes) -> bytes:
    return request[:4] + request[8:]


def _asks(request: bytes, layout: Layout) -> set[tuple[Any, int, int]]:
    """What a sub-request that may have been sent ahead asks (partitions and the offsets to fetch from), order aside."""
    _, req = decode_request(request)
    return {(k, layout.partition_index(p), p["fetch_offset"]) for k, p in layout.entries(req)}


def check_exchange(row: CaptureRow, core: Core = DEFAULT_CORE) -> Result:
    """Every check of one captured exchange, with ``core`` as the core under test."""
    api_key, api_version = row.api_key, row.api_version
    result = Result(api_key, api_version, (row.ts_end - row.ts_start) / 1e6, len(row.subrequests))
    add = result.findings.append
    request, response = row.request, row.response
    if not request:
        add(Finding("capture", "request not stored"))
        return result
    # Frames kfan wrote must be exact; clients' and brokers' may carry trailing
    # bytes (librdkafka's Metadata v13 requests, the mock's Metadata answers).
    # An imported tcpdump (kfan capture import) has no kfan frames.
    client_cid = row.correlation_id
    recorded_frames = [("request", request, False, False, None), ("response", response, True, not row.imported, client_cid)]
    recorded_frames += [(f"sub-request to {b}", q, False, False, None) for b, q, _ in row.subrequests]
    recorded_frames += [(f"sub-response from {b}", a, True, False, _cid_of(q)) for b, q, a in row.subrequests]
    for name, payload, is_response, strict, response_to in recorded_frames:
        if payload is None:
            continue
        if double_prefix(payload, api_key, api_version, response_to):
            add(Finding("one size prefix", f"{name} starts with its own length"))
            continue
        if (err := _decodes(payload, api_key, api_version, is_response, strict)) is not None:
            add(Finding("decodes", f"{name}: {err}"))
    if result.findings:
        return result
    hdr = parse_request_header(request)
    if response is not None and struct.unpack_from(">i", response)[0] != hdr.correlation_id:
        add(Finding("correlation id", f"response has {struct.unpack_from('>i', response)[0]}, request {hdr.correlation_id}"))
    route = route_of(api_key)
    found = layouts(api_key, api_version)
    if route is None or found is None or response is None:
        return result
    req_layout, resp_layout = found
    if not row.records_scrubbed:
        _check_batches(result, row, route, req_layout, resp_layout)
    # The watermarks kfan reported: for a partition whose broker had not answered,
    # they came from the connection's memory, which the capture does not hold.
    watermarks = _reported_watermarks(response, api_key, api_version, resp_layout) if route.watermarks else {}
    replanned = core.replan(row, watermarks)
    replayed: dict[Any, bytes] = {}
    for b, wire in replanned.subrequests.items():
        payload = wire[4:]
        if double_prefix(payload, api_key, api_version):
            add(Finding("one size prefix", f"replayed sub-request to {b} starts with its own length"))
            return result
        replayed[b] = _without_cid(payload)
    recorded = {b: _without_cid(q) for b, q, _ in row.subrequests}
    if route.sent_ahead:
        # A sub-request may be one sent for an earlier request of the same partitions
        # and offsets (in another order), reused: compare what they ask.
        def asks(subs: dict[Any, bytes]) -> dict[Any, set[tuple[Any, int, int]]]:
            return {b: _asks(q[:4] + b"\0\0\0\0" + q[4:], req_layout) for b, q in subs.items()}

        same = asks(recorded) == asks(replayed)
    else:
        same = recorded == replayed
    if not same:
        broker = next((b for b in set(recorded) | set(replayed) if recorded.get(b) != replayed.get(b)), None)
        add(Finding("split", f"broker {broker}: " + hexdiff(recorded.get(broker, b""), replayed.get(broker, b""))))
        return result
    if replanned.merge is None:
        return result
    recorded_body = response[response_body_offset(response, api_key, api_version) :]
    merged = replanned.merge({b: a for b, _, a in row.subrequests})
    if merged != recorded_body and not row.records_scrubbed:
        add(Finding("merge", hexdiff(recorded_body, merged)))
    _check_partitions(result, row, req_layout, resp_layout)
    return result


def _reported_watermarks(response: bytes, api_key: int, api_version: int, layout: Layout) -> dict[TopicPartition, Watermarks]:
    body = decode_response(response, api_key, api_version)
    return {
        (t[layout.topic_key], p["partition_index"]): (
            p.get("high_watermark", -1),
            p.get("last_stable_offset", -1),
            p.get("log_start_offset", -1),
        )
        for t in body[layout.topics]
        for p in t[layout.partitions]
    }


def _check_partitions(result: Result, row: CaptureRow, req_layout: Layout, resp_layout: Layout) -> None:
    assert row.response is not None
    _, req = decode_request(row.request)
    resp = decode_response(row.response, row.api_key, row.api_version)
    if req_layout.keys(req) != resp_layout.keys(resp):
        result.findings.append(
            Finding("every partition once, in order", f"asked {req_layout.keys(req)[:6]}..., answered {resp_layout.keys(resp)[:6]}...")
        )
    # Backend brokers other than the one answering as kfan (itself, in an imported tcpdump).
    leaders = set(row.cluster().brokers) - {row.kfan_identity[0]}
    for _, p in resp_layout.entries(resp):
        if isinstance(p, dict):
            cl = p.get("current_leader")
            if cl and cl.get("leader_id", -1) in leaders and cl.get("leader_id") != -1:
                result.findings.append(Finding("no broker identity", f"current_leader names broker {cl['leader_id']}"))
                return


def _check_batches(result: Result, row: CaptureRow, route: Route[Any], req_layout: Layout, resp_layout: Layout) -> None:
    """Every record batch of the exchange checked as kfan checks a Produce's: the client's
    (in a request: Produce), and each broker's (in answers, whose last batch may be cut short: Fetch)."""
    api_key, api_version = row.api_key, row.api_version
    if route.records == "request":
        request = schema.decode_body(schema.request_spec(api_key, api_version), row.request, parse_request_header(row.request).body_offset)
        for topic, partition in req_layout.entries(request):
            if (bad := check_records(partition["records"])) is not None:
                index = req_layout.partition_index(partition)
                result.peer_findings.append(Finding("corrupt batch from client", f"{topic}-{index}: {bad.reason}"))
    elif route.records == "response":
        answers = [(f"broker {b}", a) for b, _, a in row.subrequests if a is not None]
        if row.imported and row.response is not None:
            answers.append(("the broker", row.response))  # a tcpdump of direct traffic: the response is the broker's own
        for who, answer in answers:
            body = decode_response(answer, api_key, api_version)
            for topic, partition in resp_layout.entries(body):
                if (bad := check_records(partition["records"], partial_tail=True)) is not None:
                    index = partition["partition_index"]
                    result.peer_findings.append(Finding("corrupt batch from broker", f"{who}: {topic}-{index}: {bad.reason}"))
