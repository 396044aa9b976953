"""The coordinator of each group and transaction: a bounded cache, and the
FindCoordinator lookups that fill it (one at a time, or in bulk).

Clients choose group and transactional ids, so the cache is process-wide but
bounded by entries and by bytes (the least recently used entry goes), a key
longer than :data:`~proxy.core.plan.MAX_CACHED_KEY_CHARS` is looked up each
time it is used and never kept, and entries expire; a coordinator that moved
or failed is forgotten, and looked up again on next use.

What a connection sees of the cache is a :class:`Coordinators` view: kfan's
own (``scope`` None: looked up with kfan's identity over its control links,
shared by every connection), or, with ``--broker-identity client``, one
connection's own (looked up over that connection's links, with the client's
identity, and seen by no other connection). Nothing one principal's lookups
learn answers for another. A lookup the client's identity may not make (its
ACLs deny DESCRIBE on the group or transactional id) is made again with kfan's
identity, for routing only: the broker the request goes to then judges the
client's request itself, and answers it as it would answer the client
directly (GROUP_AUTHORIZATION_FAILED, or the request served where its ACLs
allow that but not the lookup).
"""

from __future__ import annotations

import logging
import sys
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Protocol

import trio

from proxy.core import Coordinator
from proxy.core.plan import cacheable
from proxy.kafka import apis, errors
from proxy.kafka.headers import decode_response
from proxy.kafka.wire import Malformed
from proxy.runtime import metrics

from .link import LinkError

log = logging.getLogger("kfan.cluster")

# What a control-plane request can end in, short of an answer kfan can use.
ANSWER_FAILURES = (LinkError, trio.TooSlowError, OSError, Malformed)

# Keys per batched FindCoordinator request.
_FIND_BATCH = 1000
# A lookup answered with these was refused the asker, not failed: kfan's own view routes it (see the docstring).
REFUSED = frozenset({errors.GROUP_AUTHORIZATION_FAILED, errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, errors.CLUSTER_AUTHORIZATION_FAILED})
MAX_COORDINATORS = 10_000
MAX_COORDINATOR_BYTES = 16 * 1024 * 1024  # the keys' memory plus a per-entry overhead, over every scope
COORDINATOR_TTL = 300.0
# An entry's memory beside its key's: the dict slot, the scope and coordinator key, the value tuple (measured, rounded up).
_ENTRY_OVERHEAD = 200

# None: kfan's own identity (shared); anything else: one client connection's own entries.
Scope = Hashable | None


def read_coordinators(payload: bytes | memoryview, version: int) -> dict[str, tuple[int, int]]:
    """Key -> (error code, node id) of a batched (v4+) FindCoordinator answer. Raises only :class:`Malformed`."""
    resp = decode_response(payload, apis.FIND_COORDINATOR, version)
    return {e["key"]: (e["error_code"], e["node_id"]) for e in resp["coordinators"]}


def read_coordinator(payload: bytes | memoryview, version: int, key_type: int, key: str) -> tuple[int, int]:
    """(error code, node id) of a FindCoordinator answer for ``key``. Raises only :class:`Malformed`."""
    if version < 4:
        resp = decode_response(payload, apis.FIND_COORDINATOR, version)
        return resp["error_code"], resp["node_id"]
    found = read_coordinators(payload, version).get(key)
    if found is None:
        raise Malformed(f"FindCoordinator answer does not name {key!r}")
    return found


class CoordinatorError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"coordinator lookup failed with error {code}")
        self.code = code


def entry_bytes(c: Coordinator) -> int:
    """What one cached coordinator costs in memory, as the byte bound counts it."""
    return sys.getsizeof(c.key) + _ENTRY_OVERHEAD


class CoordinatorCache:
    """(scope, coordinator) -> (node id, learned at): least recently used first, bounded by entries and bytes."""

    def __init__(self, max_entries: int | None = None, max_bytes: int | None = None) -> None:
        """Bounds other than :data:`MAX_COORDINATORS` and :data:`MAX_COORDINATOR_BYTES` (read at each use) are for tests."""
        self._entries: OrderedDict[tuple[Scope, Coordinator], tuple[int, float]] = OrderedDict()
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self.bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def max_entries(self) -> int:
        return MAX_COORDINATORS if self._max_entries is None else self._max_entries

    @property
    def max_bytes(self) -> int:
        return MAX_COORDINATOR_BYTES if self._max_bytes is None else self._max_bytes

    def get(self, scope: Scope, c: Coordinator) -> tuple[int, float] | None:
        entry = self._entries.get((scope, c))
        if entry is not None:
            self._entries.move_to_end((scope, c))
        return entry

    def put(self, scope: Scope, c: Coordinator, node: int, now: float) -> None:
        if not cacheable(c):
            return  # a key this long is looked up each time it is used, never kept
        key = (scope, c)
        if key not in self._entries:
            self.bytes += entry_bytes(c)
        self._entries[key] = (node, now)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            (_, oldest), _ = self._entries.popitem(last=False)
            self.bytes -= entry_bytes(oldest)
            self.evictions += 1
            metrics.CACHE_EVICTIONS.labels("coordinators").inc()
        self._measure()

    def entries(self) -> list[tuple[Scope, Coordinator]]:
        return list(self._entries)

    def pop(self, scope: Scope, c: Coordinator) -> None:
        if self._entries.pop((scope, c), None) is not None:
            self.bytes -= entry_bytes(c)
            self._measure()

    def _measure(self) -> None:
        metrics.CACHE_BYTES.labels("coordinators").set(self.bytes)


class Asker(Protocol):
    """Who asks FindCoordinator, and over which links: the control plane (:class:`~.cluster.Cluster`), or a client
    connection's :class:`~.links.LinkPool` (``--broker-identity client``)."""

    def any_broker(self) -> int | None: ...

    def version_for(self, broker: int, api_key: int) -> int: ...

    async def call(self, broker: int, api_key: int, version: int, body: Mapping[str, Any]) -> bytes: ...


class Coordinators:
    """One scope's view of the coordinator cache, and the lookups that fill it.

    ``brokers()``: the node ids of the current topology (an entry naming another is stale);
    ``asker``: who looks coordinators up; ``request_timeout``: the bound of a bulk lookup.
    """

    def __init__(
        self,
        cache: CoordinatorCache,
        asker: Asker,
        brokers: Callable[[], Mapping[int, object]],
        *,
        request_timeout: float,
        scope: Scope = None,
        fallback: Coordinators | None = None,
    ) -> None:
        self.cache = cache
        self.scope = scope
        self._fallback = fallback  # kfan's own view: what this one's lookups are refused, for routing
        self._asker = asker
        self._brokers = brokers
        self._request_timeout = request_timeout

    def __len__(self) -> int:
        """Entries in the process-wide cache, every scope's."""
        return len(self.cache)

    def __contains__(self, c: object) -> bool:
        return isinstance(c, Coordinator) and self.cache.get(self.scope, c) is not None

    def scoped(self, asker: Asker, scope: Hashable) -> Coordinators:
        """A view of the same cache with entries of its own, looked up by ``asker`` (by this view where refused)."""
        return Coordinators(self.cache, asker, self._brokers, request_timeout=self._request_timeout, scope=scope, fallback=self)

    def learn(self, coordinators: Mapping[Coordinator, int]) -> None:
        now = trio.current_time()
        for c, node in coordinators.items():
            self.cache.put(self.scope, c, node, now)

    def forget(self, coordinator: Coordinator) -> None:
        self.cache.pop(self.scope, coordinator)

    def known(self, c: Coordinator) -> int | None:
        """The cached coordinator of a group or transactional id, if fresh and among the brokers."""
        entry = self.cache.get(self.scope, c)
        if entry is None:
            return None
        node, learned_at = entry
        if node not in self._brokers() or trio.current_time() - learned_at > COORDINATOR_TTL:
            self.cache.pop(self.scope, c)
            return None
        return node

    async def coordinator(self, c: Coordinator) -> int:
        """The broker coordinating a group or transactional id (cached)."""
        node = self.known(c)
        if node is not None:
            return node
        code = errors.COORDINATOR_NOT_AVAILABLE
        for attempt in range(5):
            try:
                code, node = await self._find_coordinator(c)
            except ANSWER_FAILURES as e:
                log.info("FindCoordinator for %s failed: %s", _shown(c), e)
                code, node = errors.COORDINATOR_NOT_AVAILABLE, -1
            if code == errors.NONE and node in self._brokers():
                self.learn({c: node})
                return node
            if code in REFUSED and self._fallback is not None:
                node = await self._fallback.coordinator(c)
                self.learn({c: node})
                return node
            if code not in (errors.COORDINATOR_NOT_AVAILABLE, errors.COORDINATOR_LOAD_IN_PROGRESS, errors.NONE):
                break
            await trio.sleep(0.05 * (attempt + 1))
        raise CoordinatorError(code)

    async def find(self, keys: Iterable[Coordinator]) -> None:
        """Look up many coordinators at once, within one request timeout, and learn those found.

        With FindCoordinator v4+ the keys go in batches; older brokers are asked
        one key at a time, each once. What is not found in time stays unknown.
        Keys too long to be kept are left out: each is looked up when its
        sub-request is sent (the plan sends them to their own coordinator).
        """
        by_type: dict[int, list[str]] = {}
        for c in keys:
            if cacheable(c) and self.known(c) is None:
                by_type.setdefault(c.key_type, []).append(c.key)
        refused: list[Coordinator] = []
        with trio.move_on_after(self._request_timeout):
            await self._find(by_type, refused)
        if refused and self._fallback is not None:
            await self._fallback.find(refused)
            self.learn({c: node for c in refused if (node := self._fallback.known(c)) is not None})

    async def _find(self, by_type: Mapping[int, list[str]], refused: list[Coordinator]) -> None:
        """The lookups of :meth:`find`; the keys the asker was refused (an authorization error) go in ``refused``."""
        for key_type, names in by_type.items():
            broker = self._asker.any_broker()
            if broker is None:
                return
            version = self._asker.version_for(broker, apis.FIND_COORDINATOR)
            if version < 4:
                for name in names:
                    try:
                        code, node = await self._find_coordinator(Coordinator(key_type, name))
                    except ANSWER_FAILURES as e:
                        log.info("FindCoordinator for %s failed: %s", _shown(Coordinator(key_type, name)), e)
                        continue
                    if code == errors.NONE and node in self._brokers():
                        self.learn({Coordinator(key_type, name): node})
                    elif code in REFUSED:
                        refused.append(Coordinator(key_type, name))
                continue
            for start in range(0, len(names), _FIND_BATCH):
                body = {"key_type": key_type, "coordinator_keys": names[start : start + _FIND_BATCH]}
                try:
                    found = read_coordinators(await self._asker.call(broker, apis.FIND_COORDINATOR, version, body), version)
                except ANSWER_FAILURES as e:
                    log.info("FindCoordinator for %d keys failed: %s", len(body["coordinator_keys"]), e)
                    continue
                brokers = self._brokers()
                self.learn(
                    {Coordinator(key_type, key): node for key, (code, node) in found.items() if code == errors.NONE and node in brokers}
                )
                refused.extend(Coordinator(key_type, key) for key, (code, _) in found.items() if code in REFUSED)

    async def _find_coordinator(self, c: Coordinator) -> tuple[int, int]:
        b = self._asker.any_broker()
        if b is None:
            raise LinkError("no broker known")
        version = self._asker.version_for(b, apis.FIND_COORDINATOR)
        if version >= 4:
            body = {"key_type": c.key_type, "coordinator_keys": [c.key]}
        else:
            body = {"key": c.key, "key_type": c.key_type}
        payload = await self._asker.call(b, apis.FIND_COORDINATOR, version, body)
        return read_coordinator(payload, version, c.key_type, c.key)


def _shown(c: Coordinator) -> str:
    """A coordinator as the log shows it: a client chose the key, so a long one is cut."""
    key = repr(c.key) if len(c.key) <= 80 else f"{c.key[:80]!r}... ({len(c.key)} characters)"
    return f"{c.key_type.name.lower()} {key}"
