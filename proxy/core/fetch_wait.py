"""When a Fetch is answered, and which sub-fetches in flight the next one reuses:
pure objects the I/O layer drives (:mod:`proxy.server.gather`, :mod:`proxy.server.forwarder`),
on top of :mod:`.fetch`'s planning and merging.

- :class:`FetchWait`: when one Fetch is answered. As a broker would: once
  ``min_bytes`` of records (or an error) are in, or at ``max_wait``; a
  sub-fetch still long-polling an idle broker does not hold back data another
  broker returned. An earlier Fetch's sub-fetch that comes back empty within
  this one's ``max_wait`` is asked again, as a broker keeps waiting.
- :class:`InflightFetches`: per connection, the sub-fetch in flight to each
  broker that no client answer used yet, reused by the next Fetch that asks
  the same (so a slow broker's data arrives at all while a fast one keeps
  answering first); each one it drops unused goes to its ``on_evict``, whose
  answer nobody will read. :func:`answer_ceilings` is what a Fetch's answers may
  hold, for the connection's budget.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..kafka.headers import RequestHeader
from ..kafka.wire import Malformed
from .answers import decode_answer
from .fetch import answer_watermarks
from .layout import TopicPartition
from .plan import NOT_YET, BrokerAnswer, Destination, Failed, FetchForward, Response, Watermarks

# --- what an answer weighs ----------------------------------------------------------------


def weigh(hdr: RequestHeader, answer: BrokerAnswer) -> tuple[int, bool]:
    """One broker's Fetch answer as the waiting sees it: (bytes of records, an error to report)."""
    if isinstance(answer, Failed):
        return 0, True
    if not isinstance(answer, Response):
        return 0, False  # not in yet
    try:
        decoded = decode_answer(hdr, answer.payload)
    except Malformed:
        return 0, True  # a failure to report for that broker's partitions
    if decoded.get("error_code"):
        return 0, True
    total = 0
    for t in decoded["responses"]:
        for p in t["partitions"]:
            if p["error_code"]:
                return 0, True
            total += len(p["records"] or b"")
    return total, False


def enough(weights: Iterable[tuple[int, bool]], min_bytes: int) -> bool:
    """Would a broker answer a Fetch with these answers in (each weighed by :func:`weigh`):
    ``min_bytes`` of records, or an error to report?"""
    total = 0
    for n, error in weights:
        if error:
            return True
        total += n
    return total >= max(min_bytes, 1)


# --- when a Fetch is answered -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AskAgain:
    """An earlier Fetch's sub-fetch came back empty inside this Fetch's max_wait:
    send it again (its watermarks are news all the same)."""

    destination: Destination
    watermarks: Mapping[TopicPartition, Watermarks]


class FetchWait:
    """When one Fetch is answered: a pure state machine over answers and time.

    ``fresh``: the sub-fetches sent for this Fetch (others were still out from
    an earlier one and are reused). They get ``grace`` past the Fetch's
    max_wait (a broker's answer may lag it by the network); older ones none.
    Those still out at the end answer :data:`NOT_YET` and stay for the
    client's next Fetch.
    """

    def __init__(
        self,
        plan: FetchForward,
        now: float,
        max_wait: float,
        grace: float,
        outstanding: set[Destination],
        fresh: set[Destination],
        answers: Mapping[Destination, BrokerAnswer] | None = None,
    ) -> None:
        self.plan = plan
        self.soft = now + max_wait
        self.hard = self.soft + grace
        self.outstanding = set(outstanding)
        self.fresh = set(fresh)
        self.answers: dict[Destination, BrokerAnswer] = {}
        # What the answers asked again carried: news for the connection (it remembers them once this
        # Fetch is answered), and already good enough to report for their partitions while it waits.
        self.learned: dict[TopicPartition, Watermarks] = {}
        # Each answer weighed once as it comes, not again at every wake-up.
        self._weights: dict[Destination, tuple[int, bool]] = {}
        for d, answer in (answers or {}).items():
            self.keep(d, answer)

    def answered(self, destination: Destination, answer: BrokerAnswer, now: float) -> AskAgain | None:
        """Take one broker's answer; an :class:`AskAgain` when it should be asked again instead."""
        self.outstanding.discard(destination)
        weight = weigh(self.plan.header, answer)
        if destination not in self.fresh and now < self.soft and not enough([weight], 1):
            again = AskAgain(destination, answer_watermarks(self.plan, answer))
            self.learned.update(again.watermarks)
            return again
        self.answers[destination] = answer
        self._weights[destination] = weight
        return None

    def asked_again(self, destination: Destination) -> None:
        self.fresh.add(destination)
        self.outstanding.add(destination)

    def keep(self, destination: Destination, answer: BrokerAnswer) -> None:
        """It could not be asked again: its answer stands."""
        self.answers[destination] = answer
        self._weights[destination] = weigh(self.plan.header, answer)

    def wake_at(self, now: float) -> float | None:
        """When to look again if no answer comes; None: answer the client now."""
        if not self.outstanding or now >= self.hard:
            return None
        if self.answers and enough(self._weights.values(), self.plan.min_bytes):
            # Answered early only if every partition still out has watermarks
            # to report (see fetch._finish); at first, wait for all.
            known = self.plan.ctx.watermarks.keys() | self.learned.keys() if self.learned else self.plan.ctx.watermarks.keys()
            if all(self.plan.partitions[d] <= known for d in self.outstanding):
                return None
        if now >= self.soft and not self.outstanding & self.fresh:
            return None
        return self.soft if now < self.soft else self.hard

    def final(self) -> dict[Destination, BrokerAnswer]:
        """Every destination's answer; those still out are :data:`NOT_YET`."""
        return {d: self.answers.get(d, NOT_YET) for d in self.plan.subs}


def answer_ceilings(plan: FetchForward) -> dict[Destination, int]:
    """The most each sub-fetch's answer holds: its ``max_bytes``, or the sum of its partitions'
    ``partition_max_bytes`` when less (before v3, only that sum). A broker may pass it by one
    batch (KIP-74): the answer, once in, is counted as it is."""
    found = plan.state
    layout = found.request_layout
    limit = found.request.get("max_bytes")
    out: dict[Destination, int] = {}
    for destination, sub in found.by_leader.items():
        partitions = sum(p.get("partition_max_bytes", 0) for _, p in layout.entries(sub))
        out[destination] = partitions if limit is None else min(limit, partitions)
    return out


H = TypeVar("H")


@dataclass(frozen=True, slots=True)
class Reuse(Generic[H]):
    handle: H
    hung: bool  # far past any max_wait: close its link, which fails it (a retriable error)


class InflightFetches(Generic[H]):
    """Per client connection, the sub-fetch out to each broker that no client answer used yet.

    ``done_at(handle)``: when its answer came (None: not yet), on the caller's clock.
    ``on_evict(handle)``: a sub-fetch dropped without going to a Fetch (replaced,
    stale, expired); the caller gives back what it holds unless a Fetch still uses it.
    """

    def __init__(self, done_at: Callable[[H], float | None], ttl: float, on_evict: Callable[[H], None] | None = None) -> None:
        self._done_at = done_at
        self._ttl = ttl  # how long an answered, unused sub-fetch may stand in for a new one
        self._on_evict = on_evict
        self._by_broker: dict[int, tuple[Hashable, H, float]] = {}

    def _evict(self, broker: int) -> None:
        _, handle, _ = self._by_broker.pop(broker)
        if self._on_evict is not None:
            self._on_evict(handle)

    def reusable(self, broker: int, wanted: Hashable, now: float, hung_after: float) -> Reuse[H] | None:
        """The sub-fetch already out to ``broker`` for exactly these partitions and offsets."""
        entry = self._by_broker.get(broker)
        if entry is None:
            return None
        key, handle, sent_at = entry
        done_at = self._done_at(handle)
        if done_at is None and now - sent_at > hung_after:
            del self._by_broker[broker]
            return Reuse(handle, hung=True)
        if (done_at is None or now - done_at < self._ttl) and key == wanted:
            return Reuse(handle, hung=False)
        self._evict(broker)
        return None

    def record(self, broker: int, key: Hashable, handle: H, now: float) -> None:
        old = self._by_broker.get(broker)
        if old is not None and old[1] is not handle:
            self._evict(broker)
        self._by_broker[broker] = (key, handle, now)

    def expires_at(self, broker: int, handle: H) -> float | None:
        """When ``handle``, kept for ``broker``, may no longer stand in for a new sub-fetch (None: not kept, or no answer yet)."""
        entry = self._by_broker.get(broker)
        if entry is None or entry[1] is not handle:
            return None
        done_at = self._done_at(handle)
        return None if done_at is None else done_at + self._ttl

    def expire(self, broker: int, handle: H, now: float) -> bool:
        """Drop ``handle`` if it is still kept for ``broker`` and its answer is past the ttl: whether it was."""
        expires = self.expires_at(broker, handle)
        if expires is None or now < expires:
            return False
        self._evict(broker)
        return True

    def kept(self, broker: int, handle: H) -> bool:
        entry = self._by_broker.get(broker)
        return entry is not None and entry[1] is handle

    def settle(self, handles: Mapping[Destination, H | Failed], answers: Mapping[Destination, BrokerAnswer]) -> None:
        """A sub-fetch whose answer went to the client is spent; one still out stays for the next Fetch."""
        for destination, handle in handles.items():
            if answers.get(destination) is NOT_YET or not isinstance(destination, int):
                continue
            entry = self._by_broker.get(destination)
            if entry is not None and entry[1] is handle:
                del self._by_broker[destination]

    def holds(self, broker: int) -> bool:
        return broker in self._by_broker

    def __len__(self) -> int:
        return len(self._by_broker)
