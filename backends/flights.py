"""Identical reads in flight at once, sent once: the answer is shared by every client that asked.

When a broker dies, every client asks for Metadata again and again; a hundred
clients behind one kfan would make a hundred broker requests of each round,
and kfan's own refreshes would add to them. A request whose route shares
answers (``Route.shares_answers``) and whose version and body equal one
already out to a broker waits for that one's answer instead of being sent:
the same :class:`~backends.link.Pending`, with one more waiter (whoever is
done with it last lets it go, :meth:`proxy.server.fetches.Fetches.done_with`).
The answer was asked for no earlier than the request that joins it was
received, less one broker round trip: what a client gets is as fresh as an
answer to its own request could be, give or take that trip.

Flights are kfan's (one table per process, shared by its connections), keyed
by API key, version and body; the client's header (its client id) is not
part of the key: brokers do not answer a Metadata request by who asks.
"""

from __future__ import annotations

from backends.link import Pending
from proxy.runtime import metrics

FlightKey = tuple[int, int, bytes]

# At most this many flights are remembered: beyond it (a client asking for
# thousands of different topic lists at once) requests are simply sent.
MAX_FLIGHTS = 1024


class Flights:
    def __init__(self) -> None:
        self._out: dict[FlightKey, Pending] = {}
        self._key_of: dict[int, FlightKey] = {}  # by id of the Pending

    def join(self, key: FlightKey, avoid: int | None = None) -> Pending | None:
        """The answer to come of an identical request already out, now waited for by one more; None when there is
        none, or when it is out to broker ``avoid`` (one that just failed the request that asks again)."""
        pending = self._out.get(key)
        if pending is None or pending.broker == avoid:
            return None
        if pending.done_at is not None or pending.dropped or pending.waiters <= 0:
            self.landed(pending)  # answered (or given up): later requests ask afresh
            return None
        pending.waiters += 1
        metrics.SHARED_ANSWERS.labels(str(key[0])).inc()
        return pending

    def lead(self, key: FlightKey, pending: Pending) -> None:
        """``pending`` went out for ``key``: identical requests may join it until it lands."""
        if key in self._out or len(self._out) >= MAX_FLIGHTS or pending.done_at is not None:
            return
        self._out[key] = pending
        self._key_of[id(pending)] = key

    def landed(self, pending: Pending) -> None:
        """``pending``'s answer (or failure) is in: it is no longer a flight to join."""
        key = self._key_of.pop(id(pending), None)
        if key is not None and self._out.get(key) is pending:
            del self._out[key]

    def __len__(self) -> int:
        return len(self._out)
