"""Memory kfan holds for clients: a budget per connection and a cap for the process.

Everything a client makes kfan hold counts: bytes of a frame still arriving,
requests in flight (their frame plus their decoded form), brokers' answers
from their arrival until they are merged or dropped (late ones included),
and responses not written yet. A connection's :class:`Budget` makes its reader wait while the
connection holds more than its share (TCP then pushes back on the client);
the process-wide :class:`MemoryPool` makes every connection that already
holds something wait while the whole process is over its cap, so that many
heavy clients together cannot grow kfan without bound. A connection holding
less than :data:`POOL_FLOOR` may always read, so light clients keep being
served while heavy ones wait.
"""

from __future__ import annotations

import trio

from proxy.runtime import metrics

# Below this, a connection reads even when the process is over its cap: enough
# for ordinary small requests, so light clients are not starved by heavy ones.
POOL_FLOOR = 64 * 1024


class _Freed:
    """Wakes everyone waiting for bytes to be given back (a fresh event per round)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    async def wait(self) -> None:
        await self._event.wait()

    def notify(self) -> None:
        event, self._event = self._event, trio.Event()
        event.set()


class MemoryPool:
    """Bytes held for all client connections of this process, against one cap."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.reserved = 0  # room the connections set aside for answers on their way (not in the metric)
        self._freed = _Freed()

    def add(self, n: int) -> None:
        self.used += n
        metrics.count(metrics.BUFFERED_BYTES, (), n)

    def sub(self, n: int) -> None:
        self.used -= n
        metrics.count(metrics.BUFFERED_BYTES, (), -n)
        if n > 0:
            self._freed.notify()

    def has_room(self, n: int) -> bool:
        """Whether ``n`` more bytes fit the cap beside what is held and set aside."""
        return self.used + self.reserved + n <= self.limit

    def unreserve(self, n: int) -> None:
        self.reserved -= n
        if n > 0:
            self._freed.notify()

    def may_read(self, holding: int) -> bool:
        return self.used < self.limit or holding < POOL_FLOOR

    async def freed(self) -> None:
        """Until bytes held or set aside are given back, anywhere in the process."""
        await self._freed.wait()

    async def wait_to_read(self, holding: int) -> None:
        """Return once a connection holding ``holding`` bytes may read more."""
        while not self.may_read(holding):
            await self._freed.wait()


class Budget:
    """Bytes one connection holds; :meth:`acquire` waits while full (one oversized request may pass alone).

    ``reserved``: room set aside for answers on their way (:meth:`reserve`),
    counted against this connection only: the pool, and the metric it feeds,
    count bytes actually held.
    """

    def __init__(self, limit: int, pool: MemoryPool) -> None:
        self.limit = limit
        self.pool = pool
        self.used = 0
        self.reserved = 0
        self.closed = False  # the connection ended: nothing more is counted or given back
        self._freed = _Freed()

    async def acquire(self, n: int) -> None:
        while self.used and self.used + n > self.limit:
            await self._freed.wait()
        self.add(n)

    def add(self, n: int) -> None:
        """Count ``n`` bytes without waiting (responses, brokers' answers: they are already made)."""
        if self.closed:
            return
        self.used += n
        self.pool.add(n)

    def has_room(self, n: int) -> bool:
        """Whether ``n`` more bytes fit this connection's limit and the process's cap."""
        return self.used + n <= self.limit and self.pool.used + n <= self.pool.limit

    async def reserve(self, n: int, own: int = 0) -> int:
        """Set aside room for an answer of up to ``n`` bytes (at most the limit); what was set aside.

        Waits while the connection, or the process, holds or expects too much;
        ``own``: bytes of the asking request itself, already counted. A
        connection that holds and expects nothing else passes (as a light
        connection is always read): one answer per connection beyond the
        process's cap, no more.
        """
        n = min(n, self.limit)
        while self.used - own + self.reserved > 0 and (self.used + self.reserved + n > self.limit or not self.pool.has_room(n)):
            # Every release and unreserve, of this connection or another, goes through the pool.
            await self.pool.freed()
        self.reserved += n
        self.pool.reserved += n
        return n

    def unreserve(self, n: int) -> None:
        if self.closed:
            return  # release_all gave it back already
        self.reserved -= n
        self.pool.unreserve(n)
        self._freed.notify()

    def release(self, n: int) -> None:
        if self.closed:
            return  # release_all gave it back already
        self.used -= n
        self.pool.sub(n)
        self._freed.notify()

    def release_all(self) -> None:
        """The connection ended: everything it held is free, and what is given back later was given back here."""
        if self.used:
            self.release(self.used)
        # Answers still on their way when the connection ended never come here: their room goes back now.
        self.pool.unreserve(self.reserved)
        self.reserved = 0
        self.closed = True
