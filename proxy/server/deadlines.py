"""Answers awaited where they land, each under a deadline kept by one timer task per connection (trio).

A request sent to one broker needs no task of its own to wait for its answer: :meth:`AnswerDeadlines.expect`
has the answer's callback run in the link's reader as it lands (:attr:`backends.link.Pending.on_done`), and
the connection's one timer task runs it, told it is late, for an answer still out at its deadline. A task
per request (spawned, scheduled, with a deadline scope) cost about a tenth of a small request's CPU.

Boundaries: it knows when, not what: the callback is the caller's, and runs once per entry. It holds at most
about four times the entries still out (finished ones are dropped as it goes).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable

import trio

from backends.link import Pending

Answer = Callable[[Pending, bool], None]  # (the pending answer, late: its deadline passed first)


class _Expected:
    """One answer awaited; itself the pending answer's ``on_done`` (no closure per request)."""

    __slots__ = ("owner", "pending", "answer")

    def __init__(self, owner: AnswerDeadlines, pending: Pending, answer: Answer) -> None:
        self.owner = owner
        self.pending: Pending | None = pending
        self.answer: Answer | None = answer

    @property
    def finished(self) -> bool:
        return self.answer is None

    def __call__(self, _: Pending) -> None:
        self.owner._run(self, late=False)

    def take(self) -> tuple[Pending, Answer] | None:
        """Its pending answer and callback, once; None after that (it is finished, and holds nothing)."""
        pending, answer = self.pending, self.answer
        if pending is None or answer is None:
            return None
        self.pending = self.answer = None
        pending.on_done = None
        return pending, answer


class AnswerDeadlines:
    """One connection's answers awaited where they land, and the timer for those that do not in time."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._heap: list[tuple[float, int, _Expected]] = []
        self._order = itertools.count()  # ties broken by submission, never by comparing entries
        self._out = 0  # entries not finished
        self._timer: trio.CancelScope | None = None
        self._running = False

    def expect(self, pending: Pending, deadline: float, answer: Answer) -> None:
        """``answer(pending, False)`` when its answer (or failure) is in, or ``answer(pending, True)`` at
        ``deadline``; once. It may run before this returns: an answer already in is handed over at once."""
        if pending.is_done:
            answer(pending, False)
            return
        entry = _Expected(self, pending, answer)
        pending.on_done = entry
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
        pending, answer = taken
        answer(pending, late)

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
