"""One client connection's memory between its Fetches (trio).

:class:`Fetches` keeps what one Fetch leaves for the next: the watermarks
each partition's leader last reported (a partition whose broker has not
answered yet reports them), and the sub-fetch out to each broker that no
client answer used yet (:class:`proxy.core.fetch.InflightFetches`): sent
ahead while the client reads an answer, still long-polling when a Fetch was
answered without it, or asked again. The next Fetch asking exactly the same
reuses it, so a slow broker's data arrives at all while a fast one keeps
answering first. It also keeps the connection's share sessions (KIP-932), as
the core maps them onto the brokers' (:mod:`proxy.core.share`).

A sub-fetch its Fetch was answered without stays at most
:data:`FETCH_AHEAD_TTL` after its answer came, then goes with its bytes; and
a Fetch's sub-fetches are sent only once the connection's budget has room
for what their answers may bring.

Boundaries: the decisions are the core's (:mod:`proxy.core.fetch`); this
class keeps their state and sends what they say on the connection's Fetch
lane. Watermarks are written here only, from a
:class:`~proxy.core.RememberWatermarks` effect (:mod:`.effects`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping

import trio

from backends.link import Pending
from backends.links import Lane, LinkPool
from proxy.core import BrokerAnswer, Destination, Failed, FetchAhead, FetchForward, ShareKey, ShareSession, Watermarks, share
from proxy.core.fetch_wait import InflightFetches, answer_ceilings
from proxy.core.layout import TopicPartition
from proxy.runtime.budget import Budget
from proxy.server.gather import Handles

# How long an answered, unused sub-fetch may stand in for a new one: the
# client's next Fetch normally follows at once; older data is fetched afresh.
FETCH_AHEAD_TTL = 1.0


def _answered_at(pending: Pending) -> float | None:
    """When a sub-fetch's answer came, for :class:`InflightFetches`; a dropped one is as good as expired."""
    return -math.inf if pending.dropped else pending.done_at


def _evicted(pending: Pending) -> None:
    """A kept sub-fetch was replaced or expired: unless a Fetch still waits for it, nobody will read its answer."""
    if pending.waiters == 0:
        pending.abandon()


class Fetches:
    """One client connection's Fetch memory: kept sub-fetches and the watermarks last reported."""

    def __init__(self, links: LinkPool, budget: Budget | None = None, nursery: trio.Nursery | None = None) -> None:
        """``budget``: the connection's (its links count answers against it); ``nursery``: where sub-fetches
        kept unused are expired (without one, only the next Fetch drops them)."""
        self._links = links
        self._budget = budget
        self._nursery = nursery
        self._watermarks: dict[TopicPartition, Watermarks] = {}
        # At most share.MAX_SESSIONS_PER_CONNECTION: the core opens no more.
        self._share_sessions: dict[ShareKey, ShareSession] = {}
        self._kept = InflightFetches[Pending](_answered_at, FETCH_AHEAD_TTL, _evicted)
        self._expiring: dict[int, tuple[Pending, trio.CancelScope]] = {}  # per broker: the kept sub-fetch watched

    @property
    def watermarks(self) -> Mapping[TopicPartition, Watermarks]:
        """Each partition's watermarks as its leader last reported them on this connection (what planning reads)."""
        return self._watermarks

    def remember_watermarks(self, watermarks: Mapping[TopicPartition, Watermarks]) -> None:
        self._watermarks.update(watermarks)

    @property
    def share_sessions(self) -> Mapping[ShareKey, ShareSession]:
        """The connection's share sessions (KIP-932) with kfan, each mapped onto the brokers' (what planning reads)."""
        return self._share_sessions

    def keep_share_session(self, key: ShareKey, session: ShareSession | None) -> None:
        if session is None:
            self._share_sessions.pop(key, None)
        else:
            self._share_sessions[key] = session

    def reopen_share_sessions(self, key: ShareKey, brokers: frozenset[int]) -> None:
        if (session := self._share_sessions.get(key)) is not None:
            self._share_sessions[key] = share.reopened(session, brokers)

    def reuse(self, broker: int, key: Hashable, hung_after: float) -> Pending | None:
        """The sub-fetch already out to ``broker`` asking exactly ``key``, now waited for by one more Fetch."""
        reuse = self._kept.reusable(broker, key, trio.current_time(), hung_after)
        if reuse is None:
            return None
        if reuse.hung:
            # Far past any max_wait: closing the link fails this sub-fetch
            # (a retriable error) and the next Fetch opens a fresh one.
            self._links.close(broker, Lane.FETCH)
        reuse.handle.waiters += 1  # kept from expiring while this Fetch uses it
        return reuse.handle

    async def send(self, plan: FetchForward, fresh: list[tuple[Destination, int]], out: Handles) -> None:
        """Send the sub-fetches ``fresh`` names (destination, broker) into ``out``, once there is room for their answers."""
        ceilings = answer_ceilings(plan)
        budget = self._budget
        room = 0
        if fresh and budget is not None:
            # Room for what the answers may bring is set aside before the
            # sub-fetches go, until the answers come: a client that does not
            # read its answers (its unwritten responses fill the budget), or
            # pipelines Fetches faster than they are answered, waits here, in
            # the reader, so TCP pushes back. Clients send one Fetch per
            # connection at a time, which always passes: it costs them nothing.
            room = await budget.reserve(sum(ceilings.get(d, 0) for d, _ in fresh), own=plan.cost)
        for destination, broker in fresh:
            link = await self._links.link_when_ready(broker, Lane.FETCH)
            if link is None:
                out[destination] = Failed(plan.route.failure.code(written=False))
                continue
            out[destination] = pending = link.submit(plan.subs[destination])
            self._kept.record(broker, plan.keys[destination], pending, trio.current_time())
            if room and budget is not None:
                share = min(room, ceilings.get(destination, 0))
                pending.reserve(budget, share)
                room -= share
        if room and budget is not None:
            budget.unreserve(room)  # a broker with no link: its room goes back

    def ask_again(self, plan: FetchForward, destination: Destination) -> Pending | None:
        """Send a sub-fetch again (it came back empty inside its Fetch's max_wait); None without a link."""
        assert isinstance(destination, int)
        link = self._links.link(destination, Lane.FETCH)
        if link is None:
            return None
        pending = link.submit(plan.subs[destination])
        self._kept.record(destination, plan.keys[destination], pending, trio.current_time())
        return pending

    def settle(self, used: Mapping[Destination, Pending | Failed], answers: Mapping[Destination, BrokerAnswer]) -> None:
        """A Fetch was answered from these: what went to the client is spent; what is still out stays."""
        self._kept.settle(used, answers)

    def fetch_ahead(self, ahead: FetchAhead) -> None:
        """Send the next sub-fetches now, while the client reads this answer: its next Fetch finds them on the way."""
        now = trio.current_time()
        for broker, (sub, key) in ahead.subs.items():
            if self._kept.holds(broker):
                continue  # a sub-fetch still out there keeps its place for the next Fetch
            link = self._links.link(broker, Lane.FETCH)
            if link is not None:
                pending = link.submit(sub)
                pending.waiters = 0  # no Fetch waits for it yet
                self._kept.record(broker, key, pending, now)
                self._expire_later(pending)

    def done_with(self, pendings: Iterable[Pending]) -> None:
        """A request no longer waits for these: a sub-fetch still kept goes after its time; any other answer goes now."""
        for pending in {id(p): p for p in pendings}.values():
            pending.waiters -= 1
            if pending.waiters > 0:
                continue  # another request waits for it too (pipelined Fetches asking the same)
            if self._kept.kept(pending.broker, pending):
                self._expire_later(pending)
            else:
                pending.abandon()

    def _expire_later(self, pending: Pending) -> None:
        """Drop a kept sub-fetch's answer once it is :data:`FETCH_AHEAD_TTL` old and unused; one watch per broker."""
        if self._nursery is None:
            return
        watched = self._expiring.get(pending.broker)
        if watched is not None:
            if watched[0] is pending:
                return
            watched[1].cancel()  # that one is no longer kept: dropped when it was replaced
        scope = trio.CancelScope()
        self._expiring[pending.broker] = (pending, scope)
        self._nursery.start_soon(self._expire, pending, scope)

    async def _expire(self, pending: Pending, scope: trio.CancelScope) -> None:
        broker, kept = pending.broker, self._kept
        try:
            with scope:
                await pending.answered()
                while (at := kept.expires_at(broker, pending)) is not None:
                    await trio.sleep_until(at)
                    if pending.waiters == 0 and kept.expire(broker, pending, trio.current_time()):
                        return
                    # A Fetch uses it now: that Fetch settles it. Look again later, should it stay.
                    await trio.sleep(FETCH_AHEAD_TTL)
        finally:
            if self._expiring.get(broker, (None,))[0] is pending:
                del self._expiring[broker]
