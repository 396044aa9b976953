"""The audit log's events, as kfan writes them: what a connection and a request say about who did what.

Every event is one JSON object: ``time`` (UTC, ISO 8601), ``event``
(``connection.opened``, ``connection.authenticated``, ``connection.refused``,
``connection.closed``, ``request``), ``connection`` (kfan's id of it),
``client`` (address:port), ``principal`` (as kfan's ACLs name it), and then:

- connection events: ``mechanism``, ``client_id``, ``software_name``,
  ``software_version``, ``reason`` (refused, closed), ``requests`` and
  ``duration_s`` (closed);
- request events: ``api`` (Kafka's name, e.g. ``CreateTopics``), ``api_key``, ``api_version``,
  ``correlation_id``, ``client_id``, ``resources`` (topics, groups,
  transactional ids, the cluster: type, name, operation, and whether it was
  allowed; the first 100), ``errors`` (error code -> entries answered with
  it), ``bytes_in``, ``bytes_out``, ``latency_ms`` and ``authorization``
  (``allowed``, ``denied``: every check failed, ``partial``, or ``none``: kfan
  judged nothing).

Boundaries: names only. Passwords, tokens, SASL bytes and records never reach
an event (nothing here reads them).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.core.acls import Decision
from proxy.kafka.apis import api_name
from proxy.kafka.headers import RequestHeader

MAX_RESOURCES = 100  # per request event: a CreateTopics of 10,000 topics is one event, not a megabyte


def _now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def connection_event(event: str, connection: int, client: str, principal: str | None, **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "time": _now(),
        "event": f"connection.{event}",
        "connection": connection,
        "client": client,
        "principal": principal,
    }
    out.update({k: v for k, v in fields.items() if v is not None})
    return out


def request_event(
    hdr: RequestHeader,
    connection: int,
    client: str,
    principal: str | None,
    decisions: Sequence[Decision],
    judged: bool,
    errors: Mapping[tuple[int, int], int],
    bytes_in: int,
    bytes_out: int,
    latency_s: float,
) -> dict[str, Any]:
    """``judged``: the decisions are the ACLs' (else they only name the resources)."""
    resources = [
        {"type": d.resource_type.name, "name": d.name, "operation": d.operation.name, **({"allowed": d.allowed} if judged else {})}
        for d in decisions[:MAX_RESOURCES]
    ]
    codes: Counter[int] = Counter()
    for (code, _), n in errors.items():
        codes[code] += n
    if not judged:
        authorization = "none"
    elif all(d.allowed for d in decisions):
        authorization = "allowed"
    else:
        authorization = "denied" if not any(d.allowed for d in decisions) else "partial"
    event: dict[str, Any] = {
        "time": _now(),
        "event": "request",
        "connection": connection,
        "client": client,
        "principal": principal,
        "client_id": hdr.client_id,
        "api": api_name(hdr.api_key),
        "api_key": hdr.api_key,
        "api_version": hdr.api_version,
        "correlation_id": hdr.correlation_id,
        "resources": resources,
        "errors": {str(code): n for code, n in sorted(codes.items())},
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "latency_ms": round(latency_s * 1000, 3),
        "authorization": authorization,
    }
    if len(decisions) > MAX_RESOURCES:
        event["resources_omitted"] = len(decisions) - MAX_RESOURCES
    return event
