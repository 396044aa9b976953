"""Answers in request order, and the bound on requests between read and answer (trio).

Kafka clients expect a connection's responses in the order they sent the
requests, whatever order the brokers answer in (Kroxylicious'
``ResponseOrderer``). :class:`ResponseOrderer` keeps one
:class:`ResponseSlot` per request read, in reading order, and hands the
writer each slot once it is answered and every slot before it was handed out.
It also bounds the requests in flight: the reader takes a place before it
reads a request, so at most ``max_inflight`` are read and not yet answered.

Boundaries: no I/O and no protocol knowledge. It never writes to the client
(the connection does) and never looks inside a slot's bytes; a slot holding
no bytes (Produce acks=0) keeps its place and is written as nothing.
"""

from __future__ import annotations

from types import TracebackType

import trio

from proxy.core.topology import Topology
from proxy.kafka.wire import Parts
from proxy.runtime import metrics
from proxy.runtime.frame_io import YIELD_EVERY


class ResponseSlot:
    """A place in the response order: what the writer writes there, and what ends the connection there."""

    __slots__ = ("done", "parts", "close", "close_after", "size", "started", "api_key", "captured", "throttle", "hold", "cpu")

    def __init__(self, size: int, api_key: int) -> None:
        self.done = trio.Event()
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


class ResponseOrderer:
    """One connection's slots in request order, at most ``max_inflight`` of them.

    The reader's side is an async context manager: leaving it says no slot
    follows, and :meth:`next_answered` returns None once the last one is out.
    """

    def __init__(self, max_inflight: int) -> None:
        # One token per request between its read and its response's write:
        # the reader takes one before reading the next request.
        self._capacity = trio.Semaphore(max_inflight)
        self._holding = False  # the reader holds a token for the next request
        # Never full: the tokens keep at most max_inflight slots in it.
        self._send, self._receive = trio.open_memory_channel[ResponseSlot](max_inflight)
        self.inflight = 0  # slots placed and not yet handed to the writer
        self._turns = {"placed": 0, "taken": 0}  # since the reader's / the writer's last yield

    async def _take_turns(self, side: str) -> None:
        """Yield every YIELD_EVERY calls: placing a slot and taking an answered one wait for nothing in the usual
        case, so a client pipelining many requests in one read (or with many answers ready) would otherwise hold
        the event loop for all of them."""
        self._turns[side] += 1
        if self._turns[side] >= YIELD_EVERY:
            self._turns[side] = 0
            await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> ResponseOrderer:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        await self._send.aclose()

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
        await self._take_turns("placed")
        metrics.count(metrics.INFLIGHT)
        self.inflight += 1
        self._send.send_nowait(slot)  # never full: the room taken keeps at most max_inflight slots in it
        self._holding = False  # the slot has the token now; the writer gives it back

    async def next_answered(self) -> ResponseSlot | None:
        """The next slot in request order, once it is answered; None when the reader is done and every slot is out."""
        await self._take_turns("taken")
        try:
            try:
                slot = self._receive.receive_nowait()  # no pass of the scheduler when one is there
            except trio.WouldBlock:
                slot = await self._receive.receive()
        except trio.EndOfChannel:
            return None
        if not slot.done.is_set():
            await slot.done.wait()
        metrics.count(metrics.INFLIGHT, (), -1)
        self.inflight -= 1
        self._capacity.release()
        return slot

    def abandon(self) -> None:
        """The connection ended: the slots still placed will never be written."""
        metrics.count(metrics.INFLIGHT, (), -self.inflight)
        self.inflight = 0
