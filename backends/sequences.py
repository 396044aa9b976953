"""An idempotent producer's batches to a partition, kept in the order kfan read them across client connections.

A broker reads one connection's requests in order, but two connections'
in any order, and it accepts any sequence number as a producer's first on a
partition. Directly, a client has a partition's batches in flight to one
broker on one connection. Through kfan they can be on two: with
``--broker-ids cluster`` a client sends a partition's Produce on the
connection of the leader it believes in, so when a leader moves, batches
sent to the old leader's id and to the new one's meet at kfan, which sends
both on to the real leader, each on its client connection's own link. A
later batch written first makes the earlier one fail for good
(OUT_OF_ORDER_SEQUENCE_NUMBER). So a Produce sub-request carrying a
producer's batches for a partition waits, before it is sent, until the one
read before it for that producer and partition on another link is answered.
On the same link it does not wait: the broker keeps that order itself.

Process-wide (per worker): a client's connections that reach another kfan
process are not ordered here (README, Limitations).

Boundaries: bookkeeping and the wait; which partitions carry whose batches is
:func:`proxy.core.produce.sequenced`'s, and the sending is the dispatcher's.
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

from proxy.core.produce import ProducerPartition

from .pending import Pending


class Turn:
    """One sub-request's place in its partitions' order: the link it goes on, and its answer once sent."""

    __slots__ = ("link", "pending", "settled")

    def __init__(self, link: object) -> None:
        self.link = link
        self.pending: Pending | None = None
        self.settled = trio.Event()  # sent (``pending`` set), or given up without being sent

    def sent(self, pending: Pending | None) -> None:
        """Sent as ``pending`` (None: not sent); those after it now wait for its answer only."""
        self.pending = pending
        self.settled.set()

    @property
    def over(self) -> bool:
        """Whether nothing after it needs to wait for it any more."""
        return self.settled.is_set() and (self.pending is None or self.pending.is_done)

    async def wait(self) -> None:
        await self.settled.wait()
        if self.pending is not None:
            await self.pending.answered()


class ProducerSequences:
    """The latest sub-request per producer and partition. Entries whose turn is over are swept as the table
    grows (at most twice what was left after the last sweep, and never less than :data:`SWEEP_FROM`), so what
    it holds is bounded by the Produce requests in flight."""

    SWEEP_FROM = 1024

    def __init__(self) -> None:
        self._last: dict[ProducerPartition, Turn] = {}
        self._sweep_at = self.SWEEP_FROM

    def take_turn(self, partitions: Iterable[ProducerPartition], link: object) -> tuple[Turn, list[Turn]]:
        """A turn for a sub-request to go on ``link``, and the turns on other links it must wait for first.

        Call :meth:`Turn.sent` on it whatever happens next: until then, those after it wait.
        """
        turn = Turn(link)
        before: list[Turn] = []
        last = self._last
        for key in partitions:
            prior = last.get(key)
            if prior is not None and prior.link is not link and not prior.over:
                before.append(prior)
            last[key] = turn
        if len(last) >= self._sweep_at:
            self._sweep()
        return turn, before

    def _sweep(self) -> None:
        self._last = {k: t for k, t in self._last.items() if not t.over}
        self._sweep_at = max(self.SWEEP_FROM, 2 * len(self._last))

    def __len__(self) -> int:
        return len(self._last)


async def wait_for(turns: list[Turn], deadline: float) -> bool:
    """Until every turn in ``turns`` is over; False when ``deadline`` (trio clock) came first."""
    with trio.move_on_at(deadline):
        for turn in turns:
            await turn.wait()
        return True
    return False
