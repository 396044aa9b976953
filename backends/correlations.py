"""Correlation-id bookkeeping for one broker link, with no I/O.

A link numbers the requests it sends with its own correlation ids and must
match each response to whoever waits for it. That bookkeeping is kept apart
from the link's sockets and tasks so it can be tested alone, answer by
answer, the way Kroxylicious keeps its per-connection ``CorrelationManager``
apart from its Netty handlers: the rules below are subtle enough to deserve
their own tests, and none of them needs a stream or a task.

The rules:

* Ids are handed out in order from 0, wrapping at 2**31 - 1 (correlation ids
  are non-negative int32s).
* A request that expects an answer is *waiting* until its answer comes.
* A request that expects none (an acks=0 Produce) has no waiter. Real brokers
  never answer it; some (librdkafka's mock cluster) do. So it is remembered as
  *unanswered*: an answer to it is skipped, not mistaken for an unknown id.
  Brokers answer in request order, so an answer to a request sent later
  proves the earlier unanswered ones will never be answered; they are
  forgotten then, and the table stays bounded.
* Any other id is unknown: the broker is confused, and the link must fail.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")

_MAX_CID = 0x7FFFFFFF


class UnknownCorrelationId(LookupError):
    """An answer with a correlation id no request on the link was sent with (or one already answered)."""

    def __init__(self, correlation_id: int) -> None:
        super().__init__(correlation_id)
        self.correlation_id = correlation_id


class Correlations(Generic[T]):
    """Correlation ids of one link: who waits for which answer."""

    __slots__ = ("_next", "_seq", "_waiting", "_unanswered")

    def __init__(self, first: int = 0) -> None:
        self._next = first & _MAX_CID
        self._seq = 0  # submission sequence: unlike ids, never wraps
        self._waiting: dict[int, tuple[int, T]] = {}  # id -> (sequence, waiter)
        # Ids of requests sent expecting no answer -> their sequence. Kept in
        # submission order (dicts keep insertion order; entries are only removed).
        self._unanswered: dict[int, int] = {}

    def add(self, waiter: T | None) -> int:
        """The id for the next request; ``waiter`` receives its answer, None when none is expected."""
        cid = self._next
        self._next = (cid + 1) & _MAX_CID
        self._seq += 1
        if waiter is not None:
            self._waiting[cid] = (self._seq, waiter)
        else:
            self._unanswered[cid] = self._seq
        return cid

    def answer(self, correlation_id: int) -> T | None:
        """Who waits for this answer (now no longer waiting); None for an answer to a request that expected none.

        Raises :class:`UnknownCorrelationId` for any other id.
        """
        entry = self._waiting.pop(correlation_id, None)
        if entry is None:
            if self._unanswered.pop(correlation_id, None) is not None:
                return None
            raise UnknownCorrelationId(correlation_id)
        seq, waiter = entry
        if self._unanswered:
            retired = []
            for cid, s in self._unanswered.items():
                if s > seq:
                    break
                retired.append(cid)
            for cid in retired:
                del self._unanswered[cid]
        return waiter

    def take_all(self) -> list[T]:
        """Everyone still waiting, in submission order; the table is emptied (the link failed)."""
        waiters = [w for _, w in self._waiting.values()]  # insertion order is submission order
        self._waiting.clear()
        self._unanswered.clear()
        return waiters

    def last_waiter(self) -> T | None:
        """Who waits for the answer to the request submitted last of those still waiting; None: nobody waits."""
        if not self._waiting:
            return None
        return next(reversed(self._waiting.values()))[1]

    @property
    def waiting(self) -> int:
        """How many requests wait for an answer."""
        return len(self._waiting)

    @property
    def unanswered(self) -> int:
        """How many requests sent expecting no answer might still be answered."""
        return len(self._unanswered)

    @property
    def next_id(self) -> int:
        return self._next
