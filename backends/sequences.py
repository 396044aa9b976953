"""An idempotent producer's batches to a partition, kept in the order kfan read them across its links.

A broker reads one connection's requests in order, but two connections'
in any order, and it accepts any sequence number as a producer's first on a
partition. Directly, a client has a partition's batches in flight to a broker
on one connection, and a batch the broker refuses is followed by the refusal
of the later ones it sent (the broker is not the leader, or they are out of
sequence). Through kfan, a partition's batches can go out on two links:

- with ``--broker-ids cluster`` a client sends a partition's Produce on the
  connection of the leader it believes in, so when a leader moves, batches
  sent to the old leader's id and to the new one's meet at kfan, and go on to
  the real leader each on its client connection's own link;
- in either mode, kfan's view of the leaders can change between two requests
  of one connection, so the earlier goes to the old leader, the later to the
  new one.

A later batch written first makes the earlier one fail for good
(OUT_OF_ORDER_SEQUENCE_NUMBER). So a Produce sub-request carrying a
producer's batches for a partition waits, before it is sent, until the one
read before it for that producer and partition on another link is answered,
and is not sent when the client will send that one again (kfan did not send
it, its broker failed, or refused it with an error Kafka's clients retry)
and it carries a later sequence of the same producer epoch: kfan answers it
as not written (NOT_LEADER_OR_FOLLOWER), and the client sends both again in
its order. So is a batch that waited :data:`HOLD_S` (its connection's later
answers wait behind it); the client's retry of it waits for the same one.

On the same link the broker keeps the order itself, and refuses a batch
after one it refused, with one exception: the producer's first batch there.
kfan can learn a new leader from any broker's metadata before the new
leader has taken the partition over itself, and its link to it is already
open. The new leader may then refuse the first batch (NOT_LEADER_OR_FOLLOWER)
and, a moment later, accept the next one as the producer's first, since it
holds no state for it yet; the first batch, sent again, then fails for good.
So on its link, a batch also waits for the one before it when that one
opened the link for its producer and partition (nothing before it, or the
one before went on another link or was not sent): one round trip, once per
producer, partition and link. The same holds while the broker refuses: a
batch sent again after the opening one was refused may itself be taken as
the producer's first, so the one behind it waits for its answer too, until
the broker writes one.

A batch kfan answers itself as not written (no leader known, or its
leader's link down) takes its turn too, as one not sent: a client pipelines
a partition's batches, and kfan may find the leader between two of them.
Without it, the next batch would be sent as the producer's first.

Process-wide (per worker): a client's connections that reach another kfan
process are not ordered here (README, Limitations).

Boundaries: bookkeeping and the wait; which partitions carry whose batches,
and what a broker's answer refused, are :mod:`proxy.core.produce`'s;
the sending is the dispatcher's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import trio

from proxy.core.layout import TopicPartition
from proxy.core.produce import ProducerBatch, ProducerPartition

from .pending import Pending

# A turn over is remembered this long after it was taken: a client sends a refused batch again within its retry
# backoff (Kafka's clients: at most 1 s by default) once it has the partition's leader, so a later batch that
# comes in the meantime finds it. Reading the answers is left to the turns that need it: none are read to sweep.
KEPT_S = 60.0
MAX_KEPT = 20_000  # turns over beyond this are forgotten at once, oldest first
# The longest a batch waits for the one before it. The earlier batch can wait at its leader for as long as its own
# timeout (acks=all while a dead follower is still in the ISR), and the client connection waits with it: no request
# of it is read meanwhile (it may carry the same partition's next batch), and every answer after it waits for its
# own (a Metadata answer among them). So the holds of the requests a client pipelines add up: five (Kafka's
# clients' default in flight) make 10 s, a third of the 30 s Kafka's clients give a request. At the bound the batch
# is answered as not written, and the client sends it again behind the earlier one (librdkafka drains the partition
# first, Java waits its turn).
HOLD_S = 2.0

# Why a batch was not sent (:func:`in_turn`).
NOT_SENT = "a Produce not sent: its producer sends an earlier batch for a partition again"
HELD_TOO_LONG = "a Produce held back too long behind its producer's earlier batches"

_NONE: Mapping[ProducerPartition, Turn] = MappingProxyType({})

# The partitions a broker's answer refused with an error the client retries; None: every partition.
ReadSentAgain = Callable[[bytes | memoryview], set[TopicPartition] | None]


class Turn:
    """One sub-request's place in its partitions' order: the link it goes on, its batches, and its answer."""

    __slots__ = (
        "link",
        "batches",
        "opening",
        "follows",
        "held_behind",
        "pending",
        "settled",
        "at",
        "_read_sent_again",
        "_read",
        "_sent_again",
        "_answer",
    )

    def __init__(self, link: object, batches: Mapping[ProducerPartition, ProducerBatch], read_sent_again: ReadSentAgain) -> None:
        self.link = link
        self.batches = batches
        self.opening: set[ProducerPartition] = set()  # its producers' first batches on its link: the next there waits
        # The turn before it on its link that opened it, or may have: if the broker refused that one, this one
        # may be the producer's first there. Kept while it is its partitions' latest turn.
        self.follows: dict[ProducerPartition, Turn] = {}
        self.held_behind: Mapping[ProducerPartition, Turn] = _NONE  # given up on: the turns still out it waited for
        self.pending: Pending | None = None
        self.settled = trio.Event()  # sent (``pending`` set), or given up without being sent
        self.at = trio.current_time()
        self._read_sent_again = read_sent_again
        self._read = False
        self._sent_again: set[TopicPartition] | None = None  # once read; None: every partition
        self._answer: bytes | memoryview | None = None  # kept when read: the pending answer is dropped once used

    def sent(self, pending: Pending | None) -> None:
        """Sent as ``pending`` (None: not sent); those after it now wait for its answer only."""
        self.pending = pending
        self.settled.set()

    def landed(self, answer: bytes | memoryview) -> None:
        """Its answer, as the request's owner reads it (before the pending answer is let go): what it refused
        is read from it only if a later turn asks."""
        if not self._read:
            self._answer = answer

    @property
    def unsent(self) -> bool:
        """Whether it was given up without being sent."""
        return self.pending is None and self.settled.is_set()

    @property
    def over(self) -> bool:
        """Whether its outcome is known: not sent, or answered (or failed)."""
        return self.settled.is_set() and (self.pending is None or self.pending.is_done)

    def sent_again(self, key: ProducerPartition) -> bool:
        """Whether the client sends this turn's batch for ``key`` again: kfan did not send it, its broker failed,
        or the broker refused it with an error the client retries (call once :attr:`over`)."""
        if not self._read:
            self._read = True
            answer = self._answer
            pending = self.pending
            if answer is None and pending is not None and pending.is_done and pending.failure is None:
                answer = pending.value()
            self._sent_again = None if answer is None else self._read_sent_again(answer)
            self._answer = None
        return self._sent_again is None or key[1:] in self._sent_again

    def may_open(self, key: ProducerPartition) -> bool:
        """Whether the broker may write this turn's batch for ``key`` as its producer's first on this turn's link:
        it opened the link, or followed one that may have and that the broker refused (or has not yet answered)."""
        if key in self.opening:
            return True
        prior = self.follows.get(key)
        return prior is not None and (not prior.over or prior.sent_again(key))

    async def wait(self) -> None:
        await self.settled.wait()
        if self.pending is not None:
            await self.pending.answered()


class ProducerSequences:
    """The latest turn per producer and partition: kept while in progress, and for :data:`KEPT_S` after it was
    taken, up to :data:`MAX_KEPT`; the rest are swept as the table grows (at most twice what was left after the
    last sweep, and never less than :data:`SWEEP_FROM`)."""

    SWEEP_FROM = 1024

    def __init__(self) -> None:
        self._last: dict[ProducerPartition, Turn] = {}
        self._sweep_at = self.SWEEP_FROM

    def take_turn(
        self, batches: Mapping[ProducerPartition, ProducerBatch], link: object, read_sent_again: ReadSentAgain
    ) -> tuple[Turn, list[tuple[ProducerPartition, Turn]]]:
        """A turn for a sub-request to go on ``link``, and the turns before it that decide whether it may go:
        wait until each is :attr:`~Turn.over`, then ask :func:`out_of_order`.

        Call :meth:`Turn.sent` on it whatever happens next: until then, those after it wait.
        """
        turn = Turn(link, batches, read_sent_again)
        before: list[tuple[ProducerPartition, Turn]] = []
        last = self._last
        for key in batches:
            prior = last.get(key)
            if prior is None or prior.link is not link or prior.unsent:
                turn.opening.add(key)
                if prior is not None:
                    before.append((key, prior))
                    if (out := prior.held_behind.get(key)) is not None:
                        before.append((key, out))  # the client sends ``prior`` again: it still comes after that one
            elif prior.may_open(key):
                # The broker may have refused that one as not yet the leader, and take this one as the first.
                before.append((key, prior))
                turn.follows[key] = prior
            # Else the broker reads this one after the one before it, and refuses it as it refused that one.
            if prior is not None:
                prior.follows.pop(key, None)  # no longer the latest: nothing asks it again
            last[key] = turn
        if len(last) >= self._sweep_at:
            self._sweep()
        return turn, before

    def not_sent(self, batches: Mapping[ProducerPartition, ProducerBatch]) -> None:
        """Batches kfan answered itself as not written: the client sends them again, so they keep their place."""
        turn, _ = self.take_turn(batches, None, _never_read)
        turn.sent(None)

    def _sweep(self) -> None:
        now = trio.current_time()
        kept = {k: t for k, t in self._last.items() if not t.over or now - t.at < KEPT_S}
        if len(kept) > MAX_KEPT:
            live = {k: t for k, t in kept.items() if not t.over}
            over = sorted(((k, t) for k, t in kept.items() if t.over), key=lambda kt: kt[1].at)
            kept = {**live, **dict(over[len(over) - max(0, MAX_KEPT - len(live)) :])}
        self._last = kept
        self._sweep_at = max(self.SWEEP_FROM, 2 * len(kept))

    def __len__(self) -> int:
        return len(self._last)


def _never_read(_: bytes | memoryview) -> set[TopicPartition] | None:
    raise AssertionError("a turn not sent has no answer to read")


async def in_turn(turn: Turn, before: list[tuple[ProducerPartition, Turn]], deadline: float) -> str | None:
    """Until ``turn`` may be sent, once the turns in ``before`` are over (:func:`wait_for`): None when it may, else
    why not (:data:`NOT_SENT`, :data:`HELD_TOO_LONG`); it is then answered as not written."""
    over = [(key, prior) for key, prior in before if prior.over]
    if len(over) == len(before):
        return NOT_SENT if out_of_order(turn, before) else None  # the usual case: no pass of the scheduler for it
    if out_of_order(turn, over):  # the client sends an earlier batch again whatever the others' answers
        why = NOT_SENT
    elif await wait_for(before, deadline):
        return NOT_SENT if out_of_order(turn, before) else None
    else:
        why = HELD_TOO_LONG
    # Given up on while some are still out: the client's retry of it waits for those too.
    turn.held_behind = {key: prior for key, prior in before if not prior.over}
    return why


async def wait_for(before: list[tuple[ProducerPartition, Turn]], deadline: float) -> bool:
    """Until every turn in ``before`` is over; False when ``deadline`` (trio clock) or :data:`HOLD_S` came first."""
    if all(prior.over for _, prior in before):
        return True
    with trio.move_on_at(min(deadline, trio.current_time() + HOLD_S)):
        for _, prior in before:
            await prior.wait()
        return True
    return False


def out_of_order(turn: Turn, before: list[tuple[ProducerPartition, Turn]]) -> bool:
    """Whether ``turn`` carries a later batch of a producer epoch whose earlier batch the client sends again."""
    for key, prior in before:
        epoch, sequence = turn.batches[key]
        prior_epoch, prior_sequence = prior.batches[key]
        if epoch == prior_epoch and sequence > prior_sequence and prior.sent_again(key):
            return True
    return False
