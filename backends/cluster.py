"""The control plane: what kfan knows about the cluster and how it keeps it fresh.

Learns each broker's API versions and the cluster's features at start (and so what kfan advertises),
keeps the :class:`Topology` fresh (periodically, and at once when a request
hit a leadership error: when and of whom it asks is :class:`Refresher`'s),
knows which brokers are reachable (:class:`Brokers`), and takes in
what merges learned (:mod:`proxy.server.effects` applies their effects). Its own requests go over its own links
(:mod:`.control`); group and transaction coordinators are cached in
:mod:`.coordinators`.

Brokers are not trusted: any answer may fail to decode, name no broker, or
never come. The control plane then keeps its last good topology, falls back
to the bootstrap list when it knows no broker, and retries with backoff.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import trio

from proxy.core import NO_FEATURES, Features, advertised_versions
from proxy.core.local import merged_features
from proxy.core.read_replicas import ReadReplicaKey, ReadReplicas
from proxy.core.topology import Topology
from proxy.kafka import apis
from proxy.kafka.headers import decode_response
from proxy.runtime import metrics

from . import backoff
from .control import ControlLinks, control_version
from .coordinators import ANSWER_FAILURES, CoordinatorCache, Coordinators
from .flights import Flights
from .schemas import SchemaPreloader
from .sequences import ProducerSequences
from .transport import BrokerSecurity

log = logging.getLogger("kfan.cluster")

# How long a broker that left the Metadata is still shown to clients under the cluster's ids (Topology.departed):
# the default metadata.max.age.ms of Kafka's clients, by when every one of them has asked for Metadata again and
# sends nothing more to that id. At most this many are kept (a broker's answer may name any number).
DEPARTED_SHOWN_S = 300.0
MAX_DEPARTED = 1024
RECENT_SNAPSHOTS = 4  # topologies kept to be reused when an answer describes one of them again


class DepartedBrokers:
    """When each of the topology's departed brokers (``Topology.departed``) left: they are forgotten after
    ``DEPARTED_SHOWN_S``, and beyond the ``MAX_DEPARTED`` that left last."""

    def __init__(self) -> None:
        self._since: dict[int, float] = {}

    def aged(self, topology: Topology) -> Topology:
        """``topology``, less the departed brokers shown long enough (or beyond the most kept)."""
        if not topology.departed and not self._since:
            return topology
        now = trio.current_time()
        since = {i: self._since.get(i, now) for i in topology.departed}
        newest = sorted(since, key=since.__getitem__, reverse=True)
        forgotten = {i for n, i in enumerate(newest) if n >= MAX_DEPARTED or now - since[i] > DEPARTED_SHOWN_S}
        self._since = {i: since[i] for i in newest if i not in forgotten}
        return topology.forgetting(forgotten)


class Snapshots:
    """What follows a topology snapshot: departed brokers aged (:class:`DepartedBrokers`), and the same object for
    the same state. Most answers change nothing, and while brokers disagree (a failover) their answers switch
    between a few states: what is kept by snapshot (a captured exchange's topology document) is then made once
    per state, not once per answer."""

    def __init__(self) -> None:
        self._departed = DepartedBrokers()
        self._recent: list[Topology] = []  # newest first

    def following(self, current: Topology, new: Topology) -> Topology:
        """The snapshot to use after ``current`` for ``new``: ``current`` or a recent one when equal to it."""
        new = self._departed.aged(new)
        if new == current:
            return current
        same = next((t for t in self._recent if t == new), None)
        chosen = new if same is None else same
        self._recent = [chosen, *(t for t in self._recent if t is not chosen)][:RECENT_SNAPSHOTS]
        return chosen


class ClusterUnavailable(Exception):
    """No bootstrap broker answered."""


class Brokers:
    """Each broker's reachability and API versions, kept by probing it (ApiVersions)."""

    def __init__(self, control: ControlLinks, versions_changed: Callable[[], None]) -> None:
        self.control = control
        self.versions: dict[int, dict[int, tuple[int, int]]] = {}
        self.features: dict[int, Features] = {}  # the cluster's features, as each broker reported them
        self.nursery: trio.Nursery | None = None  # the cluster's, once it runs
        self.reachable: dict[int, bool] = {}
        self._versions_changed = versions_changed
        self._probing: set[int] = set()

    def note_absent(self, topology: Topology) -> None:
        """Brokers missing from the metadata (it lists live brokers only) are unreachable."""
        absent = topology.absent_leaders()
        for node_id in sorted(absent):
            if self.reachable.get(node_id) is not False:
                log.warning("broker %s leads %d partitions but is not in the cluster's metadata (down?)", node_id, absent[node_id])
        gone = {b for b in self.reachable if b not in topology.brokers}
        for node_id in sorted(gone | set(absent)):
            self.set_reachable(node_id, False)

    def probe_all(self, topology: Topology) -> None:
        """Ask every known broker for its API versions, in the background: this keeps
        reachability true for each broker (not just the one that answered Metadata),
        and learns the versions of brokers that were down when kfan started."""
        assert self.nursery is not None
        for node_id, broker in topology.brokers.items():
            if node_id not in self._probing:
                self._probing.add(node_id)
                self.nursery.start_soon(self.probe, node_id, broker.host, broker.port)

    async def probe(self, node_id: int, host: str, port: int) -> None:
        """One broker's API versions and reachability (at startup, and after each refresh)."""
        try:
            versions, features = await self.control.broker_versions(node_id, host, port)
        except ANSWER_FAILURES as e:
            if self.reachable.get(node_id) is not False:
                log.warning("broker %s at %s:%s is unreachable: %s", node_id, host, port, e)
            self.set_reachable(node_id, False)
        else:
            if self.versions.get(node_id) != versions or self.features.get(node_id) != features:
                self.versions[node_id] = versions
                self.features[node_id] = features
                self._versions_changed()
            self.set_reachable(node_id, True)
        finally:
            self._probing.discard(node_id)

    def set_reachable(self, broker: int, up: bool) -> None:
        if self.reachable.get(broker) != up:
            log.info("broker %s is %s", broker, "reachable" if up else "unreachable")
        self.reachable[broker] = up
        metrics.BROKER_UP.labels(str(broker)).set(1 if up else 0)


class Refresher:
    """When, and of whom, the control plane asks for Metadata.

    At start, the bootstrap brokers in order, until one answers (:meth:`first`).
    Then every ``interval``, at once when asked (:meth:`request`; bursts are
    coalesced) and sooner after a failure (:meth:`run`): the known brokers,
    reachable ones first and otherwise in random order, then the bootstrap
    list again, until one answers. An answer naming no broker counts as none:
    nothing can be routed by it. What an answer means is ``take``'s.
    """

    def __init__(
        self,
        bootstrap: list[tuple[str, int]],
        control: ControlLinks,
        brokers: Brokers,
        interval: float,
        topology: Callable[[], Topology],
        take: Callable[[Mapping[str, Any]], None],
    ) -> None:
        self.bootstrap = bootstrap
        self.interval = interval
        self._control = control
        self._brokers = brokers
        self._topology = topology
        self._take = take
        self._wake = trio.Event()
        self._refreshed = trio.Event()

    async def first(self) -> Mapping[str, Any]:
        """The first bootstrap broker's Metadata that names brokers; :class:`ClusterUnavailable` when none answered so."""
        tried = []
        for i, (host, port) in enumerate(self.bootstrap):
            key = ("bootstrap", i)
            try:
                versions = await self._control.api_versions(key, host, port)
                metadata = await self._control.metadata(key, host, port, versions)
            except ANSWER_FAILURES as e:
                tried.append(f"{host}:{port} ({e})")
                log.warning("bootstrap broker %s:%s did not answer: %s", host, port, e)
                continue
            if not metadata["brokers"]:
                tried.append(f"{host}:{port} (its metadata lists no broker)")
                log.warning("bootstrap broker %s:%s lists no broker in its metadata", host, port)
                continue
            return metadata
        raise ClusterUnavailable("no bootstrap broker answered: " + "; ".join(tried))

    async def run(self) -> None:
        retry = 0.5
        wait = self.interval
        while True:
            with trio.move_on_after(wait):
                await self._wake.wait()
            self._wake = trio.Event()
            try:
                ok = await self._once()
            except Exception:
                # The control plane outlives any answer: whatever went wrong,
                # keep the last good topology and try again.
                log.exception("topology refresh failed unexpectedly")
                ok = False
            finally:
                done, self._refreshed = self._refreshed, trio.Event()
                done.set()
            # After a failure, try again sooner, backing off up to the usual interval.
            wait = self.interval if ok else min(retry, self.interval)
            retry = 0.5 if ok else min(retry * 2, 30.0)
            # Coalesce bursts of refresh requests; after a failure, hear none for up to 1 s (Kafka's
            # clients' retry.backoff.max.ms): in an outage every client request asks for one.
            pause = 0.05 if ok else min(wait, 1.0)
            await trio.sleep(pause)
            wait = max(0.0, wait - pause)

    async def _once(self) -> bool:
        """One topology refresh from the first broker that answers; False when none did."""
        brokers = list(self._topology().brokers.values())
        random.shuffle(brokers)
        reachable = self._brokers.reachable
        brokers.sort(key=lambda b: not reachable.get(b.node_id, False))
        candidates: list[tuple[Any, str, int]] = [(b.node_id, b.host, b.port) for b in brokers]
        # Every known broker failed (or none is known): the bootstrap list may still answer.
        candidates += [(("bootstrap", i), host, port) for i, (host, port) in enumerate(self.bootstrap)]
        for key, host, port in candidates:
            node = key if isinstance(key, int) else None
            try:
                versions = self._brokers.versions.get(node, {}) if node is not None else await self._control.api_versions(key, host, port)
                metadata = await self._control.metadata(key, host, port, versions)
            except ANSWER_FAILURES as e:
                if node is not None:
                    self._brokers.set_reachable(node, False)
                if (left_out := backoff.failure_log().note(("metadata", host, port))) is not None:  # one line per 10 s
                    log.info("metadata from %s at %s:%s failed: %s%s", key, host, port, e, backoff.left_out(left_out))
                continue
            if not metadata["brokers"]:
                # An answer naming no broker cannot be routed by: keep what we know.
                log.warning("metadata from %s at %s:%s lists no broker; keeping the last topology", key, host, port)
                continue
            if node is not None:
                self._brokers.set_reachable(node, True)
            self._take(metadata)
            return True
        metrics.REFRESHES.labels("failed").inc()
        if (left_out := backoff.failure_log().note("refresh")) is not None:
            log.warning("topology refresh failed: no broker answered%s", backoff.left_out(left_out))
        return False

    def request(self) -> None:
        self._wake.set()

    async def wait(self, timeout: float) -> None:
        """Ask for a refresh and wait (bounded) until one has completed."""
        waiter = self._refreshed
        self.request()
        with trio.move_on_after(timeout):
            await waiter.wait()


class Cluster:
    def __init__(
        self,
        bootstrap: list[tuple[str, int]],
        *,
        refresh_interval: float = 30.0,
        request_timeout: float = 10.0,
        max_frame_bytes: int = 100 * 1024 * 1024,
        security: BrokerSecurity | None = None,
        rack: str = "",
        read_replica_max_age: float = 300.0,
        client_logins: bool = False,
        client_telemetry: bool = False,
        judges_clients: bool = False,
    ) -> None:
        """``rack``: kfan's own (--rack); ``read_replica_max_age``: how long a leader's preferred read replica is followed;
        ``client_logins``: kfan authenticates its clients, so it advertises the login APIs, which it answers itself."""
        self.rack = rack
        # Process-wide: one leader's answer serves every client of that rack.
        self.read_replicas = ReadReplicas(read_replica_max_age)
        # Process-wide too: identical Metadata requests out at once are sent once (a client storm is not multiplied).
        self.flights = Flights()
        self.sequences = ProducerSequences()  # and an idempotent producer's batches keep their order across connections
        self.problem: str | None = None  # why kfan is not ready, for /readyz
        self.security = security if security is not None else BrokerSecurity()
        self.request_timeout = request_timeout
        self.max_frame_bytes = max_frame_bytes
        self.topology = Topology()
        self._snapshots = Snapshots()
        self.api_versions: dict[int, tuple[int, int]] = {}
        self.features = NO_FEATURES
        # The brokers' auto.create.topics.enable (Kafka's default until one says): whether a Metadata request
        # may create the topics it names, which decides how kfan's ACLs answer it.
        self.auto_create_topics = True
        self._judges_clients = judges_clients  # kfan's ACLs judge its clients (--authorizer acls): it needs the above
        self.client_logins = client_logins
        self.client_telemetry = client_telemetry  # kfan answers client telemetry (KIP-714): it advertises those APIs
        # The coordinator of each group or transaction, as kfan's own identity finds it; connections
        # that carry their client's identity have views of their own on the same bounded cache.
        self.coordinators = Coordinators(CoordinatorCache(), self, lambda: self.topology.brokers, request_timeout=request_timeout)
        self.ready = trio.Event()
        self.refreshes = 0
        self.refreshed_at: float | None = None
        self.control = ControlLinks(
            lambda: self.topology, request_timeout=request_timeout, max_frame_bytes=max_frame_bytes, security=self.security
        )
        # The codecs of every advertised version, loaded once known: a request must not need a descriptor to decode.
        self.schemas = SchemaPreloader()
        self.brokers = Brokers(self.control, self._versions_changed)
        self.reachable = self.brokers.reachable  # node id -> reachable
        self.broker_versions = self.brokers.versions  # node id -> api key -> (min, max)
        self.bootstrap = bootstrap
        self.refresher = Refresher(bootstrap, self.control, self.brokers, refresh_interval, lambda: self.topology, self._took)

    # --- lifecycle -------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.control.nursery = self.brokers.nursery = nursery
            nursery.start_soon(self.schemas.run)
            await self._bootstrap()
            self.ready.set()
            task_status.started()
            nursery.start_soon(self._age_loop)
            if self._judges_clients:
                nursery.start_soon(self._read_auto_create)
            await self.refresher.run()

    async def _read_auto_create(self) -> None:
        """A broker's auto.create.topics.enable, asked with kfan's identity (a few tries; the default otherwise)."""
        for attempt in range(5):
            broker = self.any_broker()
            if broker is not None:
                try:
                    lo, hi = self.broker_versions.get(broker, {}).get(apis.DESCRIBE_CONFIGS, (1, 4))
                    version = max(lo, min(hi, 4))
                    resource = {"resource_type": 4, "resource_name": str(broker), "configuration_keys": ["auto.create.topics.enable"]}
                    answer = decode_response(
                        await self.call(broker, apis.DESCRIBE_CONFIGS, version, {"resources": [resource]}), apis.DESCRIBE_CONFIGS, version
                    )
                    for result in answer["results"]:
                        for config in result["configs"] if result["error_code"] == 0 else []:
                            if config["name"] == "auto.create.topics.enable" and config["value"] is not None:
                                self.auto_create_topics = config["value"].strip().lower() == "true"
                                log.info("the brokers' auto.create.topics.enable: %s", self.auto_create_topics)
                                return
                except Exception as e:  # a link failure, a timeout, an answer kfan cannot read: try again
                    log.debug("auto.create.topics.enable not read: %r", e)
            await trio.sleep(2.0 * (attempt + 1))

    async def _bootstrap(self) -> None:
        # Until a bootstrap broker answers kfan is alive but not ready
        # (/readyz says 503): keep trying, with backoff, rather than exit.
        delay = 0.2
        while True:
            try:
                await self._bootstrap_once()
                return
            except ClusterUnavailable as e:
                self.problem = str(e)
                log.warning("%s; retrying in %.1f s", e, delay)
                metrics.REFRESHES.labels("failed").inc()
            except Exception:
                log.exception("bootstrap failed unexpectedly; retrying in %.1f s", delay)
                metrics.REFRESHES.labels("failed").inc()
            await trio.sleep(delay)
            delay = min(delay * 2, 10.0)

    async def _bootstrap_once(self) -> None:
        self.topology = Topology().with_metadata(await self.refresher.first())
        for node_id, broker in self.topology.brokers.items():
            await self.brokers.probe(node_id, broker.host, broker.port)
        self._versions_changed()
        self.brokers.note_absent(self.topology)
        self.refreshed_at = trio.current_time()
        metrics.REFRESHES.labels("ok").inc()
        up = sorted(k for k, v in self.reachable.items() if v)
        down = sorted(k for k, v in self.reachable.items() if not v)
        log.info("cluster %s: brokers up %s, down %s; %d topics", self.topology.cluster_id, up, down, len(self.topology.leaders))

    def _took(self, metadata: Mapping[str, Any]) -> None:
        """A refresh's answer: the topology it describes, and the brokers it names probed."""
        self.topology = self._snapshots.following(self.topology, self.topology.refreshed_by(metadata))
        self.refreshes += 1
        self.refreshed_at = trio.current_time()
        metrics.REFRESHES.labels("ok").inc()
        self.brokers.note_absent(self.topology)
        self.brokers.probe_all(self.topology)

    async def _age_loop(self) -> None:
        while True:
            metrics.TOPOLOGY_AGE.set(self.topology_age())
            await trio.sleep(1)

    def _versions_changed(self) -> None:
        self.api_versions = advertised_versions(
            list(self.broker_versions.values()), logins=self.client_logins, telemetry=self.client_telemetry
        )
        self.features = merged_features(self.brokers.features.values())
        self.schemas.want(self.api_versions)

    def is_ready(self) -> bool:
        """Topology known and at least one broker reachable."""
        return self.ready.is_set() and any(self.reachable.values())

    def readiness(self) -> tuple[bool, str]:
        """Ready or not, and why not (an operator reads it at /readyz: a refused login, no broker answering)."""
        if self.is_ready():
            return True, "ready"
        if not self.ready.is_set():
            return False, f"not ready: {self.problem or 'no bootstrap broker has answered yet'}"
        return False, "not ready: no broker is reachable"

    def topology_age(self) -> float:
        return trio.current_time() - self.refreshed_at if self.refreshed_at is not None else float("inf")

    def request_refresh(self) -> None:
        self.refresher.request()

    async def refresh(self, timeout: float = 5.0) -> None:
        """Ask for a refresh and wait (bounded) until one has completed."""
        await self.refresher.wait(timeout)

    # --- what connections ask -------------------------------------------------

    def learn_read_replicas(self, replicas: Mapping[ReadReplicaKey, int]) -> None:
        """Leaders named these preferred read replicas (:class:`~proxy.core.LearnReadReplicas`)."""
        evictions = self.read_replicas.evictions
        self.read_replicas.learn(replicas, trio.current_time())
        metrics.CACHE_EVICTIONS.labels("read_replicas").inc(self.read_replicas.evictions - evictions)
        metrics.CACHE_BYTES.labels("read_replicas").set(self.read_replicas.bytes)

    def forget_read_replicas(self, keys: Iterable[ReadReplicaKey]) -> None:
        """These preferences ended (:class:`~proxy.core.ForgetReadReplicas`): back to the leaders."""
        self.read_replicas.forget(keys)
        metrics.CACHE_BYTES.labels("read_replicas").set(self.read_replicas.bytes)

    def fold_metadata(self, metadata: Mapping[str, Any], *, described_only: bool = False) -> None:
        """``described_only``: a client's answer (see :class:`~proxy.core.FoldMetadata`): its errors change nothing."""
        if metadata["brokers"]:  # an answer naming no broker would leave nothing to route to
            self.topology = self._snapshots.following(self.topology, self.topology.with_metadata(metadata, described_only=described_only))

    def any_broker(self, exclude: int | None = None) -> int | None:
        """A broker believed reachable (any known one when none is), other than ``exclude``; None when there is none."""
        brokers = [b for b in self.topology.brokers if b != exclude]
        if not brokers:
            return None
        up = [b for b in brokers if self.reachable.get(b, True)]
        return random.choice(up or brokers)

    def version_for(self, broker: int, api_key: int) -> int:
        """The version kfan's own requests of ``api_key`` to ``broker`` use."""
        return control_version(api_key, self.broker_versions.get(broker, {}))

    async def call(
        self, broker: Any, api_key: int, version: int, body: Mapping[str, Any], *, address: tuple[str, int] | None = None
    ) -> bytes:
        """A request of kfan's own to a broker (by node id, or ``address``); the answer's payload."""
        return await self.control.call(broker, api_key, version, body, address=address)
