"""One client connection's links to the brokers, and where its sub-requests go.

Each client connection has its own links (a broker answers a connection's
requests in order, and idempotent producers depend on that order per broker),
opened lazily per broker and per :class:`Lane`: Fetch long-polls get a lane
of their own so they never stall the connection's other requests, and so do
share-session requests (KIP-932) and requests whose answers other clients
share (Metadata). A failed
link is replaced on next use, once kfan's backoff from reconnecting to that
broker allows (:mod:`.backoff`). :meth:`LinkPool.resolve` turns a plan's
destination (a broker, a coordinator, any broker) into a broker id.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

import trio

from proxy.core import ANY_BROKER, Coordinator, Destination, Failed
from proxy.core.topology import Broker
from proxy.runtime.budget import Budget
from proxy.security.sasl import Credentials

from . import backoff, transport
from .cluster import Cluster
from .coordinators import CoordinatorError, Coordinators
from .link import Link, LinkError, own_request

# Opens a stream to a broker (TCP by default; tests hand memory streams).
BrokerConnect = Callable[[Broker], Awaitable[trio.abc.Stream]]


class Lane(enum.Enum):
    MAIN = "main"
    FETCH = "fetch"  # long-polls: a lane of their own
    SHARE = "share"  # share sessions' fetches (long-polls too), on the connection the broker ties the session to
    # Requests whose answer other clients' identical requests share (backends.flights): never queued behind this
    # client's requests a broker holds (a Produce awaiting its acks, a JoinGroup), which everyone sharing would wait out.
    SHARED = "shared"


class LinkPool:
    def __init__(
        self,
        cluster: Cluster,
        nursery: trio.Nursery,
        *,
        max_frame_bytes: int,
        keep_requests: bool = False,
        connect: BrokerConnect | None = None,
        credentials: Callable[[], Credentials] | None = None,
        budget: Budget | None = None,
    ) -> None:
        """``credentials``: the client's own, for its links' logins (``--broker-identity client``); else kfan's.

        ``budget``: the client connection's; its links count the answers they hold against it.
        """
        self._budget = budget
        self.cluster = cluster
        self._credentials = credentials
        self._nursery = nursery
        self._max_frame_bytes = max_frame_bytes
        self._keep_requests = keep_requests
        self._connect = connect
        self._links: dict[tuple[int, Lane], Link] = {}
        self._default: int | None = None  # the broker this connection asks when any broker will do
        # Where its coordinators are found: kfan's shared view, or, with the client's identity at the brokers,
        # a view of its own, looked up over its own links (no lookup as kfan on its behalf, nothing shared).
        shared = cluster.coordinators
        self.coordinators: Coordinators = shared if credentials is None else shared.scoped(_AsTheClient(self), scope=object())

    async def resolve(self, destination: Destination) -> int | Failed | None:
        """The broker a destination names; Failed when its coordinator cannot be found; None when no broker is known.

        A coordinator lookup waits here, in the connection's reader: later
        requests wait with it, so requests reach each broker in the client's order.
        """
        if isinstance(destination, Coordinator):
            try:
                return await self.coordinators.coordinator(destination)
            except CoordinatorError as e:
                return Failed(e.code)
        if destination is ANY_BROKER:
            return self.default_broker()
        assert isinstance(destination, int)
        return destination

    def default_broker(self) -> int | None:
        if self._default is None or self._default not in self.cluster.topology.brokers:
            self._default = self.cluster.any_broker()
        return self._default

    def default_failed(self, broker: int) -> None:
        """The default broker failed: pick another next time."""
        if self._default == broker:
            self._default = None

    def another_broker(self, failed: int | None) -> int | None:
        """A broker other than ``failed`` (the new default), for a read-only request asked again."""
        broker = self.cluster.any_broker(exclude=failed)
        if broker is not None:
            self._default = broker
        return broker

    def link(self, broker: int, lane: Lane) -> Link | None:
        """The open link to ``broker`` on ``lane``, opened now if needed; None for a broker not in the
        topology, or one kfan backs off from reconnecting to (:mod:`.backoff`): the request then fails
        with the retriable error of an unreachable broker, as it would have on a new link."""
        link = self._links.get((broker, lane))
        if link is not None and link.failed is None:
            return link
        b = self.cluster.topology.brokers.get(broker)
        if b is None:
            return None
        reconnects = backoff.reconnects()
        attempt = reconnects.attempt((b.host, b.port))
        if attempt is None:
            backoff.backed_off(broker)
            self.default_failed(broker)
            return None
        security = self.cluster.security
        connect = partial(security.connect, b.host, b.port) if self._connect is None else _bound(self._connect, b)
        link = Link(
            broker,
            b.host,
            b.port,
            max_frame_bytes=self._max_frame_bytes,
            keep_requests=self._keep_requests,
            budget=self._budget,
            connect=connect,
            authenticate=security.login(broker, self._credentials),
        )
        if lane is Lane.SHARED:
            self._retire_shared()
        self._links[(broker, lane)] = link
        self._nursery.start_soon(link.run)
        self._nursery.start_soon(transport.settle, attempt, link)
        return link

    async def link_when_ready(self, broker: int, lane: Lane, patience: float = backoff.RECONNECT_BACKOFF_MAX_S * 1.5) -> Link | None:
        """:meth:`link`, but while kfan backs off from reconnecting to ``broker``, wait for the backoff first (at
        most ``patience`` seconds), as a Kafka client holds a request for a node it is reconnecting to: a broker
        just back is then used at once, instead of the request failing for being a moment early."""
        link = self.link(broker, lane)
        deadline = trio.current_time() + patience
        while link is None and (b := self.cluster.topology.brokers.get(broker)) is not None and trio.current_time() < deadline:
            wait = backoff.reconnects().retry_in((b.host, b.port))
            # 0: the backoff is over but another link's attempt is still out; look again shortly.
            await trio.sleep_until(min(deadline, trio.current_time() + max(wait, 0.02)))
            link = self.link(broker, lane)
        return link

    def _retire_shared(self) -> None:
        """A SHARED link opens to a new "any broker": the one to the earlier one closes once its requests are
        answered (within the request timeout), so a client holds one SHARED link, whichever broker it asks."""
        for key in [key for key in self._links if key[1] is Lane.SHARED]:
            old = self._links.pop(key)
            if old.failed is None:
                self._nursery.start_soon(_close_when_answered, old, self.cluster.request_timeout)

    def reauthenticate(self) -> None:
        """The client logged in again: every open link logs in with its new credentials before its next request."""
        for link in self._links.values():
            if link.failed is None:
                link.reauthenticate()

    def close(self, broker: int, lane: Lane) -> None:
        """A hung broker: close its link, so the next request opens a fresh one."""
        link = self._links.get((broker, lane))
        if link is not None:
            link.close()


class _AsTheClient:
    """kfan's lookups for one client connection (FindCoordinator), over that connection's links: the brokers
    see the client's identity, and answer what the client may know."""

    def __init__(self, pool: LinkPool) -> None:
        self._pool = pool

    def any_broker(self) -> int | None:
        return self._pool.default_broker()

    def version_for(self, broker: int, api_key: int) -> int:
        return self._pool.cluster.version_for(broker, api_key)

    async def call(self, broker: int, api_key: int, version: int, body: Mapping[str, Any]) -> bytes:
        link = self._pool.link(broker, Lane.MAIN)
        if link is None:
            raise LinkError(f"broker {broker} cannot be reached now")
        pending = link.submit(own_request(api_key, version, body))
        try:
            with trio.fail_after(self._pool.cluster.request_timeout):
                payload = await pending.wait()
        except trio.TooSlowError:
            pending.abandon()
            self._pool.default_failed(broker)
            raise
        pending.release()
        return payload


async def _close_when_answered(link: Link, patience: float) -> None:
    with trio.move_on_after(patience):
        await link.answered()
    link.close()


def _bound(connect: BrokerConnect, broker: Broker) -> Callable[[], Awaitable[trio.abc.Stream]]:
    async def open_stream() -> trio.abc.Stream:
        return await connect(broker)

    return open_stream
