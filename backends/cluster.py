"""The control plane: what kfan knows about the cluster and how it keeps it fresh.

Owns kfan's own links to the brokers (separate from client traffic), learns
each broker's API versions at start, keeps the :class:`Topology` fresh
(periodically, and at once when a request hit a leadership error), and caches
group and transaction coordinators (dropped when a coordinator says it no
longer is one).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any

import trio

from proxy import errors, metrics, routing, schema
from proxy.core import Coordinator, SubRequest, advertised_versions
from proxy.headers import request_header_tail, response_body_offset
from proxy.wire import Malformed

from .link import Link, LinkError
from .topology import Topology

log = logging.getLogger("kfan.cluster")

CLIENT_ID = "kfan"
# Versions the control plane speaks when the broker allows (clamped to what it supports).
_PREFERRED = {routing.API_VERSIONS: 2, routing.METADATA: 12, routing.FIND_COORDINATOR: 3}


class ClusterUnavailable(Exception):
    """No bootstrap broker answered."""


class CoordinatorError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"coordinator lookup failed with error {code}")
        self.code = code


class Cluster:
    def __init__(
        self,
        bootstrap: list[tuple[str, int]],
        *,
        refresh_interval: float = 30.0,
        request_timeout: float = 10.0,
        max_frame_bytes: int = 100 * 1024 * 1024,
    ) -> None:
        self.bootstrap = bootstrap
        self.refresh_interval = refresh_interval
        self.request_timeout = request_timeout
        self.max_frame_bytes = max_frame_bytes
        self.topology = Topology()
        self.broker_versions: dict[int, dict[int, tuple[int, int]]] = {}
        self.api_versions: dict[int, tuple[int, int]] = {}
        self.reachable: dict[int, bool] = {}
        self.coordinators: dict[Coordinator, int] = {}
        self.ready = trio.Event()
        self.refreshes = 0
        self.refreshed_at: float | None = None
        self._wake = trio.Event()
        self._refreshed = trio.Event()
        self._links: dict[Any, Link] = {}
        self._nursery: trio.Nursery | None = None
        self._probing: set[int] = set()

    # --- lifecycle -------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._bootstrap()
            self.ready.set()
            task_status.started()
            await self._refresh_loop()

    async def _bootstrap(self) -> None:
        # Until a bootstrap broker answers kfan is alive but not ready
        # (/readyz says 503): keep trying, with backoff, rather than exit.
        delay = 0.2
        while True:
            try:
                await self._bootstrap_once()
                return
            except ClusterUnavailable as e:
                log.warning("%s; retrying in %.1f s", e, delay)
                metrics.REFRESHES.labels("failed").inc()
            await trio.sleep(delay)
            delay = min(delay * 2, 10.0)

    async def _bootstrap_once(self) -> None:
        tried = []
        for i, (host, port) in enumerate(self.bootstrap):
            key = ("bootstrap", i)
            try:
                versions = await self._api_versions(key, host, port)
                metadata = await self._metadata(key, host, port, versions)
            except (LinkError, trio.TooSlowError, OSError) as e:
                tried.append(f"{host}:{port} ({e})")
                log.warning("bootstrap broker %s:%s did not answer: %s", host, port, e)
                continue
            self.topology = Topology().with_metadata(metadata)
            break
        else:
            raise ClusterUnavailable("no bootstrap broker answered: " + "; ".join(tried))
        for node_id, broker in self.topology.brokers.items():
            await self._probe(node_id, broker.host, broker.port)
        self.api_versions = advertised_versions(list(self.broker_versions.values()))
        self._note_absent()
        self.refreshed_at = trio.current_time()
        metrics.REFRESHES.labels("ok").inc()
        up = sorted(k for k, v in self.reachable.items() if v)
        down = sorted(k for k, v in self.reachable.items() if not v)
        log.info("cluster %s: brokers up %s, down %s; %d topics", self.topology.cluster_id, up, down, len(self.topology.leaders))

    async def _refresh_loop(self) -> None:
        self._nursery.start_soon(self._age_loop)
        while True:
            with trio.move_on_after(self.refresh_interval):
                await self._wake.wait()
            self._wake = trio.Event()
            await self._refresh_once()
            await trio.sleep(0.05)  # coalesce bursts of refresh requests

    async def _refresh_once(self) -> None:
        brokers = list(self.topology.brokers.values())
        random.shuffle(brokers)
        brokers.sort(key=lambda b: not self.reachable.get(b.node_id, False))
        for b in brokers:
            try:
                metadata = await self._metadata(b.node_id, b.host, b.port, self.broker_versions.get(b.node_id, {}))
            except (LinkError, trio.TooSlowError, OSError) as e:
                self._set_reachable(b.node_id, False)
                log.info("metadata from broker %s failed: %s", b.node_id, e)
                continue
            self._set_reachable(b.node_id, True)
            self.topology = Topology(topic_ids=self.topology.topic_ids).with_metadata(metadata)
            self.refreshes += 1
            self.refreshed_at = trio.current_time()
            metrics.REFRESHES.labels("ok").inc()
            self._note_absent()
            self._probe_brokers()
            break
        else:
            metrics.REFRESHES.labels("failed").inc()
            log.warning("topology refresh failed: no broker answered")
        done, self._refreshed = self._refreshed, trio.Event()
        done.set()

    def _note_absent(self) -> None:
        """Brokers missing from the metadata (it lists live brokers only) are unreachable."""
        absent = self.topology.absent_leaders()
        for node_id in sorted(absent):
            if self.reachable.get(node_id) is not False:
                log.warning("broker %s leads %d partitions but is not in the cluster's metadata (down?)", node_id, absent[node_id])
        gone = {b for b in self.reachable if b not in self.topology.brokers}
        for node_id in sorted(gone | set(absent)):
            self._set_reachable(node_id, False)

    def _probe_brokers(self) -> None:
        """Ask every known broker for its API versions, in the background: this keeps
        reachability true for each broker (not just the one that answered Metadata),
        and learns the versions of brokers that were down when kfan started."""
        assert self._nursery is not None
        for node_id, broker in self.topology.brokers.items():
            if node_id not in self._probing:
                self._probing.add(node_id)
                self._nursery.start_soon(self._probe, node_id, broker.host, broker.port)

    async def _probe(self, node_id: int, host: str, port: int) -> None:
        """One broker's API versions and reachability (at startup, and after each refresh)."""
        try:
            versions = await self._api_versions(node_id, host, port)
        except (LinkError, trio.TooSlowError, OSError, Malformed) as e:
            if self.reachable.get(node_id) is not False:
                log.warning("broker %s at %s:%s is unreachable: %s", node_id, host, port, e)
            self._set_reachable(node_id, False)
        else:
            if self.broker_versions.get(node_id) != versions:
                self.broker_versions[node_id] = versions
                self.api_versions = advertised_versions(list(self.broker_versions.values()))
            self._set_reachable(node_id, True)
        finally:
            self._probing.discard(node_id)

    async def _age_loop(self) -> None:
        while True:
            metrics.TOPOLOGY_AGE.set(self.topology_age())
            await trio.sleep(1)

    def _set_reachable(self, broker: int, up: bool) -> None:
        if self.reachable.get(broker) != up:
            log.info("broker %s is %s", broker, "reachable" if up else "unreachable")
        self.reachable[broker] = up
        metrics.BROKER_UP.labels(str(broker)).set(1 if up else 0)

    def is_ready(self) -> bool:
        """Topology known and at least one broker reachable."""
        return self.ready.is_set() and any(self.reachable.values())

    def topology_age(self) -> float:
        return trio.current_time() - self.refreshed_at if self.refreshed_at is not None else float("inf")

    def request_refresh(self) -> None:
        self._wake.set()

    async def refresh(self, timeout: float = 5.0) -> None:
        """Ask for a refresh and wait (bounded) until one has completed."""
        waiter = self._refreshed
        self.request_refresh()
        with trio.move_on_after(timeout):
            await waiter.wait()

    # --- what connections ask -------------------------------------------------

    def fold_metadata(self, metadata: Mapping[str, Any]) -> None:
        self.topology = self.topology.with_metadata(metadata)

    def learn(self, coordinators: Mapping[Coordinator, int]) -> None:
        self.coordinators.update(coordinators)

    def forget(self, coordinator: Coordinator) -> None:
        self.coordinators.pop(coordinator, None)

    async def coordinator(self, c: Coordinator) -> int:
        """The broker coordinating a group or transactional id (cached)."""
        node = self.coordinators.get(c)
        if node is not None and node in self.topology.brokers:
            return node
        code = errors.COORDINATOR_NOT_AVAILABLE
        for attempt in range(5):
            try:
                code, node = await self._find_coordinator(c)
            except (LinkError, trio.TooSlowError, OSError) as e:
                log.info("FindCoordinator for %s failed: %s", c, e)
                code, node = errors.COORDINATOR_NOT_AVAILABLE, -1
            if code == errors.NONE and node in self.topology.brokers:
                self.coordinators[c] = node
                return node
            if code not in (errors.COORDINATOR_NOT_AVAILABLE, errors.COORDINATOR_LOAD_IN_PROGRESS, errors.NONE):
                break
            await trio.sleep(0.05 * (attempt + 1))
        raise CoordinatorError(code)

    async def _find_coordinator(self, c: Coordinator) -> tuple[int, int]:
        b = self.any_broker()
        version = self._version(b, routing.FIND_COORDINATOR)
        if version >= 4:
            body = {"key_type": c.key_type, "coordinator_keys": [c.key]}
        else:
            body = {"key": c.key, "key_type": c.key_type}
        resp = await self.call(b, routing.FIND_COORDINATOR, version, body)
        entry = resp["coordinators"][0] if version >= 4 else resp
        return entry["error_code"], entry["node_id"]

    def any_broker(self) -> int:
        """A broker believed reachable (any known one when none is)."""
        brokers = list(self.topology.brokers)
        if not brokers:
            raise LinkError("no broker known")
        up = [b for b in brokers if self.reachable.get(b, True)]
        return random.choice(up or brokers)

    def _version(self, broker: int, api_key: int) -> int:
        lo, hi = self.broker_versions.get(broker, {}).get(api_key, (0, _PREFERRED[api_key]))
        known = schema.known_versions(api_key)
        assert known is not None
        return max(lo, known.start, min(hi, _PREFERRED[api_key]))

    # --- requests over kfan's own links ---------------------------------------------

    def _link(self, key: Any, host: str, port: int) -> Link:
        link = self._links.get(key)
        if link is None or link.failed is not None or link.address != (host, port):
            assert self._nursery is not None
            link = Link(key if isinstance(key, int) else -1, host, port, max_frame_bytes=self.max_frame_bytes)
            self._links[key] = link
            self._nursery.start_soon(link.run)
        return link

    async def call(
        self, broker: Any, api_key: int, version: int, body: Mapping[str, Any], *, address: tuple[str, int] | None = None
    ) -> dict[str, Any]:
        if address is None:
            b = self.topology.brokers[broker]
            address = (b.host, b.port)
        tail = [
            request_header_tail(api_key, version, CLIENT_ID),
            *schema.encode_body(spec := schema.request_spec(api_key, version), {**spec.blank(), **body}),
        ]
        pending = self._link(broker, *address).submit(SubRequest(api_key, version, tail, True))
        with trio.fail_after(self.request_timeout):
            payload = await pending.wait()
        spec = schema.response_spec(api_key, version)
        return schema.decode_body(spec, payload, response_body_offset(payload, api_key, version), allow_trailing=True)

    async def _api_versions(self, key: Any, host: str, port: int) -> dict[int, tuple[int, int]]:
        resp = await self.call(key, routing.API_VERSIONS, _PREFERRED[routing.API_VERSIONS], {}, address=(host, port))
        if resp["error_code"] != 0:
            raise LinkError(f"ApiVersions from {host}:{port} failed with error {resp['error_code']}")
        return {a["api_key"]: (a["min_version"], a["max_version"]) for a in resp["api_keys"]}

    async def _metadata(self, key: Any, host: str, port: int, versions: Mapping[int, tuple[int, int]]) -> dict[str, Any]:
        lo, hi = versions.get(routing.METADATA, (0, 0))
        version = max(lo, min(hi, _PREFERRED[routing.METADATA]), 1)
        body = {"topics": None, "allow_auto_topic_creation": False}
        return await self.call(key, routing.METADATA, version, body, address=(host, port))
