"""A request's answer to come from a broker link (:class:`Pending`), and how a link fails (:class:`LinkError`).

Boundaries: the answer's state and what holds it (a budget, a callback where it lands); the link that
fills it in is :mod:`backends.link`'s.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from proxy.kafka.frames import MAPPED_FROM
from proxy.runtime.budget import Budget
from proxy.runtime.reclaim import release_later


class LinkError(Exception):
    """The broker connection failed; what was in flight on it has no answer."""


class LinkClosed(LinkError):
    """The link ended with the client connection it belonged to: the broker did not fail.

    Only an answer another connection shares (:mod:`backends.flights`) is still waited for then.
    """


class Pending:
    """A request's answer to come: the response payload, or a :class:`LinkError`.

    ``waiters``: how many client requests wait for it (its submitter, at
    first); 0 for a sub-fetch kept only for a Fetch that may come. Its payload
    is counted against a budget while held (:meth:`hold`); whoever ends its
    use gives that back, once (:meth:`release`, :meth:`abandon`).
    """

    __slots__ = (
        "_done",
        "_value",
        "sent",
        "written",
        "done_at",
        "created_at",
        "request",
        "broker",
        "waiters",
        "dropped",
        "_held",
        "_budget",
        "_reserved",
        "merged",
        "on_done",
    )

    def __init__(self) -> None:
        self._done = trio.Event()
        self.sent = trio.Event()
        self._value: bytes | LinkError | None = None
        self.done_at: float | None = None  # trio clock time the answer came
        self.created_at = trio.current_time()
        self.request: bytes | None = None  # the frame sent, kept only for traffic capture
        self.broker = -1
        # Whether the request may have reached the broker: its bytes started
        # out on the socket. One that failed before that cannot have been acted on.
        self.written = False
        self.waiters = 1
        self.dropped = False  # nobody will read the answer: it is not kept
        self._held = 0
        self._budget: Budget | None = None
        self._reserved: tuple[Budget, int] | None = None  # room set aside for the answer, until it comes
        # The client response merged from this answer, for the others waiting for it (backends.flights):
        # (what it depends on besides the request, the reply); kept by the layer that merges.
        self.merged: tuple[object, object] | None = None
        # Run where the answer (or failure) lands, once, for a request awaited without a task of its own
        # (:mod:`proxy.server.deadlines`); it must not raise.
        self.on_done: Callable[[Pending], None] | None = None

    def set(self, value: bytes | LinkError) -> None:
        if self.dropped and not isinstance(value, LinkError):
            value = DROPPED  # abandoned: its payload is not kept
        self._unreserve()  # the answer is in (counted as itself), or never will be
        if not self._done.is_set():
            self._value = value
            self.done_at = trio.current_time()
            self._done.set()
            self.sent.set()
            if self.on_done is not None:
                on_done, self.on_done = self.on_done, None
                on_done(self)

    @property
    def is_done(self) -> bool:
        """Whether the answer (or failure) is in."""
        return self._done.is_set()

    async def answered(self) -> None:
        """Until the answer (or failure) is in, without reading it."""
        await self._done.wait()

    def reserve(self, budget: Budget, n: int) -> None:
        """``n`` bytes of ``budget`` were set aside for this answer: given back when it comes."""
        self._reserved = (budget, n)

    def hold(self, budget: Budget, n: int) -> None:
        """Count the ``n`` bytes of the payload against ``budget`` while it is held (the room set aside goes back)."""
        self._unreserve()
        budget.add(n)
        self._budget, self._held = budget, n

    def _unreserve(self) -> None:
        if self._reserved is not None:
            budget, n = self._reserved
            self._reserved = None
            budget.unreserve(n)

    def release(self) -> None:
        """The payload was consumed: its bytes are no longer this answer's (idempotent)."""
        if self._budget is not None:
            self._budget.release(self._held)
            self._budget, self._held = None, 0

    def abandon(self) -> None:
        """Nobody will read the answer: give back what it holds, and keep nothing that comes later."""
        self.release()
        self.dropped = True
        if self._done.is_set() and not isinstance(self._value, LinkError):
            if self._value is not None and len(self._value) >= MAPPED_FROM:
                # Often many MiB, and expired with others of its burst. (A small answer is dropped here: handing
                # each one to the releasing thread cost a tenth of kfan's CPU under a producer, in GIL handoffs.)
                release_later(self._value)
            self._value = DROPPED

    @property
    def failure(self) -> LinkError | None:
        """Why no answer comes, once that is known; None otherwise."""
        return self._value if isinstance(self._value, LinkError) else None

    async def wait(self) -> bytes:
        await self._done.wait()
        return self.value()

    def value(self) -> bytes:
        """The answer's payload, once it is in; raises the link's failure."""
        assert self._done.is_set()
        if isinstance(self._value, LinkError):
            raise self._value
        assert self._value is not None
        return self._value


# What a dropped answer reads as, should anyone still ask for it.
DROPPED = LinkError("the answer was dropped: nobody waited for it")
