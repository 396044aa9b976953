"""Replay one captured exchange through the current core and report what changed.

Pure functions over one capture row (see :mod:`proxy.capture`), so the Spark
job (``spark/replay.py``) can run them on executors. For each exchange:

- every recorded frame decodes with kio (Kafka's schemas, independent of our codec);
- no frame carries a second size prefix;
- the client's response carries the request's correlation id;
- partition-keyed requests are split again with the recorded topology and
  the sub-requests compared with the recorded ones;
- the recorded broker answers are merged again and compared with the
  recorded client response (payloads ignored when they were scrubbed);
- the merged response lists every requested partition exactly once, in the
  client's order, and names no backend broker.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from backends.topology import Topology

from . import routing
from .core import ANY, NO_ANSWER_YET, Context, Identity, Marks, layouts, plan_request, request_head
from .kafka import apis, frames, schema
from .kafka.headers import parse_request_header, response_body_offset

# A deliberately broken core, for the tests of the replay job only:
# "drop-partition", "double-prefix" or "swap-responses".
BREAK = os.environ.get("KFAN_REPLAY_BREAK", "")

ALL_VERSIONS = {k: (r.start, r.stop - 1) for k in routing.ROUTES if (r := schema.known_versions(k)) is not None}


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

    @property
    def regressed(self) -> bool:
        return bool(self.findings)


def _kio_decodes(payload: bytes, api_key: int, api_version: int, response: bool, strict: bool) -> str | None:
    from kio.index import load_request_schema, load_response_schema
    from kio.serial import entity_reader

    try:
        if response:
            cls = load_response_schema(api_key, api_version)
            offset = response_body_offset(payload, api_key, api_version)
        else:
            cls = load_request_schema(api_key, api_version)
            offset = parse_request_header(payload).body_offset
        _, size = entity_reader(cls)(bytes(payload), offset)
    except Exception as e:  # any failure to decode is the finding
        return f"{type(e).__name__}: {e}"
    if strict and offset + size != len(payload):
        return f"{len(payload) - offset - size} bytes after the message"
    return None


def _double_prefix(payload: bytes, api_key: int, api_version: int, response_to: int | None = None) -> bool:
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


def _fetch_asks(payload: bytes, api_version: int) -> set[tuple[Any, int, int]]:
    hdr = parse_request_header(payload)
    req = schema.decode_body(schema.request_spec(1, api_version), payload, hdr.body_offset, allow_trailing=True)
    layout, _ = layouts(1, api_version)
    return {(k, layout.partition_index(p), p["fetch_offset"]) for k, p in layout.entries(req)}


def check_exchange(row: Mapping[str, Any]) -> Result:
    api_key, api_version = int(row["api_key"]), int(row["api_version"])
    subs_recorded = list(row.get("subrequests") or [])
    result = Result(api_key, api_version, (row["ts_end"] - row["ts_start"]) / 1e6, len(subs_recorded))
    add = result.findings.append
    request: bytes = row["request"]
    response: bytes | None = row["response"]
    scrubbed = bool(row.get("records_scrubbed"))
    if not request:
        add(Finding("capture", "request not stored"))
        return result
    topo_doc = json.loads(row["topology"])
    # Frames kfan wrote must be exact; clients' and brokers' may carry trailing
    # bytes (librdkafka's Metadata v13 requests, the mock's Metadata answers).
    # An imported tcpdump (proxy.pcap) has no kfan frames.
    by_kfan = topo_doc.get("source") != "pcap"
    client_cid = int(row["correlation_id"])
    recorded_frames = [("request", request, False, False, None), ("response", response, True, by_kfan, client_cid)]
    recorded_frames += [(f"sub-request to {s['broker']}", s["request"], False, False, None) for s in subs_recorded]
    recorded_frames += [(f"sub-response from {s['broker']}", s["response"], True, False, _cid_of(s["request"])) for s in subs_recorded]
    for name, payload, is_response, strict, response_to in recorded_frames:
        if payload is None:
            continue
        if _double_prefix(payload, api_key, api_version, response_to):
            add(Finding("one size prefix", f"{name} starts with its own length"))
            continue
        if (err := _kio_decodes(payload, api_key, api_version, is_response, strict)) is not None:
            add(Finding("kio decodes", f"{name}: {err}"))
    if result.findings:
        return result
    hdr = parse_request_header(request)
    if response is not None and struct.unpack_from(">i", response)[0] != hdr.correlation_id:
        add(Finding("correlation id", f"response has {struct.unpack_from('>i', response)[0]}, request {hdr.correlation_id}"))
    kfan = topo_doc.get("kfan", {"node_id": 0, "host": "", "port": 0})
    identity = Identity(kfan["node_id"], kfan["host"], kfan["port"])
    topology = Topology.from_json(row["topology"])
    if routing.ROUTES.get(api_key) is not routing.Policy.LEADER or response is None:
        return result
    plan = plan_request(Context(identity, topology, ALL_VERSIONS), request)
    if BREAK == "drop-partition":
        plan = _drop_last_partition(plan, api_key, api_version, request, identity, topology)
    replayed: dict[Any, bytes] = {}
    for b, s in plan.subs.items():
        wire = frames.frame([request_head(s), b"\0\0\0\0", *s.tail])
        if BREAK == "double-prefix":
            wire = frames.frame([wire])
        payload = wire[4:]
        if _double_prefix(payload, api_key, api_version):
            add(Finding("one size prefix", f"replayed sub-request to {b} starts with its own length"))
            return result
        replayed[b] = payload[:4] + payload[8:]
    recorded = {s["broker"]: s["request"][:4] + s["request"][8:] for s in subs_recorded}
    if api_key == apis.FETCH:
        same = {b: _fetch_asks(q[:4] + b"\0\0\0\0" + q[4:], api_version) for b, q in recorded.items()} == {
            b: _fetch_asks(q[:4] + b"\0\0\0\0" + q[4:], api_version) for b, q in replayed.items()
        }
    else:
        same = recorded == replayed
    if not same:
        broker = next((b for b in set(recorded) | set(replayed) if recorded.get(b) != replayed.get(b)), None)
        add(Finding("split", f"broker {broker}: " + hexdiff(recorded.get(broker, b""), replayed.get(broker, b""))))
        return result
    if plan.merge is None:
        return result
    answers: dict[Any, Any] = {}
    for s in subs_recorded:
        answers[s["broker"]] = s["response"] if s["response"] is not None else NO_ANSWER_YET
    for target in plan.subs:
        answers.setdefault(target, NO_ANSWER_YET)
    if BREAK == "swap-responses" and len(answers) > 1:
        keys = list(answers)
        answers = dict(zip(keys, [answers[k] for k in keys[1:] + keys[:1]], strict=True))
    recorded_body = response[response_body_offset(response, api_key, api_version) :]
    marks = _recorded_marks(response, api_key, api_version) if api_key == apis.FETCH else {}
    merged = b"".join(bytes(p) for p in plan.merge({ANY if t == ANY else t: a for t, a in answers.items()}, marks).body)
    if merged != recorded_body and not scrubbed:
        add(Finding("merge", hexdiff(recorded_body, merged)))
    _check_partitions(result, api_key, api_version, request, response, topology, identity)
    return result


def _recorded_marks(response: bytes, api_key: int, api_version: int) -> dict[Any, Marks]:
    """The marks kfan reported: for a partition whose broker had not answered,
    they came from the connection's memory, which the capture does not hold."""
    _, layout = layouts(api_key, api_version)
    body = schema.decode_body(
        schema.response_spec(api_key, api_version), response, response_body_offset(response, api_key, api_version), allow_trailing=True
    )
    return {
        (t[layout.topic_key], p["partition_index"]): (
            p.get("high_watermark", -1),
            p.get("last_stable_offset", -1),
            p.get("log_start_offset", -1),
        )
        for t in body[layout.topics]
        for p in t[layout.partitions]
    }


def _drop_last_partition(plan: Any, api_key: int, api_version: int, request: bytes, identity: Identity, topology: Topology) -> Any:
    """The broken split: the client's last partition is left out of the sub-requests."""
    hdr = parse_request_header(request)
    req_layout, _ = layouts(api_key, api_version)
    body = schema.decode_body(schema.request_spec(api_key, api_version), request, hdr.body_offset, allow_trailing=True)
    topics = body[req_layout.topics]
    for t in reversed(topics):
        if len(t[req_layout.partitions]) > 0:
            t[req_layout.partitions] = t[req_layout.partitions][:-1]
            break
    else:
        return plan
    shortened = bytes(request[: hdr.body_offset]) + b"".join(
        bytes(p) for p in schema.encode_body(schema.request_spec(api_key, api_version), body)
    )
    broken = plan_request(Context(identity, topology, ALL_VERSIONS), shortened)
    broken.merge = plan.merge
    return broken


def _check_partitions(
    result: Result, api_key: int, api_version: int, request: bytes, response: bytes, topology: Topology, identity: Identity
) -> None:
    hdr = parse_request_header(request)
    req = schema.decode_body(schema.request_spec(api_key, api_version), request, hdr.body_offset, allow_trailing=True)
    resp = schema.decode_body(
        schema.response_spec(api_key, api_version), response, response_body_offset(response, api_key, api_version), allow_trailing=True
    )
    req_layout, resp_layout = layouts(api_key, api_version)
    if req_layout.keys(req) != resp_layout.keys(resp):
        result.findings.append(
            Finding("every partition once, in order", f"asked {req_layout.keys(req)[:6]}..., answered {resp_layout.keys(resp)[:6]}...")
        )
    # Backend brokers other than the one answering as kfan (itself, in an imported tcpdump).
    leaders = set(topology.brokers) - {identity.node_id}
    for _, p in resp_layout.entries(resp):
        if isinstance(p, dict):
            cl = p.get("current_leader")
            if cl and cl.get("leader_id", -1) in leaders and cl.get("leader_id") != -1:
                result.findings.append(Finding("no broker identity", f"current_leader names broker {cl['leader_id']}"))
                return
