"""One client connection's requests on their way to the brokers and back (trio).

:class:`Forwarder` sends a plan's sub-requests over the connection's links
(:class:`backends.links.LinkPool`), waits for the answers (:mod:`.gather`;
a Fetch as :class:`proxy.core.fetch.FetchWait` decides), merges them with the
plan's merge, and applies the reply's effects: the cluster's to the cluster,
remembered watermarks to this connection. It makes no protocol decision of
its own; the connection around it reads requests and writes responses in order.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping

import trio

from backends.cluster import Cluster
from backends.link import LinkError, Pending
from backends.links import Lane, LinkPool
from backends.sasl import AuthenticationFailed

from . import metrics
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
from .core.fetch import FetchWait, InflightFetches
from .core.layout import TopicPartition
from .gather import FETCH_GRACE, gather, gather_fetch
from .kafka import errors

log = logging.getLogger("kfan.connection")

# How long an answered, unused sub-fetch may stand in for a new one: the
# client's next Fetch normally follows at once; older data is fetched afresh.
FETCH_AHEAD_TTL = 1.0

Handles = dict[Destination, Pending | Failed]
Answers = Mapping[Destination, BrokerAnswer]


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
    ) -> None:
        """``client_identity``: the links log in as the client, so a refused login is the client's (error 58), not a broker failure."""
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
        self._inflight_fetches = InflightFetches[Pending](lambda p: p.done_at, FETCH_AHEAD_TTL)

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
            await self.cluster.coordinators.find(plan.coordinators)
            plan = plan_request(ctx := self._context(coordinators_looked_up=True), payload)
        assert not isinstance(plan, NeedCoordinators)
        return ctx, plan

    def _context(self, coordinators_looked_up: bool = False) -> Context:
        cluster = self.cluster
        return Context(
            self.identity,
            cluster.topology,
            cluster.api_versions,
            cluster.coordinators.known,
            coordinators_looked_up,
            self.watermarks,
            self.validate_records,
            self.fetch_ahead_bytes,
            cluster.rack,
            # One clock reading per request, not one per partition it names.
            functools.partial(cluster.read_replicas.get, now=trio.current_time()),
        )

    def broker_wait(self, plan: Forward) -> float:
        """Seconds the request lets a broker take, by its own fields, capped by ``max_hold``."""
        return min(plan.broker_wait_ms / 1000, self.max_hold)

    async def submit(self, plan: Forward) -> Handles:
        """Send every sub-request now, in order; coordinators are resolved first."""
        out: Handles = {}
        fetch = isinstance(plan, FetchForward)
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
                    out[destination] = reuse.handle
                    continue
            link = self.links.link(broker, Lane.FETCH if fetch else Lane.MAIN)
            if link is None:
                out[destination] = Failed(plan.route.failure.code(written=False))
                continue
            out[destination] = pending = link.submit(sub)
            if isinstance(plan, FetchForward):
                self._inflight_fetches.record(broker, plan.keys[destination], pending, trio.current_time())
        return out

    async def reply(self, plan: Forward, handles: Handles, submitted_at: float) -> tuple[Reply | None, Handles, Answers]:
        """The client's reply (None: no error code of it can say a broker failed), the handles and answers it came from."""
        answers, handles = await self._answers(plan, handles, submitted_at)
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
                answers, handles = await self._answers(plan, handles, trio.current_time())
                reply = self._merge(plan, answers)
        if reply is not None:
            self.cluster.apply(reply.effects)
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
            # A Fetch is answered as a broker would answer it (see core.fetch.FetchWait).
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
                self._inflight_fetches.record(broker, key, link.submit(sub), now)

    def _ask_again(self, plan: FetchForward, destination: Destination) -> Pending | None:
        assert isinstance(destination, int)
        link = self.links.link(destination, Lane.FETCH)
        if link is None:
            return None
        pending = link.submit(plan.subs[destination])
        self._inflight_fetches.record(destination, plan.keys[destination], pending, trio.current_time())
        return pending

    def _merge(self, plan: Forward, answers: Answers) -> Reply | None:
        try:
            return plan.merge(plan, answers)
        except BrokerUnavailable as e:
            log.info("client %s: %s (api_key=%s v%s)", self.client, e, plan.header.api_key, plan.header.api_version)
            return None
