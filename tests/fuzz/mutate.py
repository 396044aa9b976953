"""Fuzz inputs: valid requests and broker answers for every API kfan serves, and byte mutators.

Everything here is deterministic given a :class:`random.Random`: the same
seed gives the same inputs, so every finding has a reproducer.

* :func:`valid_requests` — request payloads (header + body, no size prefix)
  for every API key and version kfan advertises when the brokers allow
  everything, built from kfan's compiled message schemas (kio's, and
  removed_versions.json for the versions Kafka 4 removed) and encoded with
  kfan's own encoder. Names point into :data:`TOPOLOGY` so that requests
  really split over its brokers.
* :func:`valid_answers` — what brokers could validly answer the
  sub-requests of a plan (answers name the sub-request's own partitions,
  groups and transactions).
* :func:`mutate` — one to four stacked byte-level mutations: bit flips,
  byte replacement, truncation, insertion, duplication and deletion of
  slices, huge and negative int16/int32 lengths and counts at plausible
  offsets, over-long varints, bad tagged-field sections.
* :func:`with_unknown_tags` — a valid flexible message with unknown tagged
  fields added at struct ends (where Kafka allows them).
* :func:`reshape_request`, :func:`reshape_answer` — valid messages that
  say odd things: entries duplicated, dropped, reordered or emptied,
  integers at their extremes, names and topic ids nobody knows.
* :func:`large_requests` — valid requests naming 16,000 groups, partitions,
  topics... (quadratic work shows as seconds).
* :func:`plan` — plans a payload as a client connection does, against
  :data:`CONTEXT` (the topology :data:`TOPOLOGY`, a coordinator cache,
  every API version kfan implements advertised).
"""

from __future__ import annotations

import dataclasses
import random
import struct
import uuid
import zlib
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

from proxy.core import (
    ROUTES,
    Context,
    Coordinator,
    Destination,
    Forward,
    Identity,
    KeyType,
    NeedCoordinators,
    Plan,
    Response,
    SubRequest,
    advertised_versions,
    plan_request,
)
from proxy.core.leader import layouts_of
from proxy.core.topology import Broker, Topology
from proxy.kafka import apis, schema
from proxy.kafka.headers import (
    encode_request_header,
    parse_request_header,
    request_head,
    response_body_offset,
    response_header,
    response_header_flexible,
)
from proxy.kafka.schema import FieldSpec, StructSpec
from proxy.kafka.wire import Writer
from tests.support.records import record_batch

# --- the world the fuzzed requests live in -------------------------------------------

IDENTITY = Identity(node_id=42, host="kfan.example", port=19092)
# --broker-ids cluster: the brokers' own ids at kfan's address, or at a port each.
IDENTITIES = (IDENTITY, dataclasses.replace(IDENTITY, cluster_ids=True), dataclasses.replace(IDENTITY, cluster_ids=True, port_base=29090))
BROKERS = {i: Broker(i, f"broker{i}.internal", 9000 + i, f"zone-{'abc'[i - 1]}") for i in (1, 2, 3)}
ORDERS_ID = uuid.UUID("5a1f3c2e-0000-4000-8000-000000000001")
EVENTS_ID = uuid.UUID("5a1f3c2e-0000-4000-8000-000000000002")
LOGS_ID = uuid.UUID("5a1f3c2e-0000-4000-8000-000000000003")
UNKNOWN_ID = uuid.UUID("5a1f3c2e-0000-4000-8000-0000000000ff")
TOPOLOGY = Topology(
    brokers=BROKERS,
    leaders={
        "orders": {0: 1, 1: 2, 2: 3, 3: 1},
        "events": {0: 2, 1: -1},  # a leaderless partition
        "logs": {0: 3, 1: 9},  # led by a broker that is down (not among the brokers)
    },
    topic_ids={ORDERS_ID: "orders", EVENTS_ID: "events", LOGS_ID: "logs"},
    cluster_id="fuzz-cluster",
    controller_id=2,
    isr={"orders": {0: frozenset({1, 2}), 1: frozenset({2, 3}), 2: frozenset({3}), 3: frozenset({1, 2, 3})}},
)
# Preferred read replicas leaders named (KIP-392): one live and in sync, one out of the ISR, one not a live broker.
READ_REPLICAS = {("zone-b", "orders", 0): 2, ("zone-b", "orders", 2): 1, ("zone-b", "logs", 0): 7, ("", "orders", 3): 2}
# Everything kfan implements, as if every broker supported every version.
API_VERSIONS: dict[int, tuple[int, int]] = advertised_versions([])
# The I/O layer's coordinator cache: some groups and transactions known, others not.
GROUP, TXN = KeyType.GROUP, KeyType.TRANSACTION
COORDINATORS = {
    Coordinator(GROUP, "g1"): 1,
    Coordinator(GROUP, "g2"): 2,
    Coordinator(GROUP, "consumers"): 3,
    Coordinator(TXN, "tx1"): 2,
    Coordinator(TXN, "tx2"): 3,
}


def known_coordinator(c: Coordinator) -> int | None:
    """The coordinator cache kfan's connection would consult; the huge requests' generated names are all known."""
    node = COORDINATORS.get(c)
    if node is None and c.key[:2] in ("g-", "tx"):
        node = 1 + zlib.crc32(c.key.encode()) % 3
    return node


def _fuzz_acls() -> Any:
    """ACLs that allow some of the world's resources and deny others (literal, prefixed, wildcard; DENY over ALLOW)."""
    from proxy.core.acls import CLUSTER_NAME, AclBinding, Acls, Operation, PatternType, Permission, ResourceType

    me, lit, pre = "User:fuzz", PatternType.LITERAL, PatternType.PREFIXED
    allow, deny = Permission.ALLOW, Permission.DENY
    T, G, X, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID, ResourceType.CLUSTER
    return Acls(
        [
            AclBinding(me, "*", T, "orders", lit, Operation.ALL, allow),
            AclBinding(me, "*", T, "ev", pre, Operation.READ, allow),
            AclBinding(me, "*", T, "events", lit, Operation.DESCRIBE, deny),
            AclBinding("User:*", "*", T, "*", lit, Operation.DESCRIBE_CONFIGS, allow),
            AclBinding(me, "*", G, "g", pre, Operation.READ, allow),
            AclBinding(me, "*", G, "g2", lit, Operation.READ, deny),
            AclBinding(me, "*", X, "tx1", lit, Operation.WRITE, allow),
            AclBinding(me, "*", C, CLUSTER_NAME, lit, Operation.DESCRIBE, allow),
        ]
    )


def context(looked_up: bool = False, judged: bool = False, identity: Identity = IDENTITY) -> Context:
    """The context a client connection plans with (``looked_up``: after resolving the coordinators a plan asked for;
    ``judged``: by ACLs, --authorizer acls; ``identity``: kfan as its clients see it)."""
    names = {f.name for f in dataclasses.fields(Context)}
    extra: dict[str, Any] = {}
    if "coordinator_of" in names:
        extra["coordinator_of"] = known_coordinator
    if "coordinators_looked_up" in names:
        extra["coordinators_looked_up"] = looked_up
    if "fetch_ahead_bytes" in names:
        extra["fetch_ahead_bytes"] = 16 << 20  # as kfan serves: Fetch merges also plan the sub-fetches sent ahead
    if "read_replica" in names:
        extra["rack"] = "zone-b"  # Fetches also go to read replicas, and their answers are followed
        extra["read_replica"] = READ_REPLICAS.get
    if judged and "access" in names:
        from proxy.core.acls import Access

        extra["access"] = Access(_fuzz_acls(), "User:fuzz", "10.0.0.1")
    return Context(identity, TOPOLOGY, API_VERSIONS, **extra)


CONTEXT = context()
# (identity, looked up, judged) -> the context
_CONTEXTS = {
    (i, looked_up, judged): context(looked_up, judged, i) for i in IDENTITIES for looked_up in (False, True) for judged in (False, True)
}


def plan(payload: bytes | memoryview, judged: bool = False) -> Plan:
    """Plan a request as the connection does: again, once the coordinators it names were looked up, when it asks.

    ``judged``: by ACLs first (--authorizer acls), as a governed kfan plans. Each of kfan's identities
    (:data:`IDENTITIES`, ``--broker-ids``) plans a third of the requests, by their bytes."""
    identity = IDENTITIES[zlib.crc32(payload) % len(IDENTITIES)]
    first = plan_request(_CONTEXTS[identity, False, judged], payload)
    if isinstance(first, NeedCoordinators):
        return plan_request(_CONTEXTS[identity, True, judged], payload)
    return first


TOPICS = ("orders", "events", "logs", "missing")
TOPIC_IDS = (ORDERS_ID, EVENTS_ID, LOGS_ID, UNKNOWN_ID)
GROUPS = ("g1", "g2", "g3", "consumers", "")
TXNS = ("tx1", "tx2", "tx3")
ERROR_CODES = (0, 0, 0, 0, 0, 0, 3, 6, 15, 16, 74, 100, 7, 13)

# --- values from the schemas -------------------------------------------------------------


_FIXED_TYPES = frozenset(schema.FIXED)


class Generator:
    """Random but schema-valid message dicts (kfan's decoded form) from kfan's compiled schemas
    (kio's for the versions it has, removed_versions.json for the older ones).

    ``big`` makes the message's first top-level array that many entries long,
    with group and transaction names unique per entry (the shape of a huge
    batched request).
    """

    def __init__(self, rng: random.Random, *, big: int = 0, answer: bool = False, lean: bool = False) -> None:
        self.rng = rng
        self.big = big
        self.answer = answer
        self.lean = lean or bool(big)  # short nested arrays, strings and bytes
        self._serial = 0

    def message(self, spec: StructSpec) -> dict[str, Any]:
        return self._struct(spec, top=True)

    def _struct(self, spec: StructSpec, top: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {}
        big_done = not top or not self.big
        for f in (*spec.fields, *spec.tagged.values()):
            if f.tag is not None and self.rng.random() < 0.5:
                continue  # tagged fields are optional on the wire
            length = None
            if not big_done and f.array:
                length, big_done = self.big, True
            out[f.name] = self._value(spec.name, f, length)
        return out

    def _value(self, owner: str, f: FieldSpec, length: int | None = None) -> Any:
        rng = self.rng
        # Only strings, bytes, arrays and structs have a null on the wire. A tagged
        # field says null by its absence (and kio, the oracle, refuses a present null).
        if f.nullable and f.tag is None and length is None and f.kafka_type not in _FIXED_TYPES and rng.random() < 0.08:
            return None
        if f.array:
            n = length if length is not None else rng.choice((0, 1) if self.lean else (0, 1, 1, 2, 2, 3, 4))
            return [self._element(owner, f) for _ in range(n)]
        return self._element(owner, f)

    def _element(self, owner: str, f: FieldSpec) -> Any:
        if f.struct is not None:
            return self._struct(f.struct)
        assert f.kafka_type is not None, (owner, f.name)
        return self._primitive(owner, f.name, f.kafka_type)

    def _unique(self, base: str) -> str:
        self._serial += 1
        return f"{base}-{self._serial}"

    def _primitive(self, owner: str, name: str, kafka_type: str) -> Any:
        rng = self.rng
        lname = name.lower()
        if kafka_type == "string":
            if "topic" in lname or (lname == "name" and "Topic" in owner):
                return rng.choice(TOPICS)
            if "group" in lname or lname in ("key", "coordinator_keys"):
                return self._unique("g") if self.big else rng.choice(GROUPS)
            if "transactional" in lname:
                return self._unique("tx") if self.big else rng.choice(TXNS)
            if lname == "host":
                return f"broker{rng.randint(1, 3)}.internal"
            return rng.choice(("", "a")) if self.lean else rng.choice(("", "a", "kfan", "ünïcode", "x" * rng.randint(0, 40)))
        if kafka_type in ("bytes", "records"):
            return rng.randbytes(rng.choice((0, 1, 16) if self.lean else (0, 1, 16, 61, 200)))
        if kafka_type == "bool":
            return rng.random() < 0.5
        if kafka_type == "uuid":
            if "topic" in lname:
                return rng.choice(TOPIC_IDS)
            return uuid.UUID(int=rng.getrandbits(128))
        if kafka_type == "float64":
            return rng.choice((0.0, 1.5, -2.25, 1e300))
        if kafka_type in ("timedelta_i32", "timedelta_i64"):
            return rng.choice((0, 0, 10, 500, 30_000))
        if kafka_type == "datetime_i64":
            return rng.choice((0, 1_700_000_000_000))  # kio refuses negative timestamps
        if kafka_type == "error_code" or lname.endswith("error_code"):
            return rng.choice(ERROR_CODES) if self.answer else 0
        if kafka_type == "int8":
            return rng.choice((0, 0, 1, -1, 3))
        if kafka_type == "int16":
            if lname == "acks":
                return rng.choice((-1, -1, 1, 1, 0))
            if lname == "key_type":
                return rng.choice((0, 1))
            if "version" in lname:
                return rng.choice((0, 1, 4))
            return rng.choice((0, 1, -1, 7, 0x7FFF))
        if kafka_type == "uint16":
            return rng.choice((0, 1, 0xFFFF))
        if kafka_type == "int32":
            if lname in ("session_id",):
                return 0
            if lname in ("session_epoch",):
                return -1
            if "partition" in lname or lname in ("index", "partition_indexes"):
                return rng.choice((0, 0, 1, 1, 2, 3, 5))
            if lname in ("node_id", "broker_id", "leader_id", "controller_id", "replica_nodes", "isr_nodes", "coordinator_id"):
                return rng.choice((1, 2, 3, -1))
            if lname == "port":
                return 9000 + rng.randint(1, 3)
            if "bytes" in lname:
                return rng.choice((0, 1, 100, 1 << 20, 0x7FFFFFFF))
            return rng.choice((0, 1, -1, 5, 1000, 0x7FFFFFFF, -0x80000000))
        if kafka_type == "uint32":
            return rng.choice((0, 1, 0xFFFFFFFF))
        if kafka_type == "int64":
            return rng.choice((0, 1, -1, 42, 1 << 40, 0x7FFFFFFFFFFFFFFF))
        raise TypeError(f"{owner}.{name}: unknown kafka_type {kafka_type!r}")


def _join(parts: Any) -> bytes:
    return b"".join(bytes(p) for p in parts)


def encode_request(api_key: int, version: int, body: dict[str, Any], correlation_id: int = 7, client_id: str | None = "fuzz") -> bytes:
    """A request payload (no size prefix) with kfan's own encoder."""
    return encode_request_header(api_key, version, correlation_id, client_id) + _join(
        schema.encode_body(schema.request_spec(api_key, version), body)
    )


def request_body(api_key: int, version: int, rng: random.Random, big: int = 0) -> dict[str, Any]:
    body = Generator(rng, big=big).message(schema.request_spec(api_key, version))
    if api_key == apis.PRODUCE:
        # Whole record batches: random bytes would all be refused by the records check before any split.
        for topic in body["topic_data"]:
            for partition in topic["partition_data"]:
                partition["records"] = record_batch(rng.randbytes(rng.randrange(64)))
    return body


def _versions() -> Iterator[tuple[int, int]]:
    for api_key, (lo, hi) in sorted(API_VERSIONS.items()):
        for version in range(lo, hi + 1):
            yield api_key, version


VARIANTS = 3  # valid requests per API key and version


@cache
def _valid_requests() -> tuple[bytes, ...]:
    out = []
    for api_key, version in _versions():
        for variant in range(VARIANTS):
            rng = random.Random(f"request {api_key} {version} {variant}")
            client_id = (None, "fuzz", "")[variant]
            out.append(encode_request(api_key, version, request_body(api_key, version, rng), 1000 + variant, client_id))
    return tuple(out)


def valid_requests() -> list[bytes]:
    """Valid request payloads (header + body, no size prefix), several per API key and version kfan advertises."""
    return list(_valid_requests())


# APIs where one request names many entries: huge ones look for quadratic work.
LARGE = 16_000


def large_request(api_key: int, version: int, n: int = LARGE) -> bytes:
    """A valid request whose first top-level array has ``n`` entries (groups and transactions named uniquely)."""
    rng = random.Random(f"large {api_key} {version}")
    return encode_request(api_key, version, request_body(api_key, version, rng, big=n))


@cache
def _large_requests() -> tuple[bytes, ...]:
    out = []
    for api_key, (lo, hi) in sorted(API_VERSIONS.items()):
        if api_key != apis.API_VERSIONS:
            out.extend(large_request(api_key, version) for version in sorted({lo, hi}))
    return tuple(out)


def large_requests() -> list[bytes]:
    """One valid request per API key (oldest and newest version) whose main array has :data:`LARGE` entries."""
    return list(_large_requests())


# --- broker answers ----------------------------------------------------------------------


def sub_request_body(sub: SubRequest) -> dict[str, Any]:
    """A sub-request's body, decoded."""
    wire = request_head(sub.api_key, sub.api_version) + b"\0\0\0\0" + _join(sub.tail)
    offset = parse_request_header(wire).body_offset
    return schema.decode_body(schema.request_spec(sub.api_key, sub.api_version), wire, offset, allow_trailing=True)


def answer_body(api_key: int, version: int, request: dict[str, Any], rng: random.Random, lean: bool = False) -> dict[str, Any]:
    """A valid answer to ``request``, naming what it names (``lean``: little besides)."""
    spec = schema.response_spec(api_key, version)
    body = Generator(rng, answer=True, lean=lean).message(spec)
    route = ROUTES.get(api_key)
    if route is not None and route.layout is not None:  # split by leader
        req_layout, resp_layout = layouts_of(route, version)
        topics = []
        for t in request[req_layout.topics]:
            parts = []
            for p in t[req_layout.partitions]:
                entry = _entry_like(spec, resp_layout.topics, resp_layout.partitions, rng, lean)
                entry[resp_layout.index or "partition_index"] = req_layout.partition_index(p)
                parts.append(entry)
            topic = _entry_like(spec, resp_layout.topics, None, rng, lean)
            topic[resp_layout.topic_key] = t[req_layout.topic_key]
            topic[resp_layout.partitions] = parts
            topics.append(topic)
        body[resp_layout.topics] = topics
    batch = None if route is None else route.batch
    if batch is not None and batch.request_array in request and spec.has(batch.response_array):
        entries = []
        for e in request[batch.request_array] or []:
            entry = _entry_like(spec, batch.response_array, None, rng, lean)
            entry[batch.response_key] = e if batch.request_key is None else e[batch.request_key]
            entries.append(entry)
        body[batch.response_array] = entries
    if api_key == apis.FIND_COORDINATOR and "coordinator_keys" in request and spec.has("coordinators"):
        coordinators = []
        for key in request["coordinator_keys"]:
            entry = _entry_like(spec, "coordinators", None, rng, lean)
            entry["key"] = key
            coordinators.append(entry)
        body["coordinators"] = coordinators
    return body


def _entry_like(spec: StructSpec, array: str, nested: str | None, rng: random.Random, lean: bool = False) -> dict[str, Any]:
    """A generated element of ``spec.array`` (or of its elements' ``nested`` array)."""
    elem = spec.field(array).struct
    if nested is not None:
        assert elem is not None, (spec.name, array)
        elem = elem.field(nested).struct
    assert elem is not None, (spec.name, array, nested)
    return Generator(rng, answer=True, lean=lean).message(elem)


def encode_answer(api_key: int, version: int, body: dict[str, Any], correlation_id: int = 9) -> bytes:
    """A broker's response payload: response header + body."""
    return response_header(api_key, version, correlation_id) + _join(schema.encode_body(schema.response_spec(api_key, version), body))


def valid_answers(plan: Forward, rng: random.Random | None = None, lean: bool = False) -> dict[Destination, Response]:
    """A valid broker answer for each sub-request of ``plan`` (``lean``: entries carry little besides their keys,
    so that answers to huge requests stay a few bytes per entry)."""
    rng = rng if rng is not None else random.Random(f"answers {plan.header.api_key} {plan.header.api_version}")
    out: dict[Destination, Response] = {}
    for destination, sub in plan.subs.items():
        request = sub_request_body(sub)
        out[destination] = Response(
            encode_answer(sub.api_key, sub.api_version, answer_body(sub.api_key, sub.api_version, request, rng, lean))
        )
    return out


# --- unknown tagged fields where Kafka allows them ---------------------------------------


def with_unknown_tags(
    api_key: int, version: int, payload: bytes, rng: random.Random, *, response: bool = True, header: bool = True
) -> bytes:
    """``payload`` (a valid answer) re-encoded with unknown tagged fields added at random struct ends.

    Returns ``payload`` unchanged when the version is not flexible.
    """
    if not schema.is_flexible(api_key, version):
        return payload
    spec = schema.response_spec(api_key, version) if response else schema.request_spec(api_key, version)
    offset = response_body_offset(payload, api_key, version) if response else parse_request_header(payload).body_offset
    body = schema.decode_body(spec, payload, offset, allow_trailing=True)
    _add_tags(spec, body, rng)
    head = bytes(payload[:offset])
    if response and header and response_header_flexible(api_key, version):
        head = head[:4] + _tag_section([(tag, rng.randbytes(rng.randint(0, 8))) for tag in _unknown_tags(set(), rng)])
    return head + _join(schema.encode_body(spec, body))


def _unknown_tags(known: set[int], rng: random.Random) -> list[int]:
    tags = sorted({rng.choice((0, 1, 2, 3, 7, 99, 1000, 0x7FFFFFFF)) for _ in range(rng.randint(1, 3))} - known)
    return tags or [12345]


def _tag_section(tags: list[tuple[int, bytes]]) -> bytes:
    w = Writer()
    w.uvarint(len(tags))
    for tag, data in tags:
        w.uvarint(tag)
        w.uvarint(len(data))
        w.raw(data)
    return _join(w.finish())


def _add_tags(spec: schema.StructSpec, value: Any, rng: random.Random) -> None:
    if not isinstance(value, dict):
        return
    if rng.random() < 0.5:
        value.setdefault(schema.TAGS, {}).update({t: rng.randbytes(rng.randint(0, 8)) for t in _unknown_tags(set(spec.tagged), rng)})
    for f in (*spec.fields, *spec.tagged.values()):
        if f.struct is None or f.name not in value:
            continue
        v = value[f.name]
        for item in v if isinstance(v, list) else [v]:
            _add_tags(f.struct, item, rng)


# --- valid but odd: structure-aware reshaping --------------------------------------------

_INT_EXTREMES = {
    "int8": (-128, 127, -1, 0),
    "int16": (-0x8000, 0x7FFF, -1, 0),
    "int32": (-0x80000000, 0x7FFFFFFF, -1, 0, 1 << 20),
    "int64": (-(1 << 63), (1 << 63) - 1, -1, 0),
    "timedelta_i32": (0, 0x7FFFFFFF),
    "timedelta_i64": (0, (1 << 63) - 1),
    "datetime_i64": (0, 1 << 50),
    "uint16": (0, 0xFFFF),
    "error_code": (0, -1, 0x7FFF, 6, 16, 100),
}


def _clone(value: Any) -> Any:
    """A deep copy of a decoded message part (byte fields are memoryviews, which ``copy.deepcopy`` refuses)."""
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value


class Reshaper:
    """Changes a decoded message so that it still encodes validly but says odd things: entries
    duplicated, dropped, reordered or emptied, integers at their extremes, names and ids that
    the topology does not know (the kind of input byte flips rarely reach intact)."""

    def __init__(self, rng: random.Random, rate: float = 0.15) -> None:
        self.rng = rng
        self.rate = rate

    def struct(self, spec: StructSpec, value: dict[str, Any]) -> None:
        rng = self.rng
        for f in (*spec.fields, *spec.tagged.values()):
            if f.name not in value:
                continue
            v = value[f.name]
            if f.array:
                if not isinstance(v, list):
                    continue
                if v and rng.random() < self.rate:
                    op = rng.randrange(5)
                    if op == 0:
                        v.insert(rng.randrange(len(v) + 1), _clone(rng.choice(v)))
                    elif op == 1:
                        del v[rng.randrange(len(v))]
                    elif op == 2:
                        v.reverse()
                    elif op == 3:
                        v.clear()
                    else:
                        v.extend(_clone(v))
                for i, item in enumerate(v):
                    if f.struct is not None and isinstance(item, dict):
                        self.struct(f.struct, item)
                    elif f.kafka_type is not None and rng.random() < self.rate / 2:
                        v[i] = self.primitive(f.name, f.kafka_type, item)
            elif f.struct is not None:
                if isinstance(v, dict):
                    self.struct(f.struct, v)
            elif f.kafka_type is not None and rng.random() < self.rate:
                value[f.name] = self.primitive(f.name, f.kafka_type, v)

    def primitive(self, name: str, kafka_type: str, v: Any) -> Any:
        rng = self.rng
        if kafka_type in _INT_EXTREMES:
            return rng.choice(_INT_EXTREMES[kafka_type])
        if kafka_type == "string" and v is not None:
            return rng.choice(("", "missing", "orders", "g1", "tx1", "é" * 3, "z" * 300))
        if kafka_type == "uuid":
            return rng.choice((uuid.UUID(int=0), UNKNOWN_ID, ORDERS_ID))
        if kafka_type == "bool":
            return not v
        return v


def reshape_request(payload: bytes, rng: random.Random) -> bytes:
    """A valid request (its header kept) re-encoded after :class:`Reshaper` changed its body; unchanged if it does not decode."""
    try:
        hdr = parse_request_header(payload)
        body = schema.decode_body(schema.request_spec(hdr.api_key, hdr.api_version), payload, hdr.body_offset, allow_trailing=True)
    except Exception:
        return payload
    Reshaper(rng).struct(schema.request_spec(hdr.api_key, hdr.api_version), body)
    return bytes(payload[: hdr.body_offset]) + _join(schema.encode_body(schema.request_spec(hdr.api_key, hdr.api_version), body))


def reshape_answer(api_key: int, version: int, payload: bytes, rng: random.Random) -> bytes:
    """A valid answer (its header kept) re-encoded after :class:`Reshaper` changed its body."""
    offset = response_body_offset(payload, api_key, version)
    spec = schema.response_spec(api_key, version)
    body = schema.decode_body(spec, payload, offset, allow_trailing=True)
    Reshaper(rng).struct(spec, body)
    return bytes(payload[:offset]) + _join(schema.encode_body(spec, body))


# --- byte mutators -----------------------------------------------------------------------

Mutator = Callable[[bytearray, random.Random], None]
INTERESTING_32 = (0x7FFFFFFF, -0x80000000, -1, -2, 0x10000000, 0x7FFFFFFE, 65536, 0x01000000)
INTERESTING_16 = (0x7FFF, -0x8000, -1, -2, 0x0100, 0x4000)
INTERESTING_8 = (0x00, 0xFF, 0x7F, 0x80, 0x01, 0xFE)


def _pos(data: bytearray, rng: random.Random, width: int = 1) -> int | None:
    """A position for a ``width``-byte change, mostly past the 8-byte header head."""
    n = len(data) - width + 1
    if n <= 0:
        return None
    lo = 8 if n > 8 and rng.random() < 0.8 else 0
    return rng.randrange(lo, n)


def bit_flip(data: bytearray, rng: random.Random) -> None:
    for _ in range(rng.randint(1, 4)):
        if (p := _pos(data, rng)) is not None:
            data[p] ^= 1 << rng.randrange(8)


def replace_bytes(data: bytearray, rng: random.Random) -> None:
    for _ in range(rng.randint(1, 4)):
        if (p := _pos(data, rng)) is not None:
            data[p] = rng.choice(INTERESTING_8) if rng.random() < 0.5 else rng.randrange(256)


def truncate(data: bytearray, rng: random.Random) -> None:
    if data:
        del data[rng.randrange(len(data)) :]


def insert_random(data: bytearray, rng: random.Random) -> None:
    p = rng.randint(0, len(data))
    data[p:p] = rng.randbytes(rng.choice((1, 1, 2, 4, 8, 33)))


def duplicate_slice(data: bytearray, rng: random.Random) -> None:
    if not data:
        return
    a = rng.randrange(len(data))
    b = min(len(data), a + rng.randint(1, 64))
    chunk = bytes(data[a:b]) * rng.choice((1, 1, 2, 8))
    p = rng.randint(0, len(data))
    data[p:p] = chunk


def delete_slice(data: bytearray, rng: random.Random) -> None:
    if data:
        a = rng.randrange(len(data))
        del data[a : a + rng.randint(1, 16)]


def _count_like(data: bytearray, width: int) -> list[int]:
    """Offsets where a small non-negative big-endian int of ``width`` bytes sits (a plausible length or count)."""
    zeros = bytes(width - 1)
    return [i for i in range(len(data) - width + 1) if data[i : i + width - 1] == zeros and data[i + width - 1] < 0x40]


def huge_int32(data: bytearray, rng: random.Random) -> None:
    spots = _count_like(data, 4)
    p = rng.choice(spots) if spots and rng.random() < 0.8 else _pos(data, rng, 4)
    if p is not None:
        value = rng.choice((*INTERESTING_32, len(data), len(data) - p))
        data[p : p + 4] = struct.pack(">i", value if value < 0x80000000 else -1)


def huge_int16(data: bytearray, rng: random.Random) -> None:
    spots = _count_like(data, 2)
    p = rng.choice(spots) if spots and rng.random() < 0.8 else _pos(data, rng, 2)
    if p is not None:
        data[p : p + 2] = struct.pack(">h", rng.choice(INTERESTING_16))


def overlong_varint(data: bytearray, rng: random.Random) -> None:
    """A varint of 11+ bytes, or a huge one (a compact length or count of ~2^35), where a small one sits."""
    spots = [i for i in range(len(data)) if data[i] < 0x80]
    p = rng.choice(spots) if spots else _pos(data, rng)
    if p is None:
        return
    if rng.random() < 0.5:
        data[p : p + 1] = b"\xff" * rng.randint(10, 20) + b"\x01"
    else:
        data[p : p + 1] = rng.choice((b"\xff\xff\xff\xff\x7f", b"\x80\x80\x80\x80\x10", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"))


def bad_tags(data: bytearray, rng: random.Random) -> None:
    """Replace an empty tagged-field section (a 0 byte) with one that lies, or with unknown tags."""
    zeros = [i for i in range(len(data)) if data[i] == 0]
    p = rng.choice(zeros) if zeros else len(data)
    kind = rng.randrange(5)
    if kind == 0:  # more tags than bytes
        section = bytes([rng.choice((5, 0x7F))])
    elif kind == 1:  # a tag whose size runs past the end
        section = b"\x01\x05" + bytes([rng.choice((0x7F, 0x40))]) + b"ab"
    elif kind == 2:  # unknown tags, well formed
        section = _tag_section([(t, rng.randbytes(rng.randint(0, 6))) for t in _unknown_tags(set(), rng)])
    elif kind == 3:  # a known tag number with a body that is not its type
        section = _tag_section([(rng.randint(0, 3), rng.randbytes(rng.randint(0, 6)))])
    else:  # duplicate tags, out of order
        section = _tag_section([(3, b"\x01"), (1, b""), (3, b"\x02\x03")])
    data[p : p + 1] = section


def splice_self(data: bytearray, rng: random.Random) -> None:
    """Overwrite a slice with another slice of the same input (moves structure around)."""
    if len(data) < 4:
        return
    a, b = sorted(rng.sample(range(len(data)), 2))
    chunk = bytes(data[a:b][:32])
    p = rng.randrange(len(data))
    data[p : p + len(chunk)] = chunk


MUTATORS: tuple[Mutator, ...] = (
    bit_flip,
    replace_bytes,
    truncate,
    insert_random,
    duplicate_slice,
    delete_slice,
    huge_int32,
    huge_int16,
    overlong_varint,
    bad_tags,
    splice_self,
)
# Structure-aware mutators find more: pick them more often.
WEIGHTS = (3, 3, 1, 2, 2, 2, 4, 3, 3, 3, 1)


def mutate(payload: bytes, rng: random.Random) -> bytes:
    """One to four stacked mutations of ``payload``."""
    data = bytearray(payload)
    for m in rng.choices(MUTATORS, WEIGHTS, k=rng.choice((1, 1, 1, 2, 2, 3, 4))):
        m(data, rng)
    return bytes(data)


__all__ = [
    "CONTEXT",
    "plan",
    "reshape_answer",
    "reshape_request",
    "IDENTITY",
    "TOPOLOGY",
    "large_requests",
    "mutate",
    "valid_answers",
    "valid_requests",
    "with_unknown_tags",
]
