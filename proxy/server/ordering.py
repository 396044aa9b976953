"""Answers in request order, and the bound on requests between read and answer (trio).

Kafka clients expect a connection's responses in the order they sent the
requests, whatever order the brokers answer in (Kroxylicious'
``ResponseOrderer``). :class:`ResponseOrderer` keeps one
:class:`ResponseSlot` per request read, in reading order, and hands the
writer each slot once it is answered and every slot before it was handed out.
It also bounds the requests in flight: the reader takes a place before it
reads a request, so at most ``max_inflight`` are read and not yet answered.

An answer to the oldest request that lands while the writer waits is
handed to the writer's :attr:`ResponseOrderer.write_now` right there (in the
link's reader, usually): the writer's wake-up was a task step of every request.

Boundaries: no I/O and no protocol knowledge. It never writes to the client
itself (the connection's writer does, :mod:`.writer`) and never looks inside a
slot's bytes; a slot holding no bytes (Produce acks=0) keeps its place and is
written as nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from types import TracebackType

import trio

from proxy.core.topology import Topology
from proxy.kafka.wire import Parts
from proxy.runtime import metrics
from proxy.runtime.frame_io import YIELD_EVERY


class Answered:
    """Whether a slot is answered; setting it tells the response order (the slot's ``done``)."""

    __slots__ = ("_set", "_slot", "orderer")

    def __init__(self, slot: ResponseSlot) -> None:
        self._set = False
        self._slot = slot
        self.orderer: ResponseOrderer | None = None  # once placed

    def set(self) -> None:
        if not self._set:
            self._set = True
            if self.orderer is not None:
                self.orderer.answered(self._slot)

    def is_set(self) -> bool:
        return self._set


class ResponseSlot:
    """A place in the response order: what the writer writes there, and what ends the connection there."""

    __slots__ = (
        "done",
        "parts",
        "close",
        "close_after",
        "size",
        "started",
        "api_key",
        "captured",
        "throttle",
        "hold",
        "cpu",
        "rest",
    )

    def __init__(self, size: int, api_key: int) -> None:
        self.done = Answered(self)
        self.parts: Parts | None = None
        self.close: str | None = None  # end the connection here, for this reason
        self.close_after: str | None = None  # end it once this response is written (a failed login)
        self.size = size  # bytes held for it: the request's cost, then its response's too
        self.started = trio.current_time()
        self.api_key = api_key
        # When sampled: wall-clock ns at read, the request, and the topology its plan used
        # (not the one current when it is answered: a refresh in between may have moved leaders).
        self.captured: tuple[int, bytes, Topology] | None = None
        # Over a quota: the throttle time the request earned (its answer says it); ``hold``: the client's
        # version does not wait on its own (before KIP-219), so the answer itself waits that long.
        self.throttle = 0.0
        self.hold = False
        self.cpu = 0.0  # kfan's CPU seconds on the request, counted when it has a request quota
        # Written in part where it was answered (:attr:`ResponseOrderer.write_now`): the frame's size and what is
        # left of it, for the writer to send first.
        self.rest: tuple[int, bytes | memoryview] | None = None


# Writes an answered slot at once where it was answered, when it can (no wait, no deadline needed): whether
# the slot is done with (written whole, or written in part with the rest left in ``slot.rest`` is not).
WriteNow = Callable[[ResponseSlot], bool]


class ResponseOrderer:
    """One connection's slots in request order, at most ``max_inflight`` of them.

    The reader's side is an async context manager: leaving it says no slot
    follows, and :meth:`next_answered` returns None once the last one is out.

    The writer is woken only when the oldest slot is answered and :attr:`write_now` did not write it where it
    was answered: a request answered while the writer waits for it costs the writer no task step.
    """

    def __init__(self, max_inflight: int) -> None:
        # One token per request between its read and its response's write:
        # the reader takes one before reading the next request.
        self._capacity = trio.Semaphore(max_inflight)
        self._holding = False  # the reader holds a token for the next request
        self._slots: deque[ResponseSlot] = deque()  # placed, not yet handed out: at most max_inflight
        self._closed = False  # the reader is done: no slot follows
        self._wake = trio.Event()  # set: the writer has something to do
        self._parked = False  # the writer waits on _wake
        self.write_now: WriteNow | None = None  # the writer's, when it has one
        self.inflight = 0  # slots placed and not yet handed out
        self._placed = self._taken = 0  # since the reader's / the writer's last yield

    async def __aenter__(self) -> ResponseOrderer:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._closed = True
        if not self._slots:
            self._wake.set()

    async def make_room(self) -> None:
        """Until there is room for one more request in flight (kept for the next :meth:`place`)."""
        if not self._holding:
            try:
                self._capacity.acquire_nowait()  # the usual case: no pass of the scheduler for it
            except trio.WouldBlock:
                await self._capacity.acquire()
            self._holding = True

    async def place(self, slot: ResponseSlot) -> None:
        """Give ``slot`` the next place in the order; it takes the room :meth:`make_room` kept."""
        assert self._holding, "a slot placed without room for it"
        self._placed += 1
        if self._placed >= YIELD_EVERY:
            # Placing a slot waits for nothing in the usual case: a client pipelining many requests in one read
            # would otherwise hold the event loop for all of them.
            self._placed = 0
            await trio.lowlevel.checkpoint()
        metrics.count(metrics.INFLIGHT)
        self.inflight += 1
        self._slots.append(slot)
        self._holding = False  # the slot has the token now; the writer gives it back
        slot.done.orderer = self
        if slot.done.is_set():
            self.answered(slot)

    def answered(self, slot: ResponseSlot) -> None:
        """``slot`` is answered (its ``done`` calls this): the oldest slots answered are written at once where
        they can be, and the writer is woken for the first that cannot."""
        slots = self._slots
        if not slots or slots[0] is not slot:
            return  # an older one is still out: the writer takes this one in its turn
        while slots and slots[0].done.is_set():
            head = slots[0]
            if not self._parked or self.write_now is None or not self.write_now(head):
                self._wake.set()
                return
            slots.popleft()
            self._handed()
        if self._closed and not slots:
            self._wake.set()

    async def next_answered(self) -> ResponseSlot | None:
        """The next slot in request order, once it is answered; None when the reader is done and every slot is out."""
        self._taken += 1
        if self._taken >= YIELD_EVERY:
            self._taken = 0  # (as for placing: many answers ready at once)
            await trio.lowlevel.checkpoint()
        slots = self._slots
        while not (slots and slots[0].done.is_set()):
            if self._closed and not slots:
                return None
            self._wake = trio.Event()
            self._parked = True
            try:
                await self._wake.wait()
            finally:
                self._parked = False
        self._handed()
        return slots.popleft()

    def _handed(self) -> None:
        metrics.count(metrics.INFLIGHT, (), -1)
        self.inflight -= 1
        self._capacity.release()

    def abandon(self) -> None:
        """The connection ended: the slots still placed will never be written."""
        metrics.count(metrics.INFLIGHT, (), -self.inflight)
        self.inflight = 0
