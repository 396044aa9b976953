"""Answers awaited where they land, each under a deadline kept by one timer task per connection (trio).

A request sent to one broker needs no task of its own to wait for its answer: :meth:`AnswerDeadlines.expect`
has the answer's callback run in the link's reader as it lands (:attr:`backends.link.Pending.on_done`), and
the connection's one timer task runs the late callback instead for an answer still out at its deadline. A
task per request (spawned, scheduled, with a deadline scope) cost about a tenth of a small request's CPU.

Boundaries: it knows when, not what: both callbacks are the caller's, and each entry runs exactly one of them,
once. It holds at most about four times the entries still out (finished ones are dropped as it goes).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable

import trio

from backends.link import Pending

Landed = Callable[[Pending], None]


class _Expected:
    __slots__ = ("pending", "landed", "late", "finished")

    def __init__(self, pending: Pending, landed: Landed, late: Landed) -> None:
        self.pending: Pending | None = pending
        self.landed: Landed | None = landed
        self.late: Landed | None = late
        self.finished = False

    def take(self) -> tuple[Pending, Landed, Landed] | None:
        """Its pending answer and both callbacks, once; None after that (it is finished, and holds nothing)."""
        if self.finished:
            return None
        self.finished = True
        pending, landed, late = self.pending, self.landed, self.late
        self.pending = self.landed = self.late = None
        assert pending is not None and landed is not None and late is not None
        pending.on_done = None
        return pending, landed, late


class AnswerDeadlines:
    """One connection's answers awaited where they land, and the timer for those that do not in time."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._heap: list[tuple[float, int, _Expected]] = []
        self._order = itertools.count()  # ties broken by submission, never by comparing entries
        self._out = 0  # entries not finished
        self._timer: trio.CancelScope | None = None
        self._running = False

    def expect(self, pending: Pending, deadline: float, landed: Landed, late: Landed) -> None:
        """``landed(pending)`` when its answer (or failure) is in, or ``late(pending)`` at ``deadline``; one of
        them runs, once. Either may run before this returns: an answer already in is handed over at once."""
        if pending.is_done:
            landed(pending)
            return
        entry = _Expected(pending, landed, late)
        pending.on_done = lambda _: self._run(entry, late=False)
        self._out += 1
        heapq.heappush(self._heap, (deadline, next(self._order), entry))
        if len(self._heap) > 64 and len(self._heap) > 4 * self._out:
            self._heap = [item for item in self._heap if not item[2].finished]
            heapq.heapify(self._heap)
        if not self._running:
            self._running = True
            self._nursery.start_soon(self._time_out)
        elif self._timer is not None and deadline < self._timer.deadline:
            self._timer.deadline = deadline

    def _run(self, entry: _Expected, *, late: bool) -> None:
        taken = entry.take()
        if taken is None:
            return
        self._out -= 1
        pending, on_landed, on_late = taken
        (on_late if late else on_landed)(pending)

    async def _time_out(self) -> None:
        while True:
            heap = self._heap
            while heap and heap[0][2].finished:
                heapq.heappop(heap)
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as self._timer:
                await trio.sleep_forever()
            self._timer = None
            now = trio.current_time()
            heap = self._heap
            while heap and (heap[0][2].finished or heap[0][0] <= now):
                _, _, entry = heapq.heappop(heap)
                self._run(entry, late=True)
