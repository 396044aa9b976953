"""One client connection's requests on their way to the brokers and back (trio).

:class:`Forwarder` sends a plan's sub-requests over the connection's links
(:class:`backends.links.LinkPool`), waits for the answers (:mod:`.gather`;
a Fetch as :class:`proxy.core.fetch_wait.FetchWait` decides), merges them with the
plan's merge, and applies the reply's effects: the cluster's to the cluster,
remembered watermarks to this connection. It makes no protocol decision of
its own; the connection around it reads requests and writes responses in order.

The brokers' answers count against the connection's budget from their arrival
(:mod:`backends.link`) until their request's reply is merged (the response
then counts as itself) or they are dropped. A sub-fetch its Fetch was answered
without stays for the next Fetch at most :data:`FETCH_AHEAD_TTL` after its
answer came, then goes with its bytes; and a Fetch is sent only when the
connection has room for what its answers may bring.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterable, Mapping

import trio

from backends.cluster import Cluster
from backends.link import LinkError, Pending
from backends.links import Lane, LinkPool
from backends.sasl import AuthenticationFailed

from . import metrics
from .budget import Budget
from .core import (
    ANY_BROKER,
    BrokerAnswer,
    BrokerUnavailable,
    Context,
    Destination,
    Failed,
    FetchAhead,
    FetchForward,
    Forward,
    Identity,
    LocalReply,
    NeedCoordinators,
    Plan,
    RememberWatermarks,
    Reply,
    Response,
    Watermarks,
    plan_request,
)
from .core.fetch_wait import FetchWait, InflightFetches, answer_ceilings
from .core.layout import TopicPartition
from .gather import FETCH_GRACE, gather, gather_fetch
from .kafka import errors

log = logging.getLogger("kfan.connection")

# How long an answered, unused sub-fetch may stand in for a new one: the
# client's next Fetch normally follows at once; older data is fetched afresh.
FETCH_AHEAD_TTL = 1.0

Handles = dict[Destination, Pending | Failed]
Answers = Mapping[Destination, BrokerAnswer]


def _answered_at(pending: Pending) -> float | None:
    """When a sub-fetch's answer came, for :class:`InflightFetches`; a dropped one is as good as expired."""
    return -math.inf if pending.dropped else pending.done_at


def _evicted(pending: Pending) -> None:
    """A kept sub-fetch was replaced or expired: unless a Fetch still waits for it, nobody will read its answer."""
    if pending.waiters == 0:
        pending.abandon()


class Forwarder:
    def __init__(
        self,
        cluster: Cluster,
        links: LinkPool,
        identity: Identity,
        *,
        request_timeout: float,
        max_hold: float,
        client: int,
        client_identity: bool = False,
        validate_records: bool = True,
        fetch_ahead_bytes: int = 0,
        budget: Budget | None = None,
        nursery: trio.Nursery | None = None,
    ) -> None:
        """``client_identity``: the links log in as the client, so a refused login is the client's (error 58), not a broker failure.

        ``budget``: the connection's (its links count answers against it); ``nursery``: where sub-fetches
        kept unused are expired (without one, only the next Fetch drops them).
        """
        self.budget = budget
        self._nursery = nursery
        self.cluster = cluster
        self.client_identity = client_identity
        self.validate_records = validate_records
        self.fetch_ahead_bytes = fetch_ahead_bytes
        self.identity = identity
        self.links = links
        self.request_timeout = request_timeout  # beyond the time the request itself allows the broker
        self.max_hold = max_hold
        self.client = client  # the connection's id, for the log
        # Each partition's watermarks as its leader last reported them on this connection.
        self.watermarks: dict[TopicPartition, Watermarks] = {}
        self._inflight_fetches = InflightFetches[Pending](_answered_at, FETCH_AHEAD_TTL, _evicted)
        self._expiring: dict[int, tuple[Pending, trio.CancelScope]] = {}  # per broker: the kept sub-fetch watched

    async def plan(self, payload: bytes | memoryview) -> tuple[Context, LocalReply | Forward]:
        """Plan one request, learning what the plan needs first (the context it was planned with too).

        Waits in the connection's reader on purpose: later requests wait with
        it, so each broker gets this client's requests in the client's order.
        """
        plan: Plan = plan_request(ctx := self._context(), payload)
        if isinstance(plan, LocalReply | Forward) and plan.unknown_topics:
            # Topics created since the last refresh: a broker would know them.
            await self.cluster.refresh(timeout=2.0)
            plan = plan_request(ctx := self._context(), payload)
        if isinstance(plan, NeedCoordinators):
            # A batch naming groups or transactions kfan has not seen: one bulk lookup, then plan by broker.
            await self.links.coordinators.find(plan.coordinators)
            plan = plan_request(ctx := self._context(coordinators_looked_up=True), payload)
        assert not isinstance(plan, NeedCoordinators)
        return ctx, plan

    def _context(self, coordinators_looked_up: bool = False) -> Context:
        cluster = self.cluster
        return Context(
            self.identity,
            cluster.topology,
            cluster.api_versions,
            self.links.coordinators.known,  # kfan's shared view, or this connection's own (its client's identity)
            coordinators_looked_up,
            self.watermarks,
            self.validate_records,
            self.fetch_ahead_bytes,
            cluster.rack,
            # One clock reading per request, not one per partition it names.
            functools.partial(cluster.read_replicas.get, now=trio.current_time()),
            self.client_identity,
        )

    def broker_wait(self, plan: Forward) -> float:
        """Seconds the request lets a broker take, by its own fields, capped by ``max_hold``."""
        return min(plan.broker_wait_ms / 1000, self.max_hold)

    async def submit(self, plan: Forward) -> Handles:
        """Send every sub-request now, in order; coordinators are resolved first."""
        out: Handles = {}
        fetch = isinstance(plan, FetchForward)
        fresh: list[tuple[Destination, int]] = []  # sub-fetches to send, once there is room for their answers
        for destination, sub in plan.subs.items():
            broker = await self.links.resolve(destination)
            if broker is None:
                out[destination] = Failed(plan.route.failure.code(written=False))
                continue
            if isinstance(broker, Failed):
                out[destination] = broker
                continue
            if isinstance(plan, FetchForward):
                hung_after = self.request_timeout + self.broker_wait(plan)
                reuse = self._inflight_fetches.reusable(broker, plan.keys[destination], trio.current_time(), hung_after)
                if reuse is not None:
                    if reuse.hung:
                        # Far past any max_wait: closing the link fails this sub-fetch
                        # (a retriable error) and the next Fetch opens a fresh one.
                        self.links.close(broker, Lane.FETCH)
                    reuse.handle.waiters += 1  # kept from expiring while this Fetch uses it
                    out[destination] = reuse.handle
                    continue
                fresh.append((destination, broker))
                continue
            if destination is ANY_BROKER and self.links.link(broker, Lane.MAIN) is None:
                broker = self.links.another_broker(broker) or broker  # any broker will do: one kfan is not backing off from
            link = await self.links.link_when_ready(broker, Lane.MAIN)
            if link is None:
                out[destination] = Failed(plan.route.failure.code(written=False))
                continue
            out[destination] = link.submit(sub)
        if fetch:
            assert isinstance(plan, FetchForward)
            await self._submit_fetches(plan, fresh, out)
        return out

    async def _submit_fetches(self, plan: FetchForward, fresh: list[tuple[Destination, int]], out: Handles) -> None:
        ceilings = answer_ceilings(plan)
        room = 0
        if fresh and self.budget is not None:
            # Room for what the answers may bring is set aside before the
            # sub-fetches go, until the answers come: a client that does not
            # read its answers (its unwritten responses fill the budget), or
            # pipelines Fetches faster than they are answered, waits here, in
            # the reader, so TCP pushes back. Clients send one Fetch per
            # connection at a time, which always passes: it costs them nothing.
            room = await self.budget.reserve(sum(ceilings.get(d, 0) for d, _ in fresh), own=plan.cost)
        for destination, broker in fresh:
            link = await self.links.link_when_ready(broker, Lane.FETCH)
            if link is None:
                out[destination] = Failed(plan.route.failure.code(written=False))
                continue
            out[destination] = pending = link.submit(plan.subs[destination])
            self._inflight_fetches.record(broker, plan.keys[destination], pending, trio.current_time())
            if room and self.budget is not None:
                share = min(room, ceilings.get(destination, 0))
                pending.reserve(self.budget, share)
                room -= share
        if room and self.budget is not None:
            self.budget.unreserve(room)  # a broker with no link: its room goes back

    async def reply(self, plan: Forward, handles: Handles, submitted_at: float) -> tuple[Reply | None, Handles, Answers]:
        """The client's reply (None: no error code of it can say a broker failed), the handles and answers it came from."""
        used: list[Handles] = [handles]
        try:
            return await self._reply(plan, handles, submitted_at, used)
        finally:
            # The answers are merged (the response counts what it keeps of them) or not wanted.
            self._done_with(h for hs in used for h in hs.values() if isinstance(h, Pending))

    async def _reply(
        self, plan: Forward, handles: Handles, submitted_at: float, used: list[Handles]
    ) -> tuple[Reply | None, Handles, Answers]:
        answers, handles = await self._answers(plan, handles, submitted_at)
        used.append(handles)
        reply = self._merge(plan, answers)
        if (reply is None or reply.broker_failed) and ANY_BROKER in plan.subs and plan.route.read_only:
            # Any broker can answer this, and asking again changes nothing: one
            # broker's failure is not worth the client's (a Metadata answer has
            # no error code, so a failure would cost it its connection).
            failed = handles[ANY_BROKER]
            broker = self.links.another_broker(failed.broker if isinstance(failed, Pending) else None)
            link = None if broker is None else self.links.link(broker, Lane.MAIN)
            if link is not None:
                handles = {ANY_BROKER: link.submit(plan.subs[ANY_BROKER])}
                used.append(handles)
                answers, handles = await self._answers(plan, handles, trio.current_time())
                reply = self._merge(plan, answers)
        if reply is not None:
            self.cluster.apply(reply.effects, self.links.coordinators)
            for effect in reply.effects:
                if isinstance(effect, RememberWatermarks):
                    self.watermarks.update(effect.watermarks)
                elif isinstance(effect, FetchAhead):
                    self._fetch_ahead(effect)
        return reply, handles, answers

    async def _answers(self, plan: Forward, handles: Handles, submitted_at: float) -> tuple[dict[Destination, BrokerAnswer], Handles]:
        """The brokers' answers, and the handles they came by (a Fetch may have asked again)."""

        async def receive(destination: Destination, pending: Pending) -> BrokerAnswer:
            try:
                payload = await pending.wait()
            except LinkError as e:
                log.info("client %s: %s", self.client, e)
                if destination is ANY_BROKER:
                    self.links.default_failed(pending.broker)
                if self.client_identity and isinstance(e, AuthenticationFailed):
                    return Failed(errors.SASL_AUTHENTICATION_FAILED)
                self.cluster.request_refresh()
                return Failed(plan.route.failure.code(pending.written))
            if pending.done_at is not None and pending.created_at >= submitted_at:
                latency = pending.done_at - pending.created_at
                metrics.BROKER_LATENCY.labels(str(pending.broker), str(plan.header.api_key)).observe(latency)
            return Response(payload)

        now = trio.current_time()
        if isinstance(plan, FetchForward):
            # A Fetch is answered as a broker would answer it (see core.fetch_wait.FetchWait).
            outstanding = {d for d, h in handles.items() if isinstance(h, Pending)}
            fresh = {d for d in outstanding if handles[d].created_at >= submitted_at}  # type: ignore[union-attr]
            failed = {d: h for d, h in handles.items() if isinstance(h, Failed)}
            wait = FetchWait(plan, now, self.broker_wait(plan), FETCH_GRACE, outstanding, fresh, failed)
            answers, used = await gather_fetch(wait, handles, receive, lambda d: self._ask_again(plan, d), self.watermarks.update)
            self._inflight_fetches.settle(used, answers)
            return answers, used
        # A request that lets the broker take its time (JoinGroup up to its
        # rebalance timeout) gets that long on top of ours.
        answers, late = await gather(handles, receive, now + self.broker_wait(plan) + self.request_timeout)
        for d in late:
            # A broker past every deadline it was given is hung (or stalled
            # mid-answer): close its link, so the next request opens a fresh one.
            pending = handles[d]
            if isinstance(pending, Pending):
                self.links.close(pending.broker, Lane.MAIN)
            answers[d] = Failed(errors.REQUEST_TIMED_OUT)
        return answers, handles

    def _fetch_ahead(self, ahead: FetchAhead) -> None:
        """Send the next sub-fetches now, while the client reads this answer: its next Fetch finds them on the way."""
        now = trio.current_time()
        for broker, (sub, key) in ahead.subs.items():
            if self._inflight_fetches.holds(broker):
                continue  # a sub-fetch still out there keeps its place for the next Fetch
            link = self.links.link(broker, Lane.FETCH)
            if link is not None:
                pending = link.submit(sub)
                pending.waiters = 0  # no Fetch waits for it yet
                self._inflight_fetches.record(broker, key, pending, now)
                self._expire_later(pending)

    def _ask_again(self, plan: FetchForward, destination: Destination) -> Pending | None:
        assert isinstance(destination, int)
        link = self.links.link(destination, Lane.FETCH)
        if link is None:
            return None
        pending = link.submit(plan.subs[destination])
        self._inflight_fetches.record(destination, plan.keys[destination], pending, trio.current_time())
        return pending

    def _done_with(self, pendings: Iterable[Pending]) -> None:
        """A request no longer waits for these: a sub-fetch still kept goes after its time; any other answer goes now."""
        for pending in {id(p): p for p in pendings}.values():
            pending.waiters -= 1
            if pending.waiters > 0:
                continue  # another request waits for it too (pipelined Fetches asking the same)
            if self._inflight_fetches.kept(pending.broker, pending):
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
        broker, kept = pending.broker, self._inflight_fetches
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

    def _merge(self, plan: Forward, answers: Answers) -> Reply | None:
        try:
            return plan.merge(plan, answers)
        except BrokerUnavailable as e:
            log.info("client %s: %s (api_key=%s v%s)", self.client, e, plan.header.api_key, plan.header.api_version)
            return None
