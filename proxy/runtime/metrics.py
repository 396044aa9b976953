"""Prometheus metrics and the health endpoints, on a listener of their own.

Every family is prefixed ``kfan_``. With ``--workers N`` the workers write
their samples to a shared directory (prometheus-client's multiprocess mode,
``PROMETHEUS_MULTIPROC_DIR``) and the parent process serves the sum, so one
scrape sees all workers. The HTTP side is a small trio server: ``/metrics``,
``/healthz`` (the process is alive) and ``/readyz`` (topology known and at
least one broker reachable).
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Callable
from typing import Any

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import REGISTRY as DEFAULT_REGISTRY

log = logging.getLogger("kfan.metrics")

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

CLIENT_REQUESTS = Counter("kfan_client_requests", "Client requests, by API key and version", ["api_key", "api_version"])
CLIENT_LATENCY = Histogram(
    "kfan_client_request_duration_seconds", "Client request to response written, by API key", ["api_key"], buckets=_LATENCY_BUCKETS
)
BROKER_LATENCY = Histogram(
    "kfan_broker_request_duration_seconds",
    "Sub-request to broker answer, by broker and API key",
    ["broker", "api_key"],
    buckets=_LATENCY_BUCKETS,
)
FANOUT = Histogram(
    "kfan_fanout_width", "Sub-requests per client request, by API key", ["api_key"], buckets=(0, 1, 2, 3, 4, 6, 8, 12, 16, 32)
)
BYTES = Counter("kfan_bytes", "Bytes on the wire, by direction (client_in, client_out, broker_out, broker_in)", ["direction"])
INFLIGHT = Gauge("kfan_inflight_requests", "Client requests being processed", multiprocess_mode="livesum")
CLIENT_CONNECTIONS = Gauge("kfan_client_connections", "Open client connections", multiprocess_mode="livesum")
BROKER_CONNECTIONS = Gauge("kfan_broker_connections", "Open connections to brokers, by broker", ["broker"], multiprocess_mode="livesum")
ERRORS = Counter(
    "kfan_errors", "Kafka error codes in answers to clients, by error code and broker (-1: kfan itself)", ["error_code", "broker"]
)
FETCH_BYTES = Counter(
    "kfan_fetch_bytes",
    "Bytes of records brokers sent kfan in Fetch answers, by broker and its locality to kfan (--rack): same-rack, cross-rack, unknown",
    ["broker", "locality"],
)
REFRESHES = Counter("kfan_topology_refreshes", "Topology refreshes, by result", ["result"])
TOPOLOGY_AGE = Gauge("kfan_topology_age_seconds", "Seconds since the topology was last refreshed", multiprocess_mode="max")
CAPTURE_DROPPED = Counter("kfan_capture_dropped", "Captured exchanges dropped because the capture writer lagged")
BROKER_UP = Gauge("kfan_broker_reachable", "1 if kfan reaches the broker, else 0", ["broker"], multiprocess_mode="max")
CLIENT_CLOSES = Counter(
    "kfan_client_connections_closed",
    "Client connections kfan closed itself, by reason (malformed, unsupported, idle_timeout, frame_timeout, "
    "broker_answer, internal_error, max_connections, tls_handshake, tls_on_plaintext, unauthenticated, authentication_failed, "
    "unsupported_sasl_mechanism, illegal_sasl_state, session_expired, max_age, drain)",
    ["reason"],
)
INVALID_BATCHES = Counter(
    "kfan_invalid_batches",
    "Produced partitions refused before any broker saw them, by reason (crc, length, magic, count, offset_delta)",
    ["reason"],
)
AUTHENTICATIONS = Counter(
    "kfan_authentications",
    "Client authentications by kfan, by mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, mTLS) and result "
    "(ok, reauthenticated, failed, unsupported_mechanism, expired)",
    ["mechanism", "result"],
)
BROKER_AUTHENTICATIONS = Counter(
    "kfan_broker_authentications",
    "kfan's SASL authentications on its broker links, by broker, mechanism and result (ok, reauthenticated, failed, "
    "abandoned: the link was closed while it logged in)",
    ["broker", "mechanism", "result"],
)
BROKER_CONNECTS = Counter(
    "kfan_broker_connects",
    "Links kfan opened to brokers, by broker (-1: a bootstrap address) and result (ok, failed, login_refused, abandoned); "
    "connections not tried while kfan backs off from a failing broker are counted as backed_off",
    ["broker", "result"],
)
BUFFERED_BYTES = Gauge(
    "kfan_buffered_bytes",
    "Bytes held for clients: frames arriving, requests in flight, brokers' answers held, responses unwritten",
    multiprocess_mode="livesum",
)
CACHE_BYTES = Gauge(
    "kfan_cache_bytes",
    "Bytes of the process-wide caches clients fill with names they choose, by cache (coordinators, read_replicas)",
    ["cache"],
    multiprocess_mode="livesum",
)
BROKER_ANSWERS_UNDECODABLE = Counter(
    "kfan_broker_answers_undecodable",
    "Broker answers kfan could not decode (the client got a retriable error for that broker's part), by broker and API name",
    ["broker", "api"],
)
CACHE_EVICTIONS = Counter("kfan_cache_evictions", "Entries evicted from a bounded cache to stay within its bounds, by cache", ["cache"])
SHARED_ANSWERS = Counter(
    "kfan_shared_answers", "Client requests answered by an identical one already out to a broker (not sent again), by API key", ["api_key"]
)

AUTHORIZATION_DECISIONS = Counter(
    "kfan_authorization_decisions",
    "Decisions kfan's ACLs made about client requests (--authorizer acls), by API key, operation, resource type and result",
    ["api_key", "operation", "resource_type", "result"],
)
ACL_RELOADS = Counter("kfan_acl_reloads", "Reads of the ACL file, by result (ok, invalid: the previous ACLs are kept)", ["result"])
ACL_BINDINGS = Gauge(
    "kfan_acl_bindings", "ACL bindings in force (one per principal, host, operation and resource pattern)", multiprocess_mode="max"
)
AUDIT_EVENTS = Counter("kfan_audit_events", "Audit events written, by kind (connection, request)", ["kind"])
AUDIT_DROPPED = Counter(
    "kfan_audit_dropped", "Audit events dropped because the audit sink lagged (--audit-overflow drop), by kind", ["kind"]
)
AUDIT_QUEUED = Gauge("kfan_audit_queued_events", "Audit events waiting to be written", multiprocess_mode="livesum")
QUOTA_THROTTLE = Counter(
    "kfan_quota_throttle_seconds",
    "Throttle time kfan gave clients over a quota, by quota (producer_byte_rate, consumer_byte_rate, request_percentage) "
    'and the entity whose rate it is (user, client_id; "" when the rate is not kept by it, <other> past the label bound)',
    ["quota", "user", "client_id"],
)
QUOTA_THROTTLED = Counter(
    "kfan_quota_throttled_requests",
    "Requests answered with a throttle time by kfan's quotas, by quota and entity",
    ["quota", "user", "client_id"],
)
QUOTA_USAGE = Counter(
    "kfan_quota_usage",
    "What clients with a quota used, by quota and entity: bytes (producer_byte_rate, consumer_byte_rate), "
    "or kfan's CPU seconds on their requests (request_percentage); its rate() is the entity's byte rate or CPU share",
    ["quota", "user", "client_id"],
)
CONFIG_GENERATION = Gauge(
    "kfan_config_generation",
    "The configuration in force: 1 at start, one more at each reload that changed something",
    multiprocess_mode="max",
)
CONFIG_RELOADS = Counter("kfan_config_reloads", "Configuration reloads (SIGHUP, a changed --config file), by result", ["result"])
CONFIG_LAST_RELOAD = Gauge(
    "kfan_config_last_reload_timestamp_seconds",
    "When the configuration was last reloaded with each result",
    ["result"],
    multiprocess_mode="max",
)
QUOTA_ENTITIES = Gauge("kfan_quota_rates", "Client rates kfan keeps against quotas (one per quota and entity)", multiprocess_mode="livesum")
QUOTA_ENTRIES = Gauge("kfan_quota_entries", "Quota entries in force (one per quota type and entity)", multiprocess_mode="max")


# --- the request path's updates, added up in batches ---------------------------
#
# A labelled update costs a few microseconds (the label lookup, a lock, a
# multiprocess file's mmap): a request made about twenty of them, 8% of a small
# request's CPU. The request path adds to plain dicts instead (by the label
# values as they are, not yet as strings); :func:`flush` moves the sums into
# the metrics, once a second (:func:`flush_forever`), before every scrape of
# this process and at its end. Only the event loop's thread adds.

_counted: dict[tuple[Any, tuple[object, ...]], float] = {}
_observed: dict[tuple[Any, tuple[object, ...]], list[float]] = {}
FLUSH_SECONDS = 1.0


def count(metric: Counter | Gauge, labels: tuple[object, ...] = (), amount: float = 1.0) -> None:
    """Add ``amount`` to ``metric`` (a counter, or a gauge's change) with these label values, at the next flush."""
    key = (metric, labels)
    _counted[key] = _counted.get(key, 0.0) + amount


def observe(metric: Histogram, labels: tuple[object, ...], value: float) -> None:
    """Observe ``value`` in ``metric`` with these label values, at the next flush."""
    key = (metric, labels)
    values = _observed.get(key)
    if values is None:
        _observed[key] = [value]
    else:
        values.append(value)


def flush() -> None:
    """Move what the request path added up into the metrics."""
    global _counted, _observed
    counted, observed, _counted, _observed = _counted, _observed, {}, {}
    for (metric, labels), amount in counted.items():
        target = metric.labels(*map(str, labels)) if labels else metric
        if amount or isinstance(metric, Counter):
            target.inc(amount)
    for (metric, labels), values in observed.items():
        _observe_all(metric.labels(*map(str, labels)) if labels else metric, values)


def _observe_all(child: Histogram, values: list[float]) -> None:
    bounds, buckets, total = getattr(child, "_upper_bounds", None), getattr(child, "_buckets", None), getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for v in values:  # a prometheus-client without these internals: one at a time
            child.observe(v)
        return
    # What observe() does per value, once per bucket: its bucket counts and the sum.
    per_bucket: dict[int, int] = {}
    for v in values:
        i = bisect.bisect_left(bounds, v)
        per_bucket[i] = per_bucket.get(i, 0) + 1
    total.inc(sum(values))
    for i, n in per_bucket.items():
        buckets[i].inc(n)


async def flush_forever(every: float = FLUSH_SECONDS) -> None:
    """Flush every ``every`` seconds, until cancelled (then once more)."""
    try:
        while True:
            await trio.sleep(every)
            flush()
    finally:
        flush()


class ListenFailed(Exception):
    """An address kfan was told to listen on cannot be bound (in use, not this host's): it cannot serve."""


def registry() -> CollectorRegistry:
    """The registry to serve: all workers' samples in multiprocess mode, else this process's."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg)
        return reg
    return DEFAULT_REGISTRY


async def serve_http(
    host: str,
    port: int,
    ready: Callable[[], bool | tuple[bool, str]],
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve /metrics, /healthz and /readyz until cancelled; reports the bound port."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as e:
        raise ListenFailed(f"cannot serve metrics on {host}:{port} (--metrics-listen): {e}") from None
    bound = listeners[0].socket.getsockname()[1]
    log.info("metrics and health on http://%s:%s/metrics", host, bound)
    reg = registry()

    async def handle(stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(10):
                data = b""
                while b"\r\n\r\n" not in data and len(data) < 8192:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        return
                    data += chunk
                parts = data.split(b"\r\n", 1)[0].split()
                path = parts[1].decode("latin-1").split("?", 1)[0] if len(parts) >= 2 else ""
                if path == "/metrics":
                    flush()  # this process's own sums (workers flush on their own)
                    status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, generate_latest(reg)
                elif path == "/healthz":
                    status, ctype, body = "200 OK", "text/plain", b"ok\n"
                elif path == "/readyz":
                    state = ready()
                    ok, why = state if isinstance(state, tuple) else (state, "ready" if state else "not ready")
                    status, ctype, body = ("200 OK" if ok else "503 Service Unavailable"), "text/plain", f"{why}\n".encode()
                else:
                    status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
                head = f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                await stream.send_all(head.encode("latin-1") + body)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    task_status.started(bound)
    await trio.serve_listeners(handle, listeners)
