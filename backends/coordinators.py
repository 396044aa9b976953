"""The coordinator of each group and transaction: a bounded cache, and the
FindCoordinator lookups that fill it (one at a time, or in bulk).

Clients choose group and transactional ids, so the cache is bounded (the
least recently used entry goes) and entries expire; a coordinator that moved
or failed is forgotten, and looked up again on next use.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import trio

from proxy.core import Coordinator
from proxy.kafka import apis, errors
from proxy.kafka.headers import decode_response
from proxy.kafka.wire import Malformed

from .link import LinkError

log = logging.getLogger("kfan.cluster")

if TYPE_CHECKING:
    from .cluster import Cluster

# What a control-plane request can end in, short of an answer kfan can use.
ANSWER_FAILURES = (LinkError, trio.TooSlowError, OSError, Malformed)

# Keys per batched FindCoordinator request.
_FIND_BATCH = 1000
MAX_COORDINATORS = 10_000
COORDINATOR_TTL = 300.0


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


class Coordinators:
    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._entries: OrderedDict[Coordinator, tuple[int, float]] = OrderedDict()  # -> (node id, learned at)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, c: object) -> bool:
        return c in self._entries

    def learn(self, coordinators: Mapping[Coordinator, int]) -> None:
        now = trio.current_time()
        for c, node in coordinators.items():
            self._entries[c] = (node, now)
            self._entries.move_to_end(c)
        while len(self._entries) > MAX_COORDINATORS:
            self._entries.popitem(last=False)

    def forget(self, coordinator: Coordinator) -> None:
        self._entries.pop(coordinator, None)

    def known(self, c: Coordinator) -> int | None:
        """The cached coordinator of a group or transactional id, if fresh and among the brokers."""
        entry = self._entries.get(c)
        if entry is None:
            return None
        node, learned_at = entry
        if node not in self._cluster.topology.brokers or trio.current_time() - learned_at > COORDINATOR_TTL:
            del self._entries[c]
            return None
        self._entries.move_to_end(c)
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
                log.info("FindCoordinator for %s failed: %s", c, e)
                code, node = errors.COORDINATOR_NOT_AVAILABLE, -1
            if code == errors.NONE and node in self._cluster.topology.brokers:
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
        """
        by_type: dict[int, list[str]] = {}
        for c in keys:
            if self.known(c) is None:
                by_type.setdefault(c.key_type, []).append(c.key)
        with trio.move_on_after(self._cluster.request_timeout):
            for key_type, names in by_type.items():
                broker = self._cluster.any_broker()
                if broker is None:
                    return
                version = self._cluster.version_for(broker, apis.FIND_COORDINATOR)
                if version < 4:
                    for name in names:
                        try:
                            code, node = await self._find_coordinator(Coordinator(key_type, name))
                        except ANSWER_FAILURES as e:
                            log.info("FindCoordinator for %r failed: %s", name, e)
                            continue
                        if code == errors.NONE and node in self._cluster.topology.brokers:
                            self.learn({Coordinator(key_type, name): node})
                    continue
                for start in range(0, len(names), _FIND_BATCH):
                    body = {"key_type": key_type, "coordinator_keys": names[start : start + _FIND_BATCH]}
                    try:
                        found = read_coordinators(await self._cluster.call(broker, apis.FIND_COORDINATOR, version, body), version)
                    except ANSWER_FAILURES as e:
                        log.info("FindCoordinator for %d keys failed: %s", len(body["coordinator_keys"]), e)
                        continue
                    self.learn(
                        {
                            Coordinator(key_type, key): node
                            for key, (code, node) in found.items()
                            if code == errors.NONE and node in self._cluster.topology.brokers
                        }
                    )

    async def _find_coordinator(self, c: Coordinator) -> tuple[int, int]:
        b = self._cluster.any_broker()
        if b is None:
            raise LinkError("no broker known")
        version = self._cluster.version_for(b, apis.FIND_COORDINATOR)
        if version >= 4:
            body = {"key_type": c.key_type, "coordinator_keys": [c.key]}
        else:
            body = {"key": c.key, "key_type": c.key_type}
        payload = await self._cluster.call(b, apis.FIND_COORDINATOR, version, body)
        return read_coordinator(payload, version, c.key_type, c.key)
