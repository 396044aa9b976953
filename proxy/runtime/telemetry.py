"""Client telemetry (KIP-714) answered by kfan: subscriptions from its configuration, pushed metrics on /metrics.

Kafka clients that implement KIP-714 (the Java client, librdkafka) ask GetTelemetrySubscriptions which metrics
to push and how often, then PushTelemetry them as OTLP ``MetricsData`` (compressed or not). A broker hands them
to a plugin; kfan answers both itself, from subscriptions in a TOML file (``--telemetry-subscriptions``), and
exposes every pushed number on its Prometheus endpoint as ``kfan_telemetry_<metric name>``, labelled by client
instance id, client id and principal (and the data point's own attributes).

Bounds: a push larger than ``max_bytes`` (before and after decompression) is refused; at most
``max_instances`` client instances are kept (the one pushed to least recently goes first), and at most
:data:`MAX_SERIES_PER_INSTANCE` series each. A push kfan refuses gets Kafka's error code and changes nothing.
The subscription id is a digest of what the client was told, so a changed file changes it and clients ask again.

Boundaries: pure bookkeeping, no I/O; the client connection hands requests in (:mod:`proxy.server.planning`).
"""

from __future__ import annotations

import re
import time
import tomllib
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.kafka import apis, errors
from proxy.kafka.schema import Struct, encode_body, response_spec
from proxy.kafka.wire import Parts

INVALID_REQUEST = errors.INVALID_REQUEST
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = errors.INVALID_RECORD
THROTTLING_QUOTA_EXCEEDED = 89
UNKNOWN_SUBSCRIPTION_ID = 117
TELEMETRY_TOO_LARGE = 118
NONE, GZIP = 0, 1  # Kafka's compression type ids: kfan accepts these (the standard library decompresses them)
MATCH_KEYS = ("client_id", "client_software_name", "client_software_version", "principal")
MAX_SERIES_PER_INSTANCE = 2000
NO_INSTANCE = uuid.UUID(int=0)


@dataclass(frozen=True)
class Subscription:
    """One ``[[subscription]]`` of the file: which clients (each ``match`` key a regular expression the whole value
    must match; none: every client), which metrics (name prefixes; ``"*"``: all), how often."""

    name: str
    metrics: tuple[str, ...]
    interval_ms: int
    match: Mapping[str, re.Pattern[str]] = field(default_factory=dict)


def load_subscriptions(path: Path) -> tuple[Subscription, ...]:
    """The subscriptions in a TOML file; raises ValueError naming what is wrong."""
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{path}: {e}") from e
    out = []
    for i, s in enumerate(doc.get("subscription", [])):
        name = str(s.get("name", f"subscription-{i}"))
        metrics = s.get("metrics")
        if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
            raise ValueError(f"{path}: subscription {name}: metrics must be a list of name prefixes")
        interval = int(s.get("interval-ms", 30_000))
        if interval < 100:
            raise ValueError(f"{path}: subscription {name}: interval-ms must be at least 100")
        match = s.get("match", {})
        unknown = set(match) - set(MATCH_KEYS)
        if unknown:
            raise ValueError(f"{path}: subscription {name}: unknown match keys {sorted(unknown)}; known: {', '.join(MATCH_KEYS)}")
        try:
            patterns = {k: re.compile(str(v)) for k, v in match.items()}
        except re.error as e:
            raise ValueError(f"{path}: subscription {name}: {e}") from e
        out.append(Subscription(name, tuple(metrics), interval, patterns))
    return tuple(out)


@dataclass(frozen=True)
class TelemetryClient:
    """What a subscription is matched on: the client as its connection knows it."""

    client_id: str
    client_software_name: str
    client_software_version: str
    principal: str


@dataclass(frozen=True)
class Subscribed:
    """What a client is told: the union of the subscriptions it matches."""

    subscription_id: int
    metrics: tuple[str, ...]  # () none; ("",) all (KIP-714's single empty string)
    interval_ms: int


def subscribed(subscriptions: tuple[Subscription, ...], client: TelemetryClient) -> Subscribed:
    mine = [s for s in subscriptions if all(p.fullmatch(getattr(client, k)) for k, p in s.match.items())]
    prefixes = sorted({m for s in mine for m in s.metrics})
    metrics = ("",) if "*" in prefixes else tuple(prefixes)
    interval = min((s.interval_ms for s in mine), default=300_000)
    digest = zlib.crc32(repr((metrics, interval)).encode()) & 0x7FFFFFFF
    return Subscribed(digest, metrics, interval)


@dataclass
class _Instance:
    client: TelemetryClient
    subscription: Subscribed
    last_push: float | None = None
    terminated: bool = False
    series: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)


class ClientTelemetry(Collector):
    """Every client instance's subscription and last pushed values; a Prometheus collector of them."""

    def __init__(self, subscriptions: tuple[Subscription, ...], *, max_bytes: int = 1 << 20, max_instances: int = 1000) -> None:
        self.subscriptions = subscriptions
        self.max_bytes = max_bytes
        self.max_instances = max_instances
        self._instances: OrderedDict[uuid.UUID, _Instance] = OrderedDict()
        self.refused: dict[int, int] = {}  # error code -> pushes refused with it

    # --- the two APIs ------------------------------------------------------------------------------------

    def get_subscriptions(self, version: int, request: Struct, client: TelemetryClient, now: float | None = None) -> Parts:
        instance_id = request.get("client_instance_id") or NO_INSTANCE
        if instance_id == NO_INSTANCE:
            instance_id = uuid.uuid4()  # a new client instance: kfan names it, as a broker does
        sub = subscribed(self.subscriptions, client)
        kept = self._instances.get(instance_id)
        if kept is None:
            self._keep(instance_id, _Instance(client, sub))
        else:
            kept.client, kept.subscription = client, sub
        return _answer(
            apis.GET_TELEMETRY_SUBSCRIPTIONS,
            version,
            {
                "error_code": 0,
                "client_instance_id": instance_id,
                "subscription_id": sub.subscription_id,
                "accepted_compression_types": [GZIP],
                "push_interval": sub.interval_ms,
                "telemetry_max_bytes": self.max_bytes,
                "delta_temporality": False,
                "requested_metrics": list(sub.metrics),
            },
        )

    def push(self, version: int, request: Struct, now: float | None = None) -> Parts:
        code = self._take(request, time.monotonic() if now is None else now)
        if code:
            self.refused[code] = self.refused.get(code, 0) + 1
        return _answer(apis.PUSH_TELEMETRY, version, {"error_code": code})

    def _take(self, request: Struct, now: float) -> int:
        instance_id = request.get("client_instance_id") or NO_INSTANCE
        if instance_id == NO_INSTANCE:
            return INVALID_REQUEST
        kept = self._instances.get(instance_id)
        if kept is None or request["subscription_id"] != kept.subscription.subscription_id:
            return UNKNOWN_SUBSCRIPTION_ID  # the client asks for its subscription again
        if kept.terminated:
            return INVALID_REQUEST  # nothing may follow a terminating push
        terminating = bool(request.get("terminating"))
        # A client may push a little early (its own jitter); much earlier is too often.
        if not terminating and kept.last_push is not None and now - kept.last_push < kept.subscription.interval_ms / 2000:
            return THROTTLING_QUOTA_EXCEEDED
        compression = request.get("compression_type", NONE)
        if compression not in (NONE, GZIP):
            return UNSUPPORTED_COMPRESSION_TYPE
        data = bytes(request.get("metrics") or b"")
        if len(data) > self.max_bytes:
            return TELEMETRY_TOO_LARGE
        try:
            if compression == GZIP:
                data = _gunzip(data, self.max_bytes)
            series = dict(_points(MetricsData.FromString(data)))
        except _TooLarge:
            return TELEMETRY_TOO_LARGE
        except (OSError, EOFError, zlib.error, DecodeError):
            return INVALID_RECORD
        if len(series) > MAX_SERIES_PER_INSTANCE:
            return TELEMETRY_TOO_LARGE
        kept.series = series
        kept.last_push, kept.terminated = now, terminating
        self._instances.move_to_end(instance_id)
        return 0

    def _keep(self, instance_id: uuid.UUID, instance: _Instance) -> None:
        self._instances[instance_id] = instance
        while len(self._instances) > self.max_instances:
            self._instances.popitem(last=False)  # the one pushed to least recently

    def instances(self) -> int:
        return len(self._instances)

    # --- Prometheus --------------------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        families: dict[str, GaugeMetricFamily] = {}
        for instance_id, kept in list(self._instances.items()):
            base = {"client_instance_id": str(instance_id), "client_id": kept.client.client_id, "principal": kept.client.principal}
            for (name, attributes), value in kept.series.items():
                family_name = "kfan_telemetry_" + _PROM_NAME.sub("_", name)
                family = families.get(family_name)
                if family is None:
                    family = families[family_name] = GaugeMetricFamily(family_name, f"{name}, as pushed by clients (KIP-714)")
                labels = {**{_PROM_NAME.sub("_", k): v for k, v in attributes}, **base}
                family.add_sample(family_name, labels, value)
        yield from families.values()


_PROM_NAME = re.compile(r"[^a-zA-Z0-9_]")


class _TooLarge(Exception):
    pass


def _gunzip(data: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = d.decompress(data, limit + 1)
    if len(out) > limit or d.unconsumed_tail:
        raise _TooLarge
    if not d.eof:
        raise EOFError("gzip stream cut short")
    return out


def _points(data: MetricsData) -> Iterator[tuple[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """Every number data point of gauges and sums, keyed by metric name and attributes."""
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                if kind not in ("gauge", "sum"):
                    continue  # histograms and summaries: Kafka's clients push none
                for p in getattr(m, kind).data_points:
                    value = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
                    attributes = tuple(sorted((a.key, _any_value(a.value)) for a in p.attributes))
                    yield (m.name, attributes), value


def _any_value(v: Any) -> str:
    kind = v.WhichOneof("value")
    return "" if kind is None else str(getattr(v, kind))


def _answer(api: int, version: int, body: Struct) -> Parts:
    spec = response_spec(api, version)
    return encode_body(spec, {**spec.blank(), "throttle_time": 0, **body})
