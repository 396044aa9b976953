"""A client request planned with what its plan needs learned first (trio).

:meth:`Planner.plan` runs the pure core (:func:`proxy.core.plan_request`)
with this connection's :class:`~proxy.core.Context`. A plan naming topics the
topology does not know waits for one refresh (topics created since the last
one: a broker would know them) and is planned again; a batch naming groups
or transactions kfan has not seen waits for one bulk coordinator lookup.
It waits in the connection's reader on purpose: later requests wait with
it, so each broker gets this client's requests in the client's order.

Boundaries: it decides nothing about the request (the core does). A request
kfan cannot plan raises :class:`Unanswerable`, which ends the connection, as
a broker closes on a request it cannot read.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import trio

from backends.cluster import Cluster
from backends.links import LinkPool
from proxy.core import ClosesConnection, Context, Forward, Identity, LocalReply, NeedCoordinators, Plan, Unsupported, plan_request
from proxy.core.acls import Access
from proxy.core.routes import ROUTES
from proxy.kafka import apis
from proxy.kafka.headers import parse_request_header, peek_request
from proxy.kafka.schema import decode_body, request_spec
from proxy.kafka.wire import Malformed
from proxy.runtime.telemetry import ClientTelemetry, TelemetryClient
from proxy.server.fetches import Fetches
from proxy.server.governance import ClientGovernance
from proxy.server.quotas import ClientThrottle

log = logging.getLogger("kfan.connection")


# What client telemetry answers of a connection's requests.
_TELEMETRY_SEEN = frozenset({apis.GET_TELEMETRY_SUBSCRIPTIONS, apis.PUSH_TELEMETRY})


def _no_cap(client_id: str | None) -> None:
    return None


class Unanswerable(Exception):
    """This request ends its connection (``reason``: why, for the metrics; it was logged where raised)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Planner:
    """Plans one client connection's requests, from its context (its watermarks, its coordinator view)."""

    def __init__(
        self,
        cluster: Cluster,
        links: LinkPool,
        identity: Identity,
        fetches: Fetches,
        client: int,
        validate_records: bool = True,
        fetch_ahead_bytes: int = 0,
        client_identity: bool = False,
        telemetry: ClientTelemetry | None = None,
        principal: Callable[[], str] = str,
        governed: ClientGovernance | None = None,
        throttle: ClientThrottle | None = None,
    ) -> None:
        """``governed``: how the client's requests are judged (``--authorizer acls``; the ACLs may be reloaded
        between requests) and whether the resources each names are wanted (the audit log); ``throttle``: its quotas."""
        self.cluster = cluster
        self.links = links
        self.identity = identity
        self.fetches = fetches
        self.client = client  # the connection's id, for the log
        self.validate_records = validate_records
        self.fetch_ahead_bytes = fetch_ahead_bytes
        self.client_identity = client_identity
        self.telemetry = telemetry
        self.principal = principal
        self.access: Callable[[], Access | None] = governed.access if governed is not None else lambda: None
        audit = governed.audit if governed is not None else None
        # Only the audited APIs' resources are named (by default not the data path's: no cost per Produce).
        self.record_resources = frozenset(k for k in ROUTES if audit.audits(k)) if audit is not None else frozenset()
        self.audited = audit is not None
        self.software = ("", "")  # the client's software name and version, from its ApiVersions (v3+)
        self.fetch_quota_bytes: Callable[[str | None], int | None] = throttle.fetch_cap if throttle is not None else _no_cap

    async def plan(self, payload: bytes | memoryview) -> tuple[Context, LocalReply | Forward]:
        """Plan one request (the context it was planned with too); raises :class:`Unanswerable`."""
        try:
            return await self._plan(payload)
        except ClosesConnection as e:
            key, version, cid = peek_request(payload)
            log.info("client %s: closing on request api_key=%s v%s correlation_id=%s: %s", self.client, key, version, cid, e)
            raise Unanswerable(str(e)) from e
        except (Malformed, Unsupported) as e:
            key, version, cid = peek_request(payload)
            log.warning("client %s: closing on request api_key=%s v%s correlation_id=%s: %s", self.client, key, version, cid, e)
            raise Unanswerable("malformed" if isinstance(e, Malformed) else "unsupported") from e
        except Exception as e:
            key, version, cid = peek_request(payload)
            log.error(
                "client %s: unexpected error planning api_key=%s v%s correlation_id=%s", self.client, key, version, cid, exc_info=True
            )
            raise Unanswerable("internal_error") from e

    async def _plan(self, payload: bytes | memoryview) -> tuple[Context, LocalReply | Forward]:
        if (self.telemetry is not None or self.audited) and int.from_bytes(payload[:2], "big") == apis.API_VERSIONS:
            self._read_software(payload)  # what telemetry subscriptions match on, and the audit log reports
        if self.telemetry is not None and (answered := self._telemetry(payload)) is not None:
            return self._context(), answered
        plan: Plan = plan_request(ctx := self._context(), payload)
        if isinstance(plan, LocalReply | Forward) and plan.unknown_topics:
            # Topics created since the last refresh: a broker would know them.
            await self.cluster.refresh(timeout=2.0)
            plan = plan_request(ctx := self._context(), payload)
        if isinstance(plan, NeedCoordinators):
            # A batch naming groups or transactions kfan has not seen: one bulk lookup, then plan by broker.
            await self.links.coordinators.find(plan.coordinators)
            plan = plan_request(ctx := self._context(coordinators_looked_up=True), payload)
        assert not isinstance(plan, NeedCoordinators)
        return ctx, plan

    def _read_software(self, payload: bytes | memoryview) -> None:
        """The client's software name and version, from its ApiVersions (v3+)."""
        hdr = parse_request_header(payload)
        if hdr.known and hdr.api_version >= 3:
            try:
                request = decode_body(request_spec(hdr.api_key, hdr.api_version), payload, hdr.body_offset, allow_trailing=True)
                self.software = (request["client_software_name"], request["client_software_version"])
            except (Malformed, KeyError):
                pass  # answered as any ApiVersions kfan cannot read

    def _telemetry(self, payload: bytes | memoryview) -> LocalReply | None:
        """Client telemetry (KIP-714), answered by kfan's; None for any other request."""
        assert self.telemetry is not None
        if int.from_bytes(payload[:2], "big") not in _TELEMETRY_SEEN:
            return None  # the header is parsed once, by the planning that follows
        hdr = parse_request_header(payload)
        route = ROUTES.get(hdr.api_key)
        if route is None or not route.telemetry or not hdr.known:
            return None
        served = self.cluster.api_versions.get(hdr.api_key)
        if served is None or not served[0] <= hdr.api_version <= served[1]:
            return None  # planning refuses it
        request = decode_body(request_spec(hdr.api_key, hdr.api_version), payload, hdr.body_offset, allow_trailing=True)
        if hdr.api_key == apis.PUSH_TELEMETRY:
            body = self.telemetry.push(hdr.api_version, request)
        else:
            client = TelemetryClient(hdr.client_id or "", *self.software, self.principal())
            body = self.telemetry.get_subscriptions(hdr.api_version, request, client)
        return LocalReply(hdr, True, body, cost=len(payload))

    def _context(self, coordinators_looked_up: bool = False) -> Context:
        cluster = self.cluster
        return Context(
            self.identity,
            cluster.topology,
            cluster.api_versions,
            self.links.coordinators.known,  # kfan's shared view, or this connection's own (its client's identity)
            coordinators_looked_up,
            self.fetches.watermarks,
            self.validate_records,
            self.fetch_ahead_bytes,
            cluster.rack,
            # One clock reading per request, not one per partition it names.
            functools.partial(cluster.read_replicas.get, now=trio.current_time()),
            self.client_identity,
            self.fetches.share_sessions,
            cluster.features,
            self.access(),
            record_resources=self.record_resources,
            auto_create_topics=cluster.auto_create_topics,
            fetch_quota_bytes=self.fetch_quota_bytes,
        )
