"""The kfan server: the control plane, the client listener, metrics, and a graceful stop.

Startup order matters to operators: the metrics listener comes first (so
/healthz answers and /readyz says 503 while no broker has answered), then the
cluster bootstrap, then the client listener. Stopping is the reverse: stop
accepting, let every connection answer the requests it has read, close.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import random
import resource
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from prometheus_client import REGISTRY

from backends.cluster import Cluster
from proxy.capture.recorder import Capture, CaptureConfig
from proxy.core import Identity
from proxy.runtime import mapped, metrics
from proxy.runtime.budget import MemoryPool
from proxy.runtime.telemetry import ClientTelemetry
from proxy.server.accept import listen, serve_listeners
from proxy.server.admission import serve_client
from proxy.server.audit_topic import TopicSink
from proxy.server.broker_ports import BrokerPorts
from proxy.server.connection import Limits
from proxy.server.governance import Governance
from proxy.server.prelogin import PreLogin
from proxy.server.quotas import Quotas
from proxy.server.registry import Connections
from proxy.server.reload import Reloader
from proxy.server.security_options import Security

log = logging.getLogger("kfan.server")


@dataclass(frozen=True)
class ServerConfig:
    bootstrap: list[tuple[str, int]]
    listen: tuple[str, int] = ("127.0.0.1", 9092)
    advertise: tuple[str, int] | None = None  # defaults to the listen address
    node_id: int = 0
    cluster_ids: bool = False  # --broker-ids cluster
    broker_port_base: int = 0  # --broker-port-base: broker N also at BASE+N
    metadata_refresh_s: float = 30.0
    rack: str = ""  # kfan's own zone (--rack): sub-fetches carry it, to be served by replicas there
    read_replica_max_age_s: float = 300.0
    limits: Limits = field(default_factory=Limits)
    metrics_listen: tuple[str, int] | None = None
    reuse_port: bool = False  # several worker processes share the listen port
    shutdown_timeout_s: float = 25.0
    drain_period_s: float = 0.0  # on SIGTERM, connections closed at safe points spread over this first
    capture: CaptureConfig | None = None
    security: Security = field(default_factory=Security)
    telemetry: ClientTelemetry | None = None  # client telemetry subscriptions (KIP-714), when configured
    governance: Governance = field(default_factory=Governance)  # the ACLs kfan authorizes with, the audit log
    quotas: Quotas | None = None  # client quotas this process enforces (--quota-file)


@dataclass
class Live:
    """What a reload may change: each new connection is served with what is here when it arrives."""

    limits: Limits
    security: Security
    quotas: Quotas | None
    shutdown_timeout_s: float
    drain_period_s: float = 0.0


@dataclass
class Running:
    """What a started server reports: where it listens and how clients should reach it; what a reload changes."""

    port: int
    identity: Identity
    cluster: Cluster
    metrics_port: int | None = None
    connections: Connections = field(default_factory=Connections)
    governance: Governance | None = None  # SIGHUP re-reads its ACL file and reopens its audit file
    live: Live | None = None
    pool: MemoryPool | None = None  # the logged-in clients' memory
    prelogin: PreLogin | None = None  # the connections not logged in yet
    reloader: Reloader | None = None  # SIGHUP and a changed --config file reload the configuration
    _accepting: trio.CancelScope | None = None

    def reconfigure(self, options: Mapping[str, Any], changed: frozenset[str], limits: Limits, security: Security) -> None:
        """Apply reloaded options (``changed``, by dest), whose files the caller has read and checked, so nothing
        here fails half-way. Limits reach existing connections where safe (:meth:`ClientConnection.reconfigure`),
        TLS and SASL settings the connections that arrive from now on, quotas and ACLs every client's next request;
        the log level, the topology refresh and the shutdown timeout the whole process."""
        live = self.live
        assert live is not None and self.pool is not None and self.prelogin is not None
        if live.limits != limits:
            live.limits = limits
            self.pool.limit = limits.max_buffered_bytes
            self.prelogin.limits = limits.login
            self.prelogin.pool.limit = limits.login.max_bytes
            for conn in self.connections:
                conn.reconfigure(limits)
        live.security = security
        quotas: Path | None = options["quota_file"]
        if "quota_file" in changed:
            if quotas is None:
                if live.quotas is not None:
                    live.quotas.stop()  # no connection's requests are counted against a quota any more
            elif live.quotas is None:
                live.quotas = Quotas(quotas)  # for the connections that arrive from now on
            else:
                live.quotas.switch(quotas)
        elif live.quotas is not None:
            live.quotas.current()  # re-read now if it changed
        if self.governance is not None:
            self.governance.reconfigure(options)
        if "log_level" in changed:
            logging.getLogger().setLevel(getattr(logging, str(options["log_level"]).upper(), logging.INFO))
        self.cluster.refresher.interval = options["metadata_refresh"]
        live.shutdown_timeout_s = options["shutdown_timeout"]
        live.drain_period_s = options["drain_period"]

    async def shutdown(self, timeout: float) -> None:
        """Stop accepting; let connections answer what they have read, up to ``timeout`` seconds."""
        if self._accepting is not None:
            self._accepting.cancel()
        period = self.live.drain_period_s if self.live is not None else 0.0
        if period > 0 and self.connections:
            # One by one, each at a safe point: their clients reconnect to the other replicas spread over the period.
            log.info("stopping: closing %d client connections over %.0f s (--drain-period)", len(self.connections), period)
            now = trio.current_time()
            for conn in self.connections:
                conn.drain(at=now + random.uniform(0, period))
            with trio.move_on_after(period + 1):
                await self.connections.wait_empty()
        log.info("stopping: %d client connections to drain (up to %.0f s)", len(self.connections), timeout)
        self.connections.draining = True
        for conn in self.connections:
            conn.drain()
        with trio.move_on_after(timeout):
            await self.connections.wait_empty()
        if self.connections:
            log.warning("stopping: %d connections still busy after %.0f s, closing them", len(self.connections), timeout)
        else:
            log.info("stopping: every connection drained")


# Descriptors kfan holds for itself: listeners, control-plane links, metrics requests, capture files, logs.
_OWN_FDS = 64
# Logged with the limit: what an operator sizes the hard limit by.
_PER_CLIENT = "each client connection takes one, plus up to two per broker it talks to and one for Metadata others share"


def raise_fd_limit() -> int:
    """Raise this process's soft limit on open descriptors to its hard limit; the soft limit now.

    Every client connection takes one descriptor, and up to two per broker
    it talks to (its links, :mod:`backends.links`): 500 clients of a 3-broker
    cluster need up to 3,500, far past the soft limit of 1024 many Linux
    machines start processes with. Only the hard limit is the operator's
    choice (as Kafka's own brokers, kfan should run with a high one); the
    soft limit is the process's own to raise.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Linux refuses a soft limit above fs.nr_open even when the hard one is "unlimited".
    target = hard if hard != resource.RLIM_INFINITY else _nr_open()
    if soft == resource.RLIM_INFINITY or soft >= target:
        log.info("open files: limit %s; %s", _limit_text(soft), _PER_CLIENT)
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as e:
        log.warning("open files: could not raise the soft limit %d to %d (%s); %s", soft, target, e, _PER_CLIENT)
        return soft
    log.info("open files: soft limit raised from %d to %d (the hard limit); %s", soft, target, _PER_CLIENT)
    return target


def check_fd_capacity(limit: int, brokers: int, max_connections: int) -> int:
    """How many client connections the descriptor limit holds at worst; a warning when fewer than --max-connections.

    Past the limit nothing crashes, but clients are served worse: accepting
    waits (connections queue in the listen backlog), a broker link that cannot
    open fails its request with a retriable error, a Metadata request whose
    link fails closes its connection. Better said once at startup.
    """
    if limit == resource.RLIM_INFINITY or brokers < 1:
        return max_connections
    per_client = 2 + 2 * brokers  # its socket, MAIN and FETCH to each broker, SHARED to one (backends.links)
    fits = max(0, (limit - _OWN_FDS) // per_client)
    if fits < max_connections:
        # INFO, not WARNING: with the defaults (10,000 connections) nearly every host would warn at every start.
        log.info(
            "open files: the limit %d holds about %d client connections using all %d brokers (up to %d descriptors each), "
            "fewer than --max-connections %d: raise the hard limit (ulimit -Hn, systemd LimitNOFILE=) or lower --max-connections",
            limit,
            fits,
            brokers,
            per_client,
            max_connections,
        )
    return fits


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1024 * 1024  # Linux's default fs.nr_open


def _limit_text(n: int) -> str:
    return "unlimited" if n == resource.RLIM_INFINITY else str(n)


def give_freed_frames_back() -> None:
    """Keep large blocks (frames, brokers' answers) mmapped, so that freeing one gives it back to the system.

    glibc raises its mmap threshold to the size of the largest block freed (up
    to 32 MiB): after one burst of 12 MiB Fetch answers, later ones came from
    the heap, and kfan's resident memory stayed 60-90 MiB above its level at
    rest after the attack was over. A fixed threshold (which also stops the
    raising) keeps RSS returning to that level. Not glibc: nothing to do.
    """
    try:
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, 1024 * 1024)
    except (OSError, AttributeError):
        pass


_M_MMAP_THRESHOLD = -3  # glibc's <malloc.h>


async def serve(config: ServerConfig, task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED) -> None:
    fd_limit = raise_fd_limit()
    give_freed_frames_back()
    cluster = Cluster(
        config.bootstrap,
        refresh_interval=config.metadata_refresh_s,
        max_frame_bytes=config.limits.max_frame_bytes,
        security=config.security.broker,
        rack=config.rack,
        read_replica_max_age=config.read_replica_max_age_s,
        client_logins=config.security.client_auth is not None,
        client_telemetry=config.telemetry is not None,
        judges_clients=config.governance.acl_file is not None,
    )
    for line in config.security.summary:
        log.info("security: %s", line)
    if config.rack:
        log.info(
            "zone-aware fetching: rack %r; a leader's preferred read replica is followed for %.0f s",
            config.rack,
            config.read_replica_max_age_s,
        )
    else:
        log.info("zone-aware fetching: no rack (--rack); clients' own racks are still carried to the brokers")
    if config.telemetry is not None:
        # What clients push is served on /metrics with kfan's own (one process serves it: --workers forks after this).
        with contextlib.suppress(ValueError):  # registered already: a server started again in this process
            REGISTRY.register(config.telemetry)
    async with trio.open_nursery() as nursery:
        metrics_port = None
        if config.metrics_listen is not None:
            metrics_port = await nursery.start(metrics.serve_http, *config.metrics_listen, cluster.readiness)
        await nursery.start(cluster.run)
        nursery.start_soon(metrics.flush_forever)  # the request path's metric updates, added up
        nursery.start_soon(mapped.forget_idle_forever)  # large frames' mappings, kept for reuse, given back when idle
        check_fd_capacity(fd_limit, len(cluster.topology.brokers), config.limits.max_connections)
        capture = Capture(config.capture) if config.capture is not None else None
        if capture is not None:
            nursery.start_soon(capture.run)
        governance = config.governance
        if governance.acl_file is not None:
            nursery.start_soon(governance.acl_file.watch)
        if governance.audit is not None:
            if isinstance(governance.audit.sink, TopicSink):
                governance.audit.sink.cluster = cluster
            nursery.start_soon(governance.audit.run)
        host, port = config.listen
        listener = await listen(host, port, config.reuse_port)
        bound = listener.socket.getsockname()[1]
        adv_host, adv_port = config.advertise or (host, bound)
        if adv_port == 0:
            adv_port = bound
        identity = Identity(config.node_id, adv_host, adv_port, config.cluster_ids, config.broker_port_base)
        broker_ports = BrokerPorts(host, config.broker_port_base, config.reuse_port, cluster) if config.broker_port_base else None
        if broker_ports is not None:
            await broker_ports.open_known()  # before kfan says it serves: clients told of these ports find them
        shown = "the cluster's broker ids" if config.cluster_ids else f"node {config.node_id}"
        log.info("kfan listening on %s:%s, advertised as %s:%s (%s)", host, bound, adv_host, adv_port, shown)
        running = Running(bound, identity, cluster, metrics_port)
        running.live = live = Live(config.limits, config.security, config.quotas, config.shutdown_timeout_s, config.drain_period_s)
        running.pool = pool = MemoryPool(config.limits.max_buffered_bytes)
        running.prelogin = prelogin = PreLogin(config.limits.login)
        governed = governance if governance.acl_file is not None or governance.audit is not None else None
        running.governance = governed

        async def handler(stream: trio.abc.Stream) -> None:
            # Read at each arrival: a reload's settings serve the connections that come after it.
            await serve_client(
                stream,
                cluster=cluster,
                identity=identity,
                limits=live.limits,
                registry=running.connections,
                capture=capture,
                pool=pool,
                prelogin=prelogin,
                tls=live.security.tls,
                auth=live.security.client_auth,
                telemetry=config.telemetry,
                governance=governed,
                quotas=live.quotas,
            )

        task_status.started(running)
        async with trio.open_nursery() as clients:
            with trio.CancelScope() as running._accepting:
                async with trio.open_nursery() as accepting:
                    if broker_ports is not None:
                        accepting.start_soon(broker_ports.serve, handler, clients)
                    await serve_listeners(handler, [listener], handler_nursery=clients)  # trio's, without its log flood at the fd limit
            await trio.aclose_forcefully(listener)
            # Accepting stopped (shutdown): the connections finish in this nursery.
        nursery.cancel_scope.cancel()
