"""The control plane: what kfan knows about the cluster and how it keeps it fresh.

Owns kfan's own links to the brokers (separate from client traffic), learns
each broker's API versions at start, keeps the :class:`Topology` fresh
(periodically, and at once when a request hit a leadership error), and caches
group and transaction coordinators (bounded, expiring, and dropped when a
coordinator says it no longer is one).

Brokers are not trusted: any answer may fail to decode, name no broker, or
never come. The control plane then keeps its last good topology, falls back
to the bootstrap list when it knows no broker, and retries with backoff; the
answers themselves are read by the pure ``read_*`` functions below, which
raise only :class:`Malformed`.
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import trio

from proxy import metrics
from proxy.core import (
    Coordinator,
    Effect,
    FoldMetadata,
    ForgetCoordinators,
    LearnCoordinators,
    RefreshTopology,
    SubRequest,
    advertised_versions,
)
from proxy.core.topology import Topology
from proxy.kafka import apis, errors, schema
from proxy.kafka.headers import decode_response, request_header_tail
from proxy.kafka.wire import Malformed

from .link import Link, LinkError

log = logging.getLogger("kfan.cluster")

# What a control-plane request can end in, short of an answer kfan can use.
_ANSWER_FAILURES = (LinkError, trio.TooSlowError, OSError, Malformed)

CLIENT_ID = "kfan"
# Versions the control plane speaks when the broker allows (clamped to what it supports).
_PREFERRED = {apis.API_VERSIONS: 2, apis.METADATA: 12, apis.FIND_COORDINATOR: 3}


# Keys per batched FindCoordinator request.
_FIND_BATCH = 1000
# Coordinators cached per group or transactional id: clients choose the ids,
# so the cache is bounded (least recently used goes) and entries expire.
MAX_COORDINATORS = 10_000
COORDINATOR_TTL = 300.0


def _decode(api_key: int, version: int, payload: bytes | memoryview) -> dict[str, Any]:
    return decode_response(payload, api_key, version)


def read_api_versions(payload: bytes | memoryview, version: int) -> dict[int, tuple[int, int]]:
    """A broker's ApiVersions answer: api key -> (min, max) version. Raises only :class:`Malformed`."""
    resp = _decode(apis.API_VERSIONS, version, payload)
    if resp["error_code"] != 0:
        raise Malformed(f"ApiVersions answered error {resp['error_code']}")
    return {a["api_key"]: (a["min_version"], a["max_version"]) for a in resp["api_keys"] if a["min_version"] <= a["max_version"]}


def read_metadata(payload: bytes | memoryview, version: int) -> dict[str, Any]:
    """A Metadata answer, with broker entries kfan could not connect to left out. Raises only :class:`Malformed`."""
    resp = _decode(apis.METADATA, version, payload)
    resp["brokers"] = [b for b in resp["brokers"] if b["node_id"] >= 0 and b["host"] and 0 < b["port"] < 65536]
    return resp


def read_coordinators(payload: bytes | memoryview, version: int) -> dict[str, tuple[int, int]]:
    """Key -> (error code, node id) of a batched (v4+) FindCoordinator answer. Raises only :class:`Malformed`."""
    resp = _decode(apis.FIND_COORDINATOR, version, payload)
    return {e["key"]: (e["error_code"], e["node_id"]) for e in resp["coordinators"]}


def read_coordinator(payload: bytes | memoryview, version: int, key_type: int, key: str) -> tuple[int, int]:
    """(error code, node id) of a FindCoordinator answer for ``key``. Raises only :class:`Malformed`."""
    if version < 4:
        resp = _decode(apis.FIND_COORDINATOR, version, payload)
        return resp["error_code"], resp["node_id"]
    found = read_coordinators(payload, version).get(key)
    if found is None:
        raise Malformed(f"FindCoordinator answer does not name {key!r}")
    return found


def control_version(api_key: int, versions: Mapping[int, tuple[int, int]]) -> int:
    """The version the control plane speaks: its preferred one, within what the broker
    says it serves and what kfan has schemas for (a broker's odd ranges cannot push it out)."""
    known = schema.known_versions(api_key)
    assert known is not None
    lo, hi = versions.get(api_key, (known.start, _PREFERRED[api_key]))
    version = max(lo, min(hi, _PREFERRED[api_key]))
    if api_key == apis.METADATA:
        version = max(version, 1)  # v0 cannot ask for every topic
    return min(max(version, known.start), known.stop - 1)


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
        self.coordinators: OrderedDict[Coordinator, tuple[int, float]] = OrderedDict()  # -> (node id, learned at)
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
            except Exception:
                log.exception("bootstrap failed unexpectedly; retrying in %.1f s", delay)
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
            except _ANSWER_FAILURES as e:
                tried.append(f"{host}:{port} ({e})")
                log.warning("bootstrap broker %s:%s did not answer: %s", host, port, e)
                continue
            if not metadata["brokers"]:
                tried.append(f"{host}:{port} (its metadata lists no broker)")
                log.warning("bootstrap broker %s:%s lists no broker in its metadata", host, port)
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
        assert self._nursery is not None
        self._nursery.start_soon(self._age_loop)
        retry = 0.5
        wait = self.refresh_interval
        while True:
            with trio.move_on_after(wait):
                await self._wake.wait()
            self._wake = trio.Event()
            try:
                ok = await self._refresh_once()
            except Exception:
                # The control plane outlives any answer: whatever went wrong,
                # keep the last good topology and try again.
                log.exception("topology refresh failed unexpectedly")
                ok = False
            finally:
                done, self._refreshed = self._refreshed, trio.Event()
                done.set()
            # After a failure, try again sooner, backing off up to the usual interval.
            wait = self.refresh_interval if ok else min(retry, self.refresh_interval)
            retry = 0.5 if ok else min(retry * 2, 30.0)
            await trio.sleep(0.05)  # coalesce bursts of refresh requests

    async def _refresh_once(self) -> bool:
        """One topology refresh from the first broker that answers; False when none did."""
        brokers = list(self.topology.brokers.values())
        random.shuffle(brokers)
        brokers.sort(key=lambda b: not self.reachable.get(b.node_id, False))
        candidates: list[tuple[Any, str, int]] = [(b.node_id, b.host, b.port) for b in brokers]
        # Every known broker failed (or none is known): the bootstrap list may still answer.
        candidates += [(("bootstrap", i), host, port) for i, (host, port) in enumerate(self.bootstrap)]
        for key, host, port in candidates:
            node = key if isinstance(key, int) else None
            try:
                versions = self.broker_versions.get(node, {}) if node is not None else await self._api_versions(key, host, port)
                metadata = await self._metadata(key, host, port, versions)
            except _ANSWER_FAILURES as e:
                if node is not None:
                    self._set_reachable(node, False)
                log.info("metadata from %s at %s:%s failed: %s", key, host, port, e)
                continue
            if not metadata["brokers"]:
                # An answer naming no broker cannot be routed by: keep what we know.
                log.warning("metadata from %s at %s:%s lists no broker; keeping the last topology", key, host, port)
                continue
            if node is not None:
                self._set_reachable(node, True)
            self.topology = Topology(topic_ids=self.topology.topic_ids).with_metadata(metadata)
            self.refreshes += 1
            self.refreshed_at = trio.current_time()
            metrics.REFRESHES.labels("ok").inc()
            self._note_absent()
            self._probe_brokers()
            return True
        metrics.REFRESHES.labels("failed").inc()
        log.warning("topology refresh failed: no broker answered")
        return False

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
        except _ANSWER_FAILURES as e:
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

    def apply(self, effects: Iterable[Effect]) -> None:
        """Do what a merge asked of the cluster (the connection's own effects are ignored)."""
        for effect in effects:
            if isinstance(effect, FoldMetadata):
                self.fold_metadata(effect.metadata)
            elif isinstance(effect, LearnCoordinators):
                self.learn(effect.coordinators)
            elif isinstance(effect, ForgetCoordinators):
                for c in effect.coordinators:
                    self.forget(c)
            elif isinstance(effect, RefreshTopology):
                self.request_refresh()

    def fold_metadata(self, metadata: Mapping[str, Any]) -> None:
        if metadata["brokers"]:  # an answer naming no broker would leave nothing to route to
            self.topology = self.topology.with_metadata(metadata)

    def learn(self, coordinators: Mapping[Coordinator, int]) -> None:
        now = trio.current_time()
        for c, node in coordinators.items():
            self.coordinators[c] = (node, now)
            self.coordinators.move_to_end(c)
        while len(self.coordinators) > MAX_COORDINATORS:
            self.coordinators.popitem(last=False)

    def forget(self, coordinator: Coordinator) -> None:
        self.coordinators.pop(coordinator, None)

    def known_coordinator(self, c: Coordinator) -> int | None:
        """The cached coordinator of a group or transactional id, if fresh and among the brokers."""
        entry = self.coordinators.get(c)
        if entry is None:
            return None
        node, learned_at = entry
        if node not in self.topology.brokers or trio.current_time() - learned_at > COORDINATOR_TTL:
            del self.coordinators[c]
            return None
        self.coordinators.move_to_end(c)
        return node

    async def coordinator(self, c: Coordinator) -> int:
        """The broker coordinating a group or transactional id (cached)."""
        node = self.known_coordinator(c)
        if node is not None:
            return node
        code = errors.COORDINATOR_NOT_AVAILABLE
        for attempt in range(5):
            try:
                code, node = await self._find_coordinator(c)
            except _ANSWER_FAILURES as e:
                log.info("FindCoordinator for %s failed: %s", c, e)
                code, node = errors.COORDINATOR_NOT_AVAILABLE, -1
            if code == errors.NONE and node in self.topology.brokers:
                self.learn({c: node})
                return node
            if code not in (errors.COORDINATOR_NOT_AVAILABLE, errors.COORDINATOR_LOAD_IN_PROGRESS, errors.NONE):
                break
            await trio.sleep(0.05 * (attempt + 1))
        raise CoordinatorError(code)

    async def find_coordinators(self, keys: Iterable[Coordinator]) -> None:
        """Look up many coordinators at once, within one request timeout, and learn those found.

        With FindCoordinator v4+ the keys go in batches; older brokers are asked
        one key at a time, each once. What is not found in time stays unknown.
        """
        by_type: dict[int, list[str]] = {}
        for c in keys:
            if self.known_coordinator(c) is None:
                by_type.setdefault(c.key_type, []).append(c.key)
        with trio.move_on_after(self.request_timeout):
            for key_type, names in by_type.items():
                broker = self.any_broker()
                if broker is None:
                    return
                version = self._version(broker, apis.FIND_COORDINATOR)
                if version < 4:
                    for name in names:
                        try:
                            code, node = await self._find_coordinator(Coordinator(key_type, name))
                        except _ANSWER_FAILURES as e:
                            log.info("FindCoordinator for %r failed: %s", name, e)
                            continue
                        if code == errors.NONE and node in self.topology.brokers:
                            self.learn({Coordinator(key_type, name): node})
                    continue
                for start in range(0, len(names), _FIND_BATCH):
                    body = {"key_type": key_type, "coordinator_keys": names[start : start + _FIND_BATCH]}
                    try:
                        found = read_coordinators(await self.call(broker, apis.FIND_COORDINATOR, version, body), version)
                    except _ANSWER_FAILURES as e:
                        log.info("FindCoordinator for %d keys failed: %s", len(body["coordinator_keys"]), e)
                        continue
                    self.learn(
                        {
                            Coordinator(key_type, key): node
                            for key, (code, node) in found.items()
                            if code == errors.NONE and node in self.topology.brokers
                        }
                    )

    async def _find_coordinator(self, c: Coordinator) -> tuple[int, int]:
        b = self.any_broker()
        if b is None:
            raise LinkError("no broker known")
        version = self._version(b, apis.FIND_COORDINATOR)
        if version >= 4:
            body = {"key_type": c.key_type, "coordinator_keys": [c.key]}
        else:
            body = {"key": c.key, "key_type": c.key_type}
        payload = await self.call(b, apis.FIND_COORDINATOR, version, body)
        return read_coordinator(payload, version, c.key_type, c.key)

    def any_broker(self, exclude: int | None = None) -> int | None:
        """A broker believed reachable (any known one when none is), other than ``exclude``; None when there is none."""
        brokers = [b for b in self.topology.brokers if b != exclude]
        if not brokers:
            return None
        up = [b for b in brokers if self.reachable.get(b, True)]
        return random.choice(up or brokers)

    def _version(self, broker: int, api_key: int) -> int:
        return control_version(api_key, self.broker_versions.get(broker, {}))

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
    ) -> bytes:
        """The answer's payload (its decoding is the caller's: the ``read_*`` functions)."""
        if address is None:
            b = self.topology.brokers.get(broker)
            if b is None:
                raise LinkError(f"broker {broker} is not in the topology")
            address = (b.host, b.port)
        tail = [
            request_header_tail(api_key, version, CLIENT_ID),
            *schema.encode_body(spec := schema.request_spec(api_key, version), {**spec.blank(), **body}),
        ]
        link = self._link(broker, *address)
        pending = link.submit(SubRequest(api_key, version, tail, True))
        try:
            with trio.fail_after(self.request_timeout):
                return await pending.wait()
        except trio.TooSlowError:
            link.close()  # hung, or stalled mid-answer: the next call opens a fresh link
            raise

    async def _api_versions(self, key: Any, host: str, port: int) -> dict[int, tuple[int, int]]:
        version = _PREFERRED[apis.API_VERSIONS]
        return read_api_versions(await self.call(key, apis.API_VERSIONS, version, {}, address=(host, port)), version)

    async def _metadata(self, key: Any, host: str, port: int, versions: Mapping[int, tuple[int, int]]) -> dict[str, Any]:
        version = control_version(apis.METADATA, versions)
        body = {"topics": None, "allow_auto_topic_creation": False}
        return read_metadata(await self.call(key, apis.METADATA, version, body, address=(host, port)), version)
