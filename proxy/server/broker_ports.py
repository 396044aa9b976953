"""One port per broker id (``--broker-ids cluster --broker-port-base BASE``): broker N is shown, and served, at BASE+N.

Some clients tell brokers apart by address, not by node id: librdkafka 2.0
(Debian's kcat) keeps one connection for every broker listed at the same
host and port, and moves it from one node id to the next, so it fetches from
one broker only. Given a port of its own, each broker id gets its own
connection. Every port serves exactly what kfan's own port serves (kfan
routes each request by the real leaders, whichever port it came in on); the
port only tells the client which broker it believes it reaches.

The ports of the brokers kfan knows at start are bound before kfan says it
serves (a port that cannot be bound stops it, as ``--listen`` does); a broker
that joins later gets its port once kfan's topology names it (a client that
learns of it first retries its connection, as it does for a broker starting).
"""

from __future__ import annotations

import logging

import trio

from backends.backoff import FAILURE_LOG_INTERVAL_S
from backends.cluster import Cluster
from proxy.core.advertised import MAX_PORT
from proxy.runtime import metrics
from proxy.server.accept import Handler, listen, serve_listener

log = logging.getLogger("kfan.server")

CHECK_INTERVAL_S = 1.0  # how soon a broker that joins gets its port


class BrokerPorts:
    def __init__(self, host: str, base: int, reuse_port: bool, cluster: Cluster) -> None:
        self.host = host
        self.base = base
        self.reuse_port = reuse_port
        self.cluster = cluster
        self.listeners: dict[int, trio.SocketListener | None] = {}  # None: its port could not be bound (logged once)
        self._new: list[trio.SocketListener] = []  # bound, not accepting yet

    async def open_known(self) -> None:
        """Bind the port of every broker kfan knows now; raises :class:`~proxy.runtime.metrics.ListenFailed`."""
        await self._open(strict=True)

    async def serve(self, handler: Handler, clients: trio.Nursery) -> None:
        """Accept on every broker's port, opening the ports of brokers that join, until cancelled."""
        async with trio.open_nursery() as nursery:
            while True:
                for listener in self._new:
                    nursery.start_soon(serve_listener, handler, listener, clients, FAILURE_LOG_INTERVAL_S)
                self._new = []
                await trio.sleep(CHECK_INTERVAL_S)
                await self._open(strict=False)

    async def _open(self, strict: bool) -> None:
        for node in sorted(self.cluster.topology.brokers):
            if node in self.listeners:
                continue
            port = self.base + node
            if node < 0 or port > MAX_PORT:
                log.error("broker %s cannot have a port of its own (%s + %s > %s): clients reach it at kfan's own port",
                          node, self.base, node, MAX_PORT)  # fmt: skip
                self.listeners[node] = None
                continue
            try:
                listener = await listen(self.host, port, self.reuse_port, "--broker-port-base")
            except metrics.ListenFailed as e:
                if strict:
                    raise
                log.error("broker %s: %s; clients told of that port cannot reach it", node, e)
                self.listeners[node] = None
                continue
            log.info("broker %s served at %s:%s", node, self.host, port)
            self.listeners[node] = listener
            self._new.append(listener)
