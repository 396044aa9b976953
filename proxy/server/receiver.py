"""A client connection's bytes under their deadlines, and its end for its age (trio).

:class:`Receiver` reads the client's bytes: a frame begun must arrive whole
within ``frame_timeout``; a connection with nothing in flight is closed after
``idle_timeout``; bytes of frames still arriving count in the pool. Past its
max age (``--connection-max-age``, with its jitter) or a drain's deadline it
reads nothing more: the requests read are answered, then the connection ends
with :func:`goodbye`. Its state changes are the connection's to act on
(:mod:`.connection`); :class:`Closing` ends it.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable

import trio

from proxy.kafka.frames import FrameReader
from proxy.runtime import metrics
from proxy.runtime.budget import Budget, MemoryPool
from proxy.runtime.frame_io import receive_into
from proxy.server.limits import Limits

log = logging.getLogger("kfan.connection")
# How long a connection kfan ends after an answer waits for the client to close it.
CLOSE_LINGER = 1.0


class Closing(Exception):
    """End this client connection (the reason is logged and counted where it is raised)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        if reason != "eof":  # the client's own doing
            metrics.CLIENT_CLOSES.labels(reason).inc()


class Receiver:
    """The client's bytes under their deadlines: a frame begun must arrive whole
    within ``frame_timeout``; a connection with nothing in flight is closed
    after ``idle_timeout``. Bytes of frames still arriving count in the pool."""

    def __init__(self, stream: trio.abc.Stream, limits: Limits, budget: Budget, pool: MemoryPool, client: int) -> None:
        self.stream = stream
        self.limits = limits
        self.budget = budget
        self.pool = pool
        self.client = client
        self.partial = 0  # bytes of frames still arriving, counted in the pool
        self.last_active = trio.current_time()  # the last byte either way
        self._frame_started = 0.0
        self._draining = trio.Event()
        self._receiving: trio.CancelScope | None = None
        self.login_deadline = math.inf  # a connection not logged in by then is closed
        self.expires_at = math.inf  # past it, the connection is closed when nothing is in flight (max age, drain)
        self.expiry_reason = "max_age"
        self.expired = False  # it is closing for its age, or a drain
        # The max age counts from the opening, or from the reload that changed it (turning it on after a scale-out
        # must not close every old connection at once); this connection's share of the jitter is kept across reloads.
        self._age_from = trio.current_time()
        self._age_jitter = random.random()
        self._set_max_age(limits)

    def drain(self) -> None:
        self._draining.set()
        if self._receiving is not None:
            self._receiving.cancel()

    async def pause_until(self, deadline: float) -> bool:
        """Read nothing until ``deadline`` (a throttled client); False when draining. The wait counts against
        neither the idle nor the frame deadline."""
        with trio.CancelScope(deadline=deadline) as self._receiving:
            await self._draining.wait()
        self._receiving = None
        now = trio.current_time()
        self.last_active = now
        if self.partial:
            self._frame_started = now
        return not self._draining.is_set()

    def expiring(self) -> bool:
        """Past the max age (or a drain's deadline): no request is read any more; those read are answered, then the
        connection closes (:attr:`expired`)."""
        if not self.expired and trio.current_time() >= self.expires_at:
            self.expired = True
            log.info("client %s: closing once the requests it sent are answered (%s)", self.client, self.expiry_reason)
        return self.expired

    def reconfigure(self, limits: Limits) -> None:
        if limits.max_age != self.limits.max_age:
            self._age_from = trio.current_time()
        self.limits = limits
        self._set_max_age(limits)

    def _set_max_age(self, limits: Limits) -> None:
        if self.expiry_reason != "max_age":
            return  # draining already: the drain's deadline holds
        self.expire_by(self._age_from + limits.max_age + self._age_jitter * limits.max_age_jitter if limits.max_age > 0 else math.inf)

    def close_gradually(self, deadline: float) -> None:
        """Closing from ``deadline`` on (a replica being drained), or at the max age if sooner."""
        self.expiry_reason = "drain"
        self.expire_by(min(deadline, self.expires_at))

    def expire_by(self, deadline: float) -> None:
        """Close the connection at its first safe point after ``deadline`` (the receiver looks again now)."""
        self.expires_at = deadline
        if self._receiving is not None:
            self._receiving.cancel()

    def sync_partial(self, reader: FrameReader) -> None:
        held = reader.buffered()
        if held and not self.partial:
            self._frame_started = trio.current_time()
        self.pool.add(held - self.partial)
        self.partial = held

    def release(self) -> None:
        self.pool.sub(self.partial)
        self.partial = 0

    async def receive(self, busy: Callable[[], bool], reader: FrameReader) -> int | None:
        """Read the client's next bytes into ``reader``: how many (0 at EOF), or None when draining; closes on a deadline.

        ``busy()``: requests are in flight, so the connection is not idle.
        """
        limits = self.limits
        while not self._draining.is_set():
            deadline = self._frame_started + limits.frame_timeout if self.partial else self.last_active + limits.idle_timeout
            with trio.CancelScope(deadline=min(deadline, self.login_deadline, self.expires_at)) as self._receiving:
                await self.pool.wait_to_read(self.budget.used + self.partial)
                n = await receive_into(self.stream, reader)
                self.last_active = trio.current_time()
                return n
            self._receiving = None
            now = trio.current_time()
            if self._draining.is_set() or self.expiring():
                break
            if now >= self.login_deadline:
                log.warning("client %s: not logged in within %.0f s, closing", self.client, limits.login.timeout)
                raise Closing("login_timeout")
            if self.partial and now >= self._frame_started + limits.frame_timeout:
                log.warning("client %s: a frame was not completed within %.0f s, closing", self.client, limits.frame_timeout)
                raise Closing("frame_timeout")
            if not self.partial and not busy() and now >= self.last_active + limits.idle_timeout:
                log.info("client %s: idle for %.0f s, closing", self.client, limits.idle_timeout)
                raise Closing("idle_timeout")
            # Requests in flight: the connection is not idle. Look again later.
            self.last_active = max(self.last_active, now - limits.idle_timeout / 2)
        return None


async def goodbye(stream: trio.abc.Stream) -> None:
    """End the connection after its last answer with a FIN, not a reset: what the client sent that was not
    read is discarded for up to ``CLOSE_LINGER`` while it reads the answers and closes (a close with unread
    bytes would reset the connection, and a reset may overtake answers still on their way)."""
    raw = getattr(stream, "transport_stream", stream)  # under TLS: the socket (closing, no close_notify)
    with trio.move_on_after(CLOSE_LINGER):
        try:
            if isinstance(raw, trio.abc.HalfCloseableStream):
                await raw.send_eof()
            while await raw.receive_some(65536):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
